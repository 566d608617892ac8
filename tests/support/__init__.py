"""What the tests share besides fixtures: paths, hand-made inputs, a real server and a real browser.

Fixtures live in ``tests/conftest.py`` (pytest finds them without an import); plain
helpers and constants live here and are imported as ``from support import ...``
(pytest puts ``tests/`` on ``sys.path``, as it does for ``tests/fuzz``).

- :mod:`support.paths`: the repository, the sample traces and ``../shared/real_traces``.
- :mod:`support.protobuf`: protobuf wire encoding for hand-made XLA messages.
- :mod:`support.tokens`: the tokens of the ``secured`` in-process server (conftest.py).
- :mod:`support.server`: a real ``tracelake serve`` (uvicorn) on a free loopback port.
- :mod:`support.chromium`: a headless Chromium over the DevTools protocol.
"""

from __future__ import annotations

from support.paths import FLEET_JOBS, REAL_KINETO, REAL_TRACES, ROOT, SAMPLES, real_kineto_files
from support.protobuf import len_field, varint

__all__ = ["FLEET_JOBS", "REAL_KINETO", "REAL_TRACES", "ROOT", "SAMPLES", "len_field", "real_kineto_files", "varint"]
