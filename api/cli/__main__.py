"""``python -m tracelake.api.cli``: the ``tracelake`` command."""

from __future__ import annotations

from . import main

main()
