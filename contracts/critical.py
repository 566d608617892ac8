"""What the critical path of a step is made of, and the names of the what-if scenarios (docs/analyses.md, "Critical path").

The kinds are the strings of the ``kind`` column of the critical-path rows and the
``*_ns`` columns of the per-step summary; the scenarios those of the what-if rows.
This module imports nothing of the project's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PathKind(StrEnum):
    """What a stretch of the critical path was spent on."""

    #: A compute kernel (or XLA op) on a device.
    COMPUTE = "compute"
    #: A collective's or copy's transfer: the part of a communication op after every rank arrived.
    COMMUNICATION = "communication"
    #: A memcpy or memset on a device.
    MEMORY = "memory"
    #: Host work: an operator, an annotation, a runtime call that is neither a launch nor a sync.
    HOST = "host"
    #: Launching: the launch call on the host and the delay from it to the op's start.
    LAUNCH = "launch"
    #: Synchronisation: a blocking call's own time and its return after the device finished.
    SYNC = "sync"
    #: Nothing the trace explains: a device op that started later than its stream and its launch allowed.
    IDLE = "idle"


#: The kinds, in the order of :class:`PathKind` (the order of the summary's columns).
PATH_KINDS: tuple[PathKind, ...] = tuple(PathKind)


class Scenario(StrEnum):
    """A what-if: the graph replayed with changed durations."""

    #: The graph unchanged: reproduces the measured step.
    AS_MEASURED = "as_measured"
    #: Every communication transfer takes no time (waits for other ranks stay).
    COMMUNICATION_OVERLAPPED = "communication_overlapped"
    #: Collective bandwidth doubled: transfers take half the time.
    BANDWIDTH_X2 = "bandwidth_x2"
    #: Compute kernels twice as fast.
    COMPUTE_X2 = "compute_x2"
    #: Launch calls and launch delays take no time (as if captured in a CUDA graph).
    NO_LAUNCH_OVERHEAD = "no_launch_overhead"
    #: The slowest rank's own work (host and compute) at the median rank's speed.
    SLOWEST_RANK_AT_MEDIAN = "slowest_rank_at_median"
    #: Twice the ranks in every collective (weak scaling: the same work and messages per rank), each
    #: transfer grown by its collective's ring factor at the same bus bandwidth.
    RANKS_X2 = "ranks_x2"
    #: Every collective's transfer at the bus bandwidth nccl-tests measured for its collective and message size
    #: (the job's own nccl-tests output); longer where the job's collectives beat the benchmark.
    NCCL_TESTS_BANDWIDTH = "nccl_tests_bandwidth"


#: Scenarios that may make things take longer; every other one only shortens durations, so its
#: prediction is never longer than the measured step.
GROWING: tuple[Scenario, ...] = (Scenario.RANKS_X2, Scenario.NCCL_TESTS_BANDWIDTH)

#: Point-to-point operations (``collectives.collective``): a send and its recv, the same group, pair of ranks
#: and ``seq``, are one transfer.
P2P_OPS = ("send", "recv", "isend", "irecv")

#: Host runtime and driver calls that block the calling thread until the device has finished work
#: (a regular expression, searched without regard to case): stream, device, context and event
#: synchronisation, and copies without ``Async`` (CUDA, HIP and the driver API).
BLOCKING_CALL = (
    r"^(cuda|hip|cu)(Stream|Device|Ctx|Event)Synchronize"
    r"|^(cuda|hip)Memcpy(2D|3D|ToSymbol|FromSymbol|Peer)?(_v\d+)?$"
    r"|^cuMemcpy(DtoH|HtoD|DtoD)?(_v\d+)?$"
)

#: Host operators that hand a collective to a process group's worker thread (a regular expression): the
#: worker's event for that collective (gloo's ``gloo:all_reduce``) cannot start before the call that
#: enqueued it, the latest such call on another thread of the rank.
ENQUEUE_CALL = r"^(c10d::|record_param_comms$)"


#: The categories a :class:`Speedup` may name instead of a pattern (``tracelake.contracts.classify.Category``).
SPEEDUP_CATEGORIES = ("compute", "communication", "memory")


@dataclass(frozen=True)
class Speedup:
    """A what-if someone asks for: the device ops of a category (:data:`SPEEDUP_CATEGORIES`), or those whose
    name matches a pattern (``*`` and ``?``, any case), ``factor`` times as fast (docs/analyses.md,
    "Critical path")."""

    target: str
    factor: float

    @property
    def scenario(self) -> str:
        """The name of its rows in ``what_if``: ``<target> x<factor>``."""
        return f"{self.target} x{self.factor:g}"
