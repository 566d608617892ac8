"""Answers: JSON encoded with msgspec (fast; NaN/infinity become ``null``), HTML pages gzip-compressed."""

from __future__ import annotations

import gzip
from typing import Any

import msgspec
from fastapi.responses import JSONResponse, Response

_encoder = msgspec.json.Encoder(enc_hook=str, decimal_format="number")


def encode(content: Any) -> bytes:
    """``content`` as JSON bytes (datetimes ISO 8601, decimals as numbers, unknown types as strings)."""
    return _encoder.encode(content)


class FastJSONResponse(JSONResponse):
    """The API's default response class."""

    def render(self, content: Any) -> bytes:
        return encode(content)


#: A report page is about 5 MB of HTML (plotly.js is inside); gzip makes it about a third.
_GZIP_LEVEL = 5
_GZIP_MIN_BYTES = 1024


def html_page(html: str | bytes, accept_encoding: str | None) -> Response:
    """An HTML page, gzip-compressed when the client accepts it (``Accept-Encoding``)."""
    body = html.encode("utf-8") if isinstance(html, str) else html
    headers = {"Vary": "Accept-Encoding"}
    if len(body) >= _GZIP_MIN_BYTES and _accepts_gzip(accept_encoding):
        body = gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0)
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


def _accepts_gzip(accept_encoding: str | None) -> bool:
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            return params.replace(" ", "").lower() not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False
