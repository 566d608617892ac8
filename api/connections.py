"""HTTP connection limits uvicorn lacks, for ``tracelake serve``: slow clients and unread bodies.

uvicorn (h11) waits for a request's headers as long as the client keeps the
connection open, and after an early answer (a 413 to an oversized upload) it goes
on reading and discarding the rest of the body, however long it is. The protocol
:func:`guarded_h11_protocol` builds closes the connection instead:

* a client that has not sent a whole request head ``header_timeout`` seconds after
  it connected (or after the first byte of a later request on the same connection)
  gets a 408 and is disconnected, so slow-header clients ("slowloris") cannot hold
  connections open for ever;
* an answer sent before the request body was read to its end (an upload refused
  for its size, a stalled upload cut off) says ``Connection: close`` and ends the
  connection: the server stops reading, half-closes, and drops the connection after
  a short linger during which what the client still sends is discarded, so that
  the client reads the answer rather than a reset.

The upload body itself is guarded in :mod:`tracelake.api.uploads` (a timeout between
chunks); a slow client never blocks others, since every connection is a coroutine.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection lingers, discarding input, after an answer that left the body unread.
LINGER_SECONDS = 2.0
#: h11's own default bound on a request head still incomplete.
_H11_MAX_HEAD_BYTES = 16 << 10


class _Connection(h11.Connection):
    """An h11 server connection whose answers to requests with an unread body close the connection."""

    abandoned_body = False

    def send(self, event: h11.Event) -> bytes | None:  # type: ignore[override]
        if isinstance(event, h11.Response) and self.their_state is h11.SEND_BODY:
            # The rest of the body will not be read: the client must not reuse this connection.
            self.abandoned_body = True
            if (b"connection", b"close") not in list(event.headers):
                event = h11.Response(status_code=event.status_code, reason=event.reason,
                                     headers=[*event.headers, (b"connection", b"close")])
        return super().send(event)


class _LingeringTransport:
    """The connection's transport, whose ``close`` lingers when the client may still be sending a body."""

    def __init__(self, transport: asyncio.Transport, protocol: _GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.is_closing():
            return
        conn = self._protocol.conn
        if not (isinstance(conn, _Connection) and conn.abandoned_body and self._transport.can_write_eof()):
            self._transport.close()
            return
        try:
            self._transport.write_eof()  # the answer goes out, then FIN; what arrives meanwhile is dropped
        except OSError:  # the client is gone already
            self._transport.close()
            return
        self.lingering = True
        self._transport.resume_reading()
        self._protocol.loop.call_later(LINGER_SECONDS, self._transport.close)


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for the request head and no reading of abandoned bodies."""

    header_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.config.h11_max_incomplete_event_size or _H11_MAX_HEAD_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _LingeringTransport(transport, self)))
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if isinstance(self.transport, _LingeringTransport) and self.transport.lingering:
            return  # the answer is out; what the client still sends is dropped unread
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._watch_head()  # a pipelined request may have begun

    def _watch_head(self) -> None:
        """Time a request head from its first byte until it is whole.

        An idle kept-alive connection is left to uvicorn's keep-alive timeout, so a
        client reusing one never races this timer.
        """
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # a whole request head arrived
        elif self._head_timer is None and self.conn.trailing_data[0]:
            self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is h11.IDLE and self.conn.trailing_data[0]:
            # Part of a request arrived (a connection that sent nothing is just closed).
            body = json.dumps({"error": f"the request headers did not arrive within {self.header_timeout:g} s "
                                        "(TRACELAKE_HEADER_TIMEOUT_SECONDS)", "kind": "RequestTimeout"}).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()


def guarded_h11_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """The protocol class to give ``uvicorn.run(http=...)``: h11 with ``header_timeout`` and no unread bodies."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"header_timeout": float(header_timeout)})


__all__ = ["guarded_h11_protocol"]
