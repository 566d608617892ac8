"""Contracts every layer shares: the table schema, the domain errors, the classification rules and statuses.

This package is the bottom layer: it imports nothing else of tracelake, so ingest, analysis,
the warehouse and the API can all depend on it without depending on each other.
"""
