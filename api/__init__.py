"""Adapters over the library facade: the ``tracelake`` command line (and, later, the REST API)."""
