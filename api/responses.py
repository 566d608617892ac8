"""JSON answers encoded with msgspec: fast, and NaN/infinity become ``null`` instead of breaking the JSON."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi.responses import JSONResponse

_encoder = msgspec.json.Encoder(enc_hook=str, decimal_format="number")


def encode(content: Any) -> bytes:
    """``content`` as JSON bytes (datetimes ISO 8601, decimals as numbers, unknown types as strings)."""
    return _encoder.encode(content)


class FastJSONResponse(JSONResponse):
    """The API's default response class."""

    def render(self, content: Any) -> bytes:
        return encode(content)
