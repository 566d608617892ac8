"""Layers run one way: this test reads every module's imports and enforces the order.

From the bottom: ``contracts`` imports nothing of tracelake; ``ingest`` and ``analysis`` stand
side by side on it and never import each other; ``warehouse`` sits on those three; ``api`` (HTTP,
CLI, reports) may import anything, and nothing but ``api`` imports it. Beside them, what runs in a
training job (``client``, and the ``torch`` and ``jax`` hooks on it) imports only ``contracts``. The imports are read with
``ast``, not by importing, so imports inside functions and under ``TYPE_CHECKING`` count too.
Tests and benchmarks are users of the package and may import any layer.
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

import pytest

from tracelake.contracts import allocators

ROOT = Path(__file__).resolve().parents[1]

#: What each layer (``tracelake.<layer>``) may import of tracelake; a layer not listed may import anything.
ALLOWED: dict[str, frozenset[str]] = {
    "contracts": frozenset({"contracts"}),
    "ingest": frozenset({"contracts", "ingest"}),
    "analysis": frozenset({"contracts", "analysis"}),
    "warehouse": frozenset({"contracts", "ingest", "analysis", "warehouse"}),
    "sample_traces": frozenset({"contracts", "ingest", "analysis", "warehouse", "sample_traces"}),
    # What runs inside a training job: the client and the profiler hooks load contracts, never the warehouse
    # (its engines cost the job memory and start-up time; tests/test_hooks.py measures the footprint).
    "client": frozenset({"contracts", "client"}),
    "torch": frozenset({"contracts", "client", "torch"}),
    "jax": frozenset({"contracts", "client", "jax"}),
}

#: ``(importing module, imported module)`` pairs that break the rules and are still to be fixed (issue #21).
#: Keep it empty; an entry here must name a real import, or the test fails so the list cannot go stale.
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def package_dirs(root: Path) -> dict[str, Path]:
    """The packages pyproject.toml maps, by dotted name, and their folders."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of the mapped packages (sub-packages included), by dotted name."""
    found: dict[str, Path] = {}
    for package, folder in packages.items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """Every tracelake module ``path`` imports, with the line, relative imports resolved against ``module``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == "tracelake":  # `from tracelake import ingest` imports tracelake.ingest
                found += [(node.lineno, f"tracelake.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == "tracelake" or name.startswith("tracelake.")]


def layer(module: str) -> str:
    """The layer a tracelake module belongs to: ``tracelake.warehouse.core`` -> ``warehouse``."""
    return module.split(".")[1] if module.count(".") else module


def violations(root: Path) -> list[str]:
    """Every import under ``root`` that the layering forbids, as a message naming both modules."""
    found = []
    for module, path in sorted(modules(package_dirs(root)).items()):
        allowed = ALLOWED.get(layer(module))
        for line, imported in imports_of(module, path):
            if (module, imported) in KNOWN_EXCEPTIONS:
                continue
            target = layer(imported)
            if target == "api" and layer(module) != "api":
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {imported}; "
                             "nothing below the API may import tracelake.api")
            elif allowed is not None and target not in allowed:
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {imported}; "
                             f"tracelake.{layer(module)} may import only {', '.join(sorted(allowed))}")
    return found


def test_layers_import_only_downwards() -> None:
    found = violations(ROOT)
    assert not found, "imports against the layering:\n" + "\n".join(found)


def test_known_exceptions_are_still_real() -> None:
    every = {(module, imported) for module, path in modules(package_dirs(ROOT)).items()
             for _, imported in imports_of(module, path)}
    stale = sorted(KNOWN_EXCEPTIONS - every)
    assert not stale, f"these exceptions no longer happen; remove them from KNOWN_EXCEPTIONS: {stale}"


def test_a_planted_violation_is_caught(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"tracelake.contracts" = "contracts"\n"tracelake.ingest" = "ingest"\n'
        '"tracelake.analysis" = "analysis"\n"tracelake.warehouse" = "warehouse"\n'
    )
    for folder in ("contracts", "ingest", "analysis", "warehouse"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "contracts" / "errors.py").write_text("def f() -> None:\n    from tracelake.warehouse import core\n")
    (tmp_path / "ingest" / "parse.py").write_text("from tracelake import analysis\nfrom ..contracts import errors\n")
    (tmp_path / "analysis" / "steps.py").write_text("from tracelake.api.app import create_app\n")
    (tmp_path / "warehouse" / "core.py").write_text("from . import store\nfrom tracelake.ingest import parse\n")
    found = violations(tmp_path)
    assert len(found) == 3, found
    text = "\n".join(found)
    assert "contracts/errors.py:2: tracelake.contracts.errors imports tracelake.warehouse;" in text
    assert "ingest/parse.py:1: tracelake.ingest.parse imports tracelake.analysis;" in text
    assert "analysis/steps.py:1: tracelake.analysis.steps imports tracelake.api.app; nothing below the API" in text


def test_the_entry_points_set_polars_allocator_before_polars_loads() -> None:
    """docs/architecture.md, "Memory": importing the facade or the faces sets jemalloc's decays and Arrow's pool
    before polars and pyarrow are loaded (each reads its setting once); a value the user set is kept."""
    import subprocess
    import sys

    code = ("import os, sys\nimport tracelake.{module}\n"
            "print(os.environ.get('_RJEM_MALLOC_CONF'), os.environ.get('ARROW_DEFAULT_MEMORY_POOL'), "
            "'polars' in sys.modules, 'pyarrow' in sys.modules)\n"
            "import pyarrow\nprint(pyarrow.default_memory_pool().backend_name)")
    variables = ("_RJEM_MALLOC_CONF", "ARROW_DEFAULT_MEMORY_POOL")
    for module in ("warehouse", "api"):
        env = {k: v for k, v in os.environ.items() if k not in variables}
        out = subprocess.run([sys.executable, "-c", code.format(module=module)], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        assert out == ["dirty_decay_ms:100,muzzy_decay_ms:0,narenas:1", "system", "False", "False", "system"], module
        env.update({"_RJEM_MALLOC_CONF": "narenas:1", "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})
        out = subprocess.run([sys.executable, "-c", code.format(module=module)], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        assert out[:2] == ["narenas:1", "mimalloc"] and out[-1] == "mimalloc", module


#: Watches the first import of polars and pyarrow in a child and notes the allocator settings at that moment.
_WATCH_FIRST_LOAD = """
import json, os, sys
seen = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("polars", "pyarrow") and name not in seen:
            seen[name] = [os.environ.get("_RJEM_MALLOC_CONF"), os.environ.get("ARROW_DEFAULT_MEMORY_POOL")]
sys.meta_path.insert(0, Watch())
import tracelake.%s
import polars, pyarrow
print(json.dumps([seen["polars"], seen["pyarrow"], pyarrow.default_memory_pool().backend_name]))
"""


@pytest.mark.parametrize("module", ["warehouse", "api", "ingest", "analysis", "ingest.xla", "analysis.breakdown"])
def test_the_library_packages_set_the_allocators_before_polars_and_pyarrow_load(module: str) -> None:
    """Whoever calls the parsers or the analyses as a library gets the same allocators as the command line: with
    Arrow's default pool (mimalloc) a 30 MB XLA file's ``parse_into`` peaked at 306-318 MB instead of 236-238."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "ARROW_DEFAULT_MEMORY_POOL")}
    out = subprocess.run([sys.executable, "-c", _WATCH_FIRST_LOAD % module], env=env, capture_output=True,
                         text=True, check=True).stdout
    polars_saw, pyarrow_saw, pool = json.loads(out)
    wanted = [allocators.POLARS_JEMALLOC_OPTIONS, allocators.ARROW_POOL]
    assert polars_saw == wanted, f"polars loaded before tracelake.{module} set its allocator: {polars_saw}"
    # (polars, once loaded, puts its own decays before the ones it found: only Arrow's variable counts here)
    assert pyarrow_saw[1] == allocators.ARROW_POOL, f"pyarrow loaded before tracelake.{module} set its pool"
    assert pool == allocators.ARROW_POOL


def test_a_client_importing_the_warehouse_is_caught(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"tracelake.client" = "client"\n"tracelake.torch" = "client/torch"\n')
    (tmp_path / "client" / "torch").mkdir(parents=True)
    (tmp_path / "client" / "__init__.py").write_text("from tracelake.contracts import errors\n")
    (tmp_path / "client" / "torch" / "__init__.py").write_text("def f() -> None:\n    import tracelake.warehouse\n")
    found = violations(tmp_path)
    assert len(found) == 1 and "tracelake.torch imports tracelake.warehouse;" in found[0], found


#: House style: a module holds one concept, and one grown past this many lines is split.
MAX_MODULE_LINES = 500


def long_modules(root: Path) -> list[str]:
    """Every Python module of the package and its tests longer than :data:`MAX_MODULE_LINES`, with its length."""
    paths = [*modules(package_dirs(root)).values(), *(root / "tests").rglob("*.py")]
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted(paths)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]


def test_modules_stay_short() -> None:
    assert long_modules(ROOT) == []


def test_a_long_module_is_caught(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"tracelake.pkg" = "pkg"\n')
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"tests/test_long.py: {MAX_MODULE_LINES + 1} lines"]
