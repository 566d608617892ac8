"""What an analysis of the warehouse reads: a selection of registered traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Selection:
    """What an analysis reads: its registered ``(job, trace_id)`` pairs, and the SQL filter with its parameters."""

    traces: tuple[tuple[str, str], ...]
    where: str
    params: list[Any]
