"""Bottleneck analyses over warehouse tables: pure functions, no I/O.

The classification of device ops they build on is a contract every layer shares:
:mod:`tracelake.contracts.classify`.
"""

from tracelake.contracts.allocators import return_freed_memory_promptly

return_freed_memory_promptly()  # before anything loads polars (its allocator reads the setting once)
