"""What the tests share besides fixtures: paths, hand-made inputs, a real server and a real browser.

Fixtures live in ``tests/conftest.py`` (pytest finds them without an import); plain
helpers and constants live here and are imported as ``from support import ...``
(pytest puts ``tests/`` on ``sys.path``, as it does for ``tests/fuzz``).

- :mod:`support.paths`: the repository, the sample traces (the XLA TPU one too) and ``../shared/real_traces``.
- :mod:`support.protobuf`: protobuf wire encoding for hand-made XLA messages.
- :mod:`support.tokens`: the tokens of the ``secured`` in-process server (conftest.py).
- :mod:`support.server`: a real ``tracelake serve`` (uvicorn) on a free loopback port.
- :mod:`support.hostile`: the answers and hand-made bodies of the hostile-input API tests.
- :mod:`support.archives`: zips, tars, gzip'd zeros and zip bombs made by hand for the archive tests.
- :mod:`support.chromium`: a headless Chromium over the DevTools protocol.
"""

from __future__ import annotations

from support.paths import (FLEET_JOBS, REAL_KINETO, REAL_TRACES, REAL_XLA, ROOT, SAMPLES, TPU_SAMPLE, real_kineto_files,
                           real_xplanes)
from support.protobuf import len_field, varint

__all__ = ["FLEET_JOBS", "REAL_KINETO", "REAL_TRACES", "REAL_XLA", "ROOT", "SAMPLES", "TPU_SAMPLE", "len_field",
           "real_kineto_files", "real_xplanes", "varint"]
