"""A large trace shaped like a real one: a real PyTorch profiler trace repeated with shifted times.

The project's generator writes traces of its own shape. Real captures differ: about a third of
their events are flow events (``ph`` ``s``/``f``), a tenth or more are ``[memory]`` instants when
``profile_memory=True``, and their ``args`` are wide (``Concrete Inputs``, ``Input Strides``,
Python ids). :func:`write_real_shaped` makes a trace of about ``target_bytes`` from one real
capture by writing its events again and again, each copy moved after the previous one in time,
with every id that links events (flow ids, correlation, External id, Python ids, Ev Idx, sequence
numbers, Record function id) moved past the previous copy's, and ``ProfilerStep#N`` renumbered, so
each copy is one more stretch of the same run rather than a duplicate of it. Metadata events
(``ph`` ``M``) and the top-level keys (``deviceProperties``, ``distributedInfo``...) are written
once. The default source is the H200 GPT capture in ``sample_traces/gpu_h200/train`` (real
PyTorch 2.11 output: 19% flows, 13% ``[memory]`` instants, 21% Python functions).

    python benchmarks/real_shaped.py OUT.json --size-mb 1000 [--source TRACE.json.gz]
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "sample_traces" / "gpu_h200" / "train" / "train.pt.trace.json.gz"
#: ``args`` keys whose integer values link events to each other; each copy moves them past the last.
LINK_ARGS = ("External id", "correlation", "Python id", "Python parent id", "Ev Idx",
             "Sequence number", "Record function id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _load(source: Path) -> dict[str, Any]:
    raw = gzip.open(source, "rb").read() if source.suffix == ".gz" else source.read_bytes()
    trace = msgspec.json.decode(raw)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    return trace


def _spans(events: list[dict[str, Any]]) -> tuple[float, float, dict[str, int], int, int]:
    """The time span, the largest value of each link id, of flow ids, and the step count."""
    lo, hi = float("inf"), float("-inf")
    top: dict[str, int] = {key: 0 for key in LINK_ARGS}
    flow = 0
    steps = 0
    for event in events:
        if "ts" in event:
            ts = float(event["ts"])
            lo = min(lo, ts)
            hi = max(hi, ts + float(event.get("dur") or 0))
        if event.get("ph") in ("s", "f", "t") and isinstance(event.get("id"), int):
            flow = max(flow, event["id"])
        for key, value in (event.get("args") or {}).items():
            if key in top and isinstance(value, int) and not isinstance(value, bool):
                top[key] = max(top[key], value)
        match = _STEP.match(str(event.get("name", "")))
        if match:
            steps = max(steps, int(match.group(1)) + 1)
    return lo, hi, top, flow, steps


def _copy(events: list[dict[str, Any]], shift_us: float, link: dict[str, int], flow: int,
          steps: int) -> list[dict[str, Any]]:
    out = []
    for event in events:
        event = dict(event)
        if "ts" in event:
            event["ts"] = round(float(event["ts"]) + shift_us, 3)
        if flow and event.get("ph") in ("s", "f", "t") and isinstance(event.get("id"), int):
            event["id"] += flow
        args = event.get("args")
        if args:
            moved = {}
            for key, value in args.items():
                if key in link and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    value += link[key]
                moved[key] = value
            event["args"] = moved
        match = _STEP.match(str(event.get("name", "")))
        if match and steps:
            event["name"] = f"ProfilerStep#{int(match.group(1)) + steps}"
        out.append(event)
    return out


def write_real_shaped(out: Path, target_bytes: int, source: Path = DEFAULT_SOURCE) -> dict[str, Any]:
    """Write about ``target_bytes`` of ``source`` repeated; return what was written."""
    trace = _load(source)
    events = trace.pop("traceEvents")
    # HTA reads the rank from here; a single-rank capture may lack it.
    trace.setdefault("distributedInfo", {"backend": "nccl", "rank": 0, "world_size": 1})
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    lo, hi, top, flow_top, steps = _spans(body)
    period = (hi - lo) * 1.02 + 1000.0  # a short gap between copies, as between profiler cycles
    encoder = msgspec.json.Encoder()

    def layout(event: dict[str, Any]) -> bytes:
        """One event as Kineto writes it: a few fields a line, ``ts``/``dur`` with 3 decimals."""
        first = ", ".join(f'"{k}": {encoder.encode(v).decode()}' for k, v in event.items()
                          if k not in ("ts", "dur", "args"))
        text = "  {\n    " + first
        times = [f'"{k}": {float(event[k]):.3f}' for k in ("ts", "dur") if k in event]
        if times:
            text += ",\n    " + ", ".join(times)
        if "args" in event:
            inner = ", ".join(f"{encoder.encode(k).decode()}: {encoder.encode(v).decode()}"
                              for k, v in event["args"].items())
            text += ',\n    "args": {\n      ' + inner + "\n    }"
        return (text + "\n  }").encode()

    head = encoder.encode(trace)[:-1]  # the top-level keys, without the closing brace
    copies = 0
    written = 0
    with open(out, "wb") as stream:
        stream.write(head + (b', "traceEvents": [\n' if trace else b'{"traceEvents": [\n'))
        stream.write(b",\n".join(layout(e) for e in meta))
        written = stream.tell()
        while written < target_bytes or copies == 0:
            k = copies
            link = {key: (value + 1) * k for key, value in top.items()}
            batch = _copy(body, period * k, link, (flow_top + 1) * k, steps * k)
            chunk = b",\n".join(layout(e) for e in batch)
            stream.write(b",\n" + chunk if (meta or copies) else chunk)
            written = stream.tell()
            copies += 1
        stream.write(b"\n]}\n")
        written = stream.tell()
    step_names = {e["name"] for e in body if _STEP.match(str(e.get("name", "")))}
    kinds: dict[str, int] = {"flow": 0, "memory": 0}
    for event in body:
        if event.get("ph") in ("s", "f", "t"):
            kinds["flow"] += 1
        elif event.get("name") == "[memory]":
            kinds["memory"] += 1
    return {"source": str(source), "bytes": written, "copies": copies,
            "events": len(meta) + copies * len(body), "steps": len(step_names) * copies,
            "flow_share": kinds["flow"] / len(body), "memory_share": kinds["memory"] / len(body)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size-mb", type=float, default=1000.0)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args()
    facts = write_real_shaped(args.out, int(args.size_mb * 1e6), args.source)
    print(facts)


if __name__ == "__main__":
    main()
