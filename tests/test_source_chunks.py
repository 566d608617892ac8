"""Reading a trace file in chunks (``ingest.source.iter_chunks``): every byte once, in order, counted for progress.

Plain files are read from the file object itself (no copy through ``io.RawIOBase.read``); gzip files through ISA-L.
Both must give the file's content exactly and report every byte of the file as read: the progress bars and the
late content id (``warehouse.staging``) count on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.archives import plain_or_gzip
from tracelake.ingest.source import iter_chunks



@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@settings(max_examples=40, deadline=None)
@given(size=st.integers(min_value=1, max_value=300_000), chunk=st.integers(min_value=1, max_value=70_000))
def test_chunks_give_the_content_and_count_every_byte_of_the_file(
    tmp_path_factory: pytest.TempPathFactory, compressed: bool, size: int, chunk: int
) -> None:
    content = os.urandom(size // 2) + b"x" * (size - size // 2)  # a part that compresses, a part that does not
    path = plain_or_gzip(tmp_path_factory.mktemp("chunks") / "trace.json", content, compressed)
    counted: list[int] = []
    chunks = list(iter_chunks(path, chunk_bytes=chunk, on_bytes=counted.append))
    assert b"".join(chunks) == content
    assert sum(counted) == path.stat().st_size  # the file's bytes (compressed ones for gzip), each once
    assert all(n > 0 for n in counted)
    if not compressed:  # a plain file comes in chunks of the size asked for, the last one shorter
        assert [len(c) for c in chunks[:-1]] == [chunk] * (len(chunks) - 1)
        assert 0 < len(chunks[-1]) <= chunk
        assert counted == [len(c) for c in chunks]  # counted as each chunk is read, not before
