"""Coverage-guided fuzzing of one parser with atheris (libFuzzer for Python).

Usage::

    python tests/fuzz/fuzz_parsers.py <format> [libFuzzer options] [corpus folder ...]
    python tests/fuzz/fuzz_parsers.py --list

``<format>`` is a parser's format name (``--list`` prints them). Without a corpus
folder the harness seeds a temporary one from ``sample_traces/`` and the kept
regressions; name a folder to keep what the fuzzer learns between runs. A crash
(any exception other than the project's own ``TracelakeError`` naming the file)
stops the run and libFuzzer writes the input to ``crash-<sha1>`` (see
``-artifact_prefix=``); keep it under ``tests/fuzz/regressions/<format>/`` once fixed.
See README.md for longer runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, so that `fuzz` imports

with atheris.instrument_imports(include=["tracelake.ingest"]):
    from fuzz import targets  # noqa: E402 - imports tracelake.ingest, so it is instrumented


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "--list") or argv[1] not in targets.TARGETS:
        print(__doc__.split("``<format>``")[0].strip())
        print("\nformats: " + ", ".join(targets.TARGETS))
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help", "--list") else 2
    target = targets.TARGETS[argv[1]]
    options = argv[2:]
    workdir = targets.scratch()
    if not any(not o.startswith("-") for o in options):  # no corpus folder named: seed a temporary one
        corpus = workdir / "corpus"
        targets.write_corpus(target, corpus)
        options.append(str(corpus))

    def one_input(data: bytes) -> None:
        targets.run_input(target, data, workdir)

    atheris.Setup([argv[0], *options], one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
