"""The repository layout and the packaging map: every code folder ships as tracelake.<folder>."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from support import ROOT

CODE_FOLDERS = ("contracts", "ingest", "warehouse", "analysis", "api")


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_design_card_layout_exists() -> None:
    for name in ("pyproject.toml", "README.md", *CODE_FOLDERS, "tests", "sample_traces"):
        assert (ROOT / name).exists(), name


def test_every_package_folder_is_mapped() -> None:
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    packages = set(_pyproject()["tool"]["setuptools"]["packages"])
    folders = {p.parent for p in ROOT.glob("*/__init__.py")} - {ROOT / "tests"}
    assert folders, "no package folders found"
    for folder in folders:
        name = f"tracelake.{folder.name}"
        assert mapping.get(name) == folder.name, f"{folder.name}/ is not mapped to {name} in pyproject.toml"
        assert name in packages, f"{name} is missing from [tool.setuptools] packages"
    # No sub-package folders left out either: each ships as tracelake.<folder>.<sub>, or under the name
    # package-dir maps it to (client/torch is tracelake.torch: `import tracelake.torch`).
    by_folder = {folder: name for name, folder in mapping.items()}
    for init in ROOT.glob("*/*/__init__.py"):
        if init.parent.parent == ROOT / "tests":  # helpers of the tests (tests/fuzz), not shipped
            continue
        sub = by_folder.get(init.parent.relative_to(ROOT).as_posix(),
                            f"tracelake.{init.parent.parent.name}.{init.parent.name}")
        assert sub in packages, f"{sub} is missing from [tool.setuptools] packages"


def test_code_folders_import_from_this_repository() -> None:
    for folder in CODE_FOLDERS:
        module = importlib.import_module(f"tracelake.{folder}")
        assert module.__file__ is not None
        assert Path(module.__file__).resolve().parent == (ROOT / folder).resolve()
        assert (ROOT / folder / "py.typed").exists(), f"{folder}/py.typed missing"


def test_no_generic_top_level_modules_are_installed() -> None:
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert all(name.startswith("tracelake.") for name in mapping), mapping
    assert "" not in mapping


def test_console_script_points_at_the_cli() -> None:
    target = _pyproject()["project"]["scripts"]["tracelake"]
    module_name, _, attr = target.partition(":")
    assert callable(getattr(importlib.import_module(module_name), attr))


def test_code_cites_the_projects_own_docs() -> None:
    """Every doc the code and its docs cite ships with the project: ``docs/<name>.md`` exists, nothing outside it."""
    import re

    texts = [p for folder in (*CODE_FOLDERS, "tests", "docs", "benchmarks", "sample_traces", ".ci")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".c", "") and p.is_file()
             and "__pycache__" not in p.parts and not any(part.startswith(".venv") for part in p.parts)]
    texts.append(ROOT / "README.md")
    # Upper-case note names are allowed only where the project ships a file of that name (an allow-list:
    # the notes kept beside the repository are not something users have).
    shipped = {p.name for p in ROOT.rglob("*.md") if not any(part.startswith(".venv") for part in p.parts)}
    outside = re.compile(r"\b[A-Z][A-Z-]+\.md\b")
    for path in texts:
        text = path.read_text(errors="replace")
        found = {m for m in outside.findall(text) if m not in shipped}
        assert not found, f"{path.relative_to(ROOT)} cites {sorted(found)}: cite the project's docs/ instead"
        for cited in re.findall(r"docs/([a-z0-9_-]+\.md)", text):
            assert (ROOT / "docs" / cited).exists(), f"{path.relative_to(ROOT)} cites docs/{cited}, which is missing"
