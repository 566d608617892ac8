"""Which files a folder given to ``tracelake ingest`` or ``tracelake push`` contributes (names only, no I/O).

Declared once here for the warehouse (``warehouse/inputs.py``) and the client (``client/files.py``),
which must pick the same files without importing the warehouse.
"""

from __future__ import annotations

import re

#: File name endings always taken from a directory (files named explicitly are always tried, whatever their name).
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz", ".xplane.pb", ".xplane.pb.gz")
#: Text outputs (nccl-tests, NCCL logs), pickles (Flight Recorder dumps, allocator snapshots) and the memory
#: timeline's ``.raw.gz``: taken from a directory only when their content is recognised.
RECOGNISED_SUFFIXES = (".txt", ".log", ".out", ".pickle", ".pickle.gz", ".pkl", ".pkl.gz", ".raw.gz")
#: The JSON renderings XProf writes beside an ``.xplane.pb``: skipped in a directory that has the XSpace.
XLA_RENDERING = re.compile(r"^(?P<host>.+)\.trace\.json(\.gz)?$|^perfetto_trace\.json(\.gz)?$")
