"""Modules loaded on first use (``contracts/lazy.py``; docs/architecture.md, "Memory").

DuckDB likewise: an existing warehouse opens without it, a new one has a child process write its catalog, and every
format but Kineto's (parsed in DuckDB SQL) is parsed and ingested without it; a query loads it.

An ingest's peak is in its parse; polars and the analyses come in only for the stored analyses after it. These
tests check the claim where it matters, in fresh child processes: the CLI and the facade load without polars, every
format but the NCCL debug log (whose parser is written in polars) parses without it, and a whole ingest through the
CLI parses without it and then computes its stored analyses with it. The probe is ``sys.modules`` itself, and the
NCCL log's parse shows that it sees polars come in.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from support import REAL_XLA, ROOT
from tracelake.contracts.lazy import LazyModule, lazy_module
from tracelake.warehouse import Warehouse

SAMPLES = ROOT / "sample_traces"
#: One input per format (the xla_json one only where ../shared/real_traces is present; execution traces are
#: written by the test).
INPUTS = {
    "pytorch_profiler": SAMPLES / "kineto" / "launch_bound" / "rank-0.json.gz",
    "xla": SAMPLES / "xla" / "tpu_allreduce" / "host0.xplane.pb",
    "xla_json": REAL_XLA / "jax_cpu_4dev" / "vm.trace.json.gz",
    "job_lifecycle": SAMPLES / "lifecycle" / "ddp.lifecycle.json",
    "nccl_tests": SAMPLES / "nccl" / "nccl_tests" / "all_reduce_perf.txt",
    "nccl_inspector": SAMPLES / "nccl" / "inspector" / "node-a-pid4100.log",
    "nccl_profiler": SAMPLES / "nccl" / "profiler_plugin" / "nccl_profile_4242424242_0.json",
    "allocator_snapshot": SAMPLES / "gpu_h200" / "leak" / "leak_snapshot.pickle.gz",
    "flight_recorder": SAMPLES / "nccl" / "flight_recorder" / "nccl_trace_rank_0.json",
    "memory_timeline": SAMPLES / "gpu_h200" / "train" / "memory_timeline.raw.json.gz",
    "nccl_log": SAMPLES / "nccl" / "debug_log" / "train-4ranks.log",
}
#: The one format whose parser needs polars.
NEEDS_POLARS = "nccl_log"
#: The one format whose parser needs DuckDB.
NEEDS_DUCKDB = "pytorch_profiler"

_PARSE_CHILD = """
import json, sys, tempfile
from pathlib import Path
import tracelake.api.cli  # what `tracelake ingest` loads
from tracelake.warehouse import Warehouse
from tracelake import ingest
watched, home, paths = sys.argv[1], sys.argv[2], sys.argv[3:]  # home "": a new warehouse
Warehouse(home=home or tempfile.mkdtemp())
seen = {"after imports": watched in sys.modules}
for path in paths:
    fmt, _ = ingest.parse_into(Path(path), Path(tempfile.mkdtemp()), ingest.ParseOptions(source_name=Path(path).name,
                                                                                         trace_id="0" * 20))
    seen[fmt.name] = watched in sys.modules
print(json.dumps(seen))
"""

_INGEST_CHILD = """
import json, sys, tempfile
from typer.testing import CliRunner
import tracelake.api.cli as cli
from tracelake import ingest
from tracelake.warehouse import Warehouse
loaded_after_parse = []
parse_into = ingest.parse_into
def watched(*args, **kwargs):  # the warehouse calls ingest.parse_into, then the stored analyses
    done = parse_into(*args, **kwargs)
    loaded_after_parse.append("polars" in sys.modules)
    return done
ingest.parse_into = watched
home = tempfile.mkdtemp()
result = CliRunner().invoke(cli.app, ["ingest", sys.argv[1], "--home", home])
rows = Warehouse(home=home).query("SELECT (SELECT count(*) FROM traces), (SELECT count(*) FROM breakdown)").rows[0]
print(json.dumps({"exit": result.exit_code, "output": result.output[-2000:], "after_parse": loaded_after_parse,
                  "at_end": "polars" in sys.modules, "traces": rows[0], "breakdown_rows": rows[1],
                  "analyses": sorted(m for m in sys.modules if m.startswith("tracelake.analysis."))}))
"""

_DUCKDB_INGEST_CHILD = """
import json, sys
from typer.testing import CliRunner
import tracelake.api.cli as cli
from tracelake.warehouse import Warehouse
home, trace = sys.argv[1:3]
result = CliRunner().invoke(cli.app, ["ingest", trace, "--home", home])
after_ingest = {name: name in sys.modules for name in ("duckdb", "pyarrow.dataset")}
rows = Warehouse(home=home).query("SELECT (SELECT count(*) FROM traces), (SELECT count(*) FROM breakdown)").rows[0]
print(json.dumps({"exit": result.exit_code, "output": result.output[-2000:], "after_ingest": after_ingest,
                  "after_query": "duckdb" in sys.modules, "traces": rows[0], "breakdown_rows": rows[1]}))
"""


def _child(code: str, *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _execution_trace(folder: Path) -> Path:
    """A small Chakra execution trace: the process and thread nodes and one operator."""
    def node(node_id: int, name: str, parent: int) -> dict[str, object]:
        return {"id": node_id, "name": name, "ctrl_deps": parent, "inputs": {"values": [], "shapes": [], "types": []},
                "outputs": {"values": [], "shapes": [], "types": []}, "attrs": [{"name": "rf_id", "type": "uint64",
                                                                                 "value": node_id}]}
    doc = {"schema": "1.0.2-chakra.0.0.4", "pid": 7, "time": "2026-12-04 10:00:00", "start_ts": 1, "finish_ts": 2,
           "nodes": [node(1, "[pytorch|profiler|execution_trace|process]", 1),
                     node(2, "[pytorch|profiler|execution_trace|thread]", 1), node(3, "aten::add", 2)]}
    path = folder / "rank0_et.json"
    path.write_text(json.dumps(doc))
    return path


def test_every_format_but_the_nccl_log_parses_without_polars(tmp_path: Path) -> None:
    inputs = {name: path for name, path in INPUTS.items() if path.is_file()}  # xla_json: with the real traces only
    inputs["execution_trace"] = _execution_trace(tmp_path)
    ordered = [path for name, path in inputs.items() if name != NEEDS_POLARS] + [inputs[NEEDS_POLARS]]
    seen = _child(_PARSE_CHILD, "polars", "", *map(str, ordered))
    assert seen.pop("after imports") is False, "importing the CLI and the facade loaded polars"
    assert set(seen) == set(inputs), f"the inputs were detected as {sorted(seen)}, not {sorted(inputs)}"
    assert {name for name, loaded in seen.items() if loaded} == {NEEDS_POLARS}, seen


@pytest.mark.parametrize("name", ["pytorch_profiler", "xla", "nccl_tests"])
def test_an_ingest_parses_without_polars_then_stores_its_analyses_with_it(name: str) -> None:
    done = _child(_INGEST_CHILD, str(INPUTS[name]))
    assert done["exit"] == 0, done["output"]
    assert done["after_parse"] == [False], "polars was loaded before the parse ended"
    assert done["traces"] == 1
    if name != "nccl_tests":  # nccl-tests output has no device time, hence no breakdown
        assert done["at_end"] is True and int(str(done["breakdown_rows"])) > 0
    # the repeated-rank warning needs the runs alone: the whole analysis (60-90 ms to load) waits for an analysis
    assert not {"tracelake.analysis.assemble", "tracelake.analysis.critical_path"} & set(done["analyses"]), done


def test_an_existing_warehouse_opens_and_every_format_but_kineto_parses_without_duckdb(tmp_path: Path) -> None:
    home = tmp_path / "warehouse"
    Warehouse(home=home)  # writes the catalog (with DuckDB), in this process: the child finds it current
    inputs = {name: path for name, path in INPUTS.items() if path.is_file()}
    inputs["execution_trace"] = _execution_trace(tmp_path)
    ordered = [path for name, path in inputs.items() if name != NEEDS_DUCKDB] + [inputs[NEEDS_DUCKDB]]
    seen = _child(_PARSE_CHILD, "duckdb", str(home), *map(str, ordered))
    assert seen.pop("after imports") is False, "importing the CLI and opening a warehouse loaded DuckDB"
    assert set(seen) == set(inputs), f"the inputs were detected as {sorted(seen)}, not {sorted(inputs)}"
    assert {name for name, loaded in seen.items() if loaded} == {NEEDS_DUCKDB}, seen


@pytest.mark.parametrize("warehouse", ["existing", "new"])
@pytest.mark.parametrize("name", ["xla", "nccl_tests"])
def test_an_xla_or_nccl_ingest_loads_duckdb_only_for_the_query_after(tmp_path: Path, name: str, warehouse: str) -> None:
    """Into a new warehouse too: its catalog is written by a child process (warehouse/catalog.py). Nor do they load
    Arrow's datasets (15 MB)."""
    home = tmp_path / "warehouse"
    if warehouse == "existing":
        Warehouse(home=home)
    done = _child(_DUCKDB_INGEST_CHILD, str(home), str(INPUTS[name]))
    assert done["exit"] == 0, done["output"]
    assert done["after_ingest"] == {"duckdb": False, "pyarrow.dataset": False}, done["after_ingest"]
    assert done["after_query"] is True and done["traces"] == 1, done
    if name == "xla":
        assert int(str(done["breakdown_rows"])) > 0, done
    con = duckdb.connect(str(home / "tracelake.duckdb"), read_only=True)  # the catalog the shell opens
    assert con.execute("SELECT count(*) FROM traces").fetchone() == (1,)
    con.close()


def test_a_lazy_module_imports_on_first_use_and_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tl_lazy_probe.py").write_text("import time\nLOADS = []\nLOADS.append(1)\ntime.sleep(0.05)\n"
                                               "VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tl_lazy_probe", raising=False)
    probe = lazy_module("tl_lazy_probe")
    assert isinstance(probe, LazyModule) and "tl_lazy_probe" not in sys.modules
    assert "not loaded yet" in repr(probe)
    values: list[int] = []
    threads = [threading.Thread(target=lambda: values.append(probe.VALUE)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert values == [42] * 4
    assert sys.modules["tl_lazy_probe"].LOADS == [1], "the module ran more than once"
    assert probe.LOADS is sys.modules["tl_lazy_probe"].LOADS and "loaded" in repr(probe)
    with pytest.raises(AttributeError):
        probe.MISSING  # noqa: B018 - the module's own error for a name it lacks
