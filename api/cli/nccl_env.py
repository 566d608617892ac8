"""``tracelake nccl-env``: the environment for a run that leaves per-rank NCCL logs for ``tracelake push``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from .root import app

#: NCCL's debug subsystems whose lines tracelake reads (docs/formats.md, "Debug log").
SUBSYSTEMS = "INIT,COLL,NET,GRAPH,ENV,TUNING"
#: Collectives each rank's Flight Recorder keeps (PyTorch's default is 2000 since 2.5, 0 before).
TRACE_BUFFER = 2000


def nccl_env_lines(folder: Path) -> list[str]:
    """The shell lines ``tracelake nccl-env`` prints for logs written into ``folder`` (an absolute path)."""
    d = shlex.quote(str(folder))
    return [
        f"# Per-rank NCCL logs in {folder}; after the run: tracelake push {d} --job JOB",
        f"mkdir -p {d}",
        "export NCCL_DEBUG=INFO",
        f"export NCCL_DEBUG_SUBSYS={SUBSYSTEMS}",
        f"export NCCL_DEBUG_FILE={shlex.quote(str(folder / 'nccl.%h.%p.log'))}  # one file per host and process",
        "# PyTorch's Flight Recorder: each rank dumps its last collectives on a watchdog timeout",
        f"export TORCH_NCCL_TRACE_BUFFER_SIZE={TRACE_BUFFER}",
        "export TORCH_NCCL_DUMP_ON_TIMEOUT=1",
        f"export TORCH_NCCL_DEBUG_INFO_TEMP_FILE={shlex.quote(str(folder / 'nccl_trace_rank_'))}  # the rank is appended",
        "# NCCL Inspector plugin (NCCL 2.28 and later; built from NCCL's ext-profiler/inspector): uncomment and set",
        "# the library's path to record every collective's time and bandwidth, per communicator",
        "# export NCCL_PROFILER_PLUGIN=/path/to/libnccl-profiler-inspector.so",
        "# export NCCL_INSPECTOR_ENABLE=1",
        "# export NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=500",
        f"# export NCCL_INSPECTOR_DUMP_DIR={d}",
    ]


@app.command("nccl-env")
def nccl_env(
    folder: Annotated[Path, typer.Option("--dir", "-d", help="Folder the ranks write their logs into (created by the "
                                         "printed lines).")] = Path("nccl-logs"),
) -> None:
    """Print the environment for a run that leaves per-rank NCCL logs, for `tracelake push DIR`.

    `eval "$(tracelake nccl-env --dir /scratch/run-42/nccl)"` before the launcher (torchrun,
    srun, mpirun): NCCL's debug log per host and process, PyTorch's Flight Recorder dumps on a
    timeout and, commented out, the NCCL Inspector plugin's settings. After the run,
    `tracelake push DIR --job JOB` uploads the folder (files that hold no trace are left out).
    """
    sys.stdout.write("\n".join(nccl_env_lines(folder.expanduser().absolute())) + "\n")
