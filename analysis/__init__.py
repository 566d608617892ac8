"""Bottleneck analyses over warehouse tables: pure functions, no I/O.

The classification of device ops they build on is a contract every layer shares:
:mod:`tracelake.contracts.classify`.
"""
