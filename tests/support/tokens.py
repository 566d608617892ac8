"""The bearer tokens of the ``secured`` test server (a writer, a reader and an admin)."""

from __future__ import annotations

WRITER = "writer-token-0001"
READER = "reader-token-0001"
ADMIN = "admin-token-00001"
#: ``TRACELAKE_TOKENS`` for those three.
TOKENS = f"{WRITER}:read,write;{READER}:read;{ADMIN}:admin"
