"""HTTP connection limits uvicorn lacks, for ``tracelake serve``: slow clients, unread bodies, connection floods.

uvicorn (h11) waits for a request's headers as long as the client keeps the
connection open, and after an early answer (a 413 to an oversized upload) it goes
on reading and discarding the rest of the body, however long it is. The protocol
:func:`guarded_h11_protocol` builds closes the connection instead:

* a client that has not sent a whole request head ``header_timeout`` seconds after
  it connected (or after the first byte of a later request on the same connection)
  gets a 408 and is disconnected, so slow-header clients ("slowloris") cannot hold
  connections open for ever;
* a request body that sends nothing for ``body_timeout`` seconds (and a little
  more) while the server is ready to read it gets a 408 and is disconnected: a
  request in progress is never closed to make room (below), so a stalled body must
  end somehow, even where the route has no timeout of its own (JSON bodies are read
  before the token is checked; uploads time out earlier, in :mod:`tracelake.api.uploads`);
* an answer sent before the request body was read to its end (an upload refused
  for its size, a stalled upload cut off) says ``Connection: close`` and ends the
  connection: the server stops reading, half-closes, and drops the connection after
  a short linger during which what the client still sends is discarded, so that
  the client reads the answer rather than a reset;
* at most ``max_connections`` connections are open at once: when one more arrives,
  the connection idle longest among those without a request in progress (nothing
  sent yet, part of a request head, or kept alive between requests) is closed to
  make room, and if every open connection has a request in progress the new one
  gets a 503 and is closed. A flood of idle connections thus costs the server at
  most ``max_connections`` sockets and never stands between a client and its answer.

A connection that has sent nothing has the same ``header_timeout`` as one that sent
part of a head: a shorter deadline for silent ones would be defeated by sending one
byte, and under a flood silent connections are the first closed anyway.

:func:`fit_open_files` raises the open-file limit and fits ``max_connections`` under it.
The upload body itself is guarded in :mod:`tracelake.api.uploads` (a timeout between
chunks and a deadline for the whole body); a slow client never blocks others, since
every connection is a coroutine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tracelake.warehouse import InvalidArgument

try:  # Unix: how many bytes wait unread on a socket
    import fcntl
    import termios

    _FIONREAD: int | None = termios.FIONREAD
except ImportError:
    _FIONREAD = None

log = logging.getLogger(__name__)

#: Seconds a connection lingers, discarding input, after an answer that left the body unread.
LINGER_SECONDS = 2.0
#: Open files kept free beside the connections: logs, pipes and sockets of ingest workers, DuckDB and Parquet files.
RESERVED_FILES = 256
#: uvicorn's ``limit_concurrency`` per connection allowed: requests in progress (some of them after their
#: client left) past it are answered 503.
REQUESTS_PER_CONNECTION = 2
#: Seconds past ``body_timeout`` before a silent body is cut off here: the upload routes' own, clearer 408 comes first.
BODY_GRACE_SECONDS = 2.0
#: Seconds between two looks at a body whose reading is paused (the route is not reading it: not the client's fault).
_PAUSED_POLL_SECONDS = 1.0
#: Oldest idle connections looked at to find one to close; past them the new connection is refused.
_EVICTION_LOOKS = 16
#: Seconds between two warnings that connections were closed to make room.
_WARN_EVERY_SECONDS = 60.0
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


class _Idle:
    """One server's connections without a request in progress, the one idle longest first."""

    def __init__(self) -> None:
        self.connections: OrderedDict[_GuardedH11Protocol, None] = OrderedDict()
        self.closed = 0  # to make room, since the last warning
        self.refused = 0  # new ones, every open one busy, since the last warning
        self._warned_at: float | None = None

    def victim(self) -> _GuardedH11Protocol | None:
        """The connection idle longest, taken out of the idle ones; None if there is none to close.

        One whose bytes wait unread was accepted in the same burst as many newer ones
        and has not been read yet: it has spoken, so it is passed over.
        """
        for _ in range(min(_EVICTION_LOOKS, len(self.connections))):
            oldest = next(iter(self.connections))
            if not _unread_bytes(oldest.transport):
                del self.connections[oldest]
                return oldest
            self.connections.move_to_end(oldest)
        return None

    def note(self, max_connections: int) -> None:
        """Warn when the connection limit is first reached, then at most once a minute with what it cost."""
        now = time.monotonic()
        if self._warned_at is None:
            log.warning("%d connections open, the most allowed (TRACELAKE_MAX_CONNECTIONS): closing the idle longest "
                        "to make room for new ones", max_connections)
        elif now - self._warned_at >= _WARN_EVERY_SECONDS:
            log.warning("%d connections open, the most allowed (TRACELAKE_MAX_CONNECTIONS): in the last %.0f s, "
                        "%d idle ones closed to make room and %d new ones refused (every open one busy)",
                        max_connections, now - self._warned_at, self.closed, self.refused)
        else:
            return
        self._warned_at = now
        self.closed = self.refused = 0


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines for request heads and silent bodies, no reading of abandoned
    bodies, and at most ``max_connections`` connections open."""

    header_timeout: float = 30.0
    body_timeout: float = 60.0
    max_connections: int = 1000
    idle: _Idle  # one per server: set by guarded_h11_protocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.config.h11_max_incomplete_event_size or _H11_MAX_HEAD_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0  # event loop time of the body's last bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _LingeringTransport(transport, self)))
        # self.connections is uvicorn's set of this server's open connections, this one included
        while len(self.connections) > self.max_connections:
            victim = self.idle.victim()
            if victim is None:
                self._refuse()
                return
            victim._evict()
        self._arm_head_timer()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        self.idle.connections.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # lingering after an answer, or closed to make room: what the client still sends is dropped
        super().data_received(data)
        self._watch_head()
        self._watch_body()
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._watch_head()  # a pipelined request may have begun
            self._watch_body()
        self._track()

    def _watch_body(self) -> None:
        """Note when the request body last sent something; time its silence while it is unfinished."""
        if self.conn.their_state is not h11.SEND_BODY:
            self._cancel_body_timer()
            return
        self._body_seen = self.loop.time()
        if self._body_timer is None:
            self._body_timer = self.loop.call_later(self.body_timeout + BODY_GRACE_SECONDS, self._body_check)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_check(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        now = self.loop.time()
        if self.flow.read_paused or self.conn.they_are_waiting_for_100_continue:
            # the route is not reading the body (yet): the client is not the one stalling
            self._body_seen = now
            self._body_timer = self.loop.call_later(_PAUSED_POLL_SECONDS, self._body_check)
            return
        left = self._body_seen + self.body_timeout + BODY_GRACE_SECONDS - now
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_check)
            return
        if self.conn.our_state is h11.SEND_RESPONSE:  # not answered yet; the route sees the client go away
            self._answer(408, "Request Timeout", f"the request body sent nothing for {self.body_timeout:g} s "
                         "(TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS); send the body without pausing")
        self.transport.close()

    def _track(self) -> None:
        """Keep this connection in the idle ones, most recently active last, while no request is in progress."""
        if (self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE
                and not self.transport.is_closing()):
            self.idle.connections[self] = None
            self.idle.connections.move_to_end(self)
        else:
            self.idle.connections.pop(self, None)

    def _evict(self) -> None:
        """Close this connection, which has no request in progress, to make room for a new one."""
        self.connections.discard(self)  # room now; the socket itself closes at the event loop's next turn
        self._cancel_head_timer()
        if self.conn.trailing_data[0]:  # part of a request head arrived: say why it goes unanswered
            self._answer(503, "Service Unavailable", f"the server has {self.max_connections} connections open and "
                         "closed this idle one to make room (TRACELAKE_MAX_CONNECTIONS); send the request again")
        self.transport.close()
        self.idle.closed += 1
        self.idle.note(self.max_connections)

    def _refuse(self) -> None:
        """Close this new connection: every open one has a request in progress."""
        self.connections.discard(self)
        self._answer(503, "Service Unavailable", f"the server has {self.max_connections} connections open, each with "
                     "a request in progress (TRACELAKE_MAX_CONNECTIONS); try again shortly")
        self.transport.close()
        self.idle.refused += 1
        self.idle.note(self.max_connections)

    def _answer(self, status: int, reason: str, error: str) -> None:
        """Write a JSON error answer outside h11 (no request was read), for a connection about to close."""
        body = json.dumps({"error": error, "kind": reason.replace(" ", "")}).encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (status, reason.encode(), len(body), body))

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
            self._answer(408, "Request Timeout", f"the request headers did not arrive within {self.header_timeout:g} s "
                         "(TRACELAKE_HEADER_TIMEOUT_SECONDS)")
        self.transport.close()


def _unread_bytes(transport: asyncio.BaseTransport) -> bool:
    """Whether the client's bytes wait in the kernel, not read yet (False where that cannot be known)."""
    sock = transport.get_extra_info("socket")
    if _FIONREAD is None or sock is None:
        return False
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _FIONREAD, b"\0\0\0\0"))[0] > 0
    except OSError:  # closed meanwhile
        return False


def guarded_h11_protocol(
    header_timeout: float, body_timeout: float = 60.0, max_connections: int = 1000
) -> type[asyncio.Protocol]:
    """The protocol class to give ``uvicorn.run(http=...)`` for one server.

    h11 with ``header_timeout`` for request heads, ``body_timeout`` for silent request
    bodies, no unread bodies, and at most ``max_connections`` open (the idle longest
    closed first). Build one class per server: the class keeps that server's idle connections.
    """
    attributes = {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout),
                  "max_connections": max(1, int(max_connections)), "idle": _Idle()}
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), attributes)


@dataclass(frozen=True)
class ConnectionBudget:
    """How many connections ``tracelake serve`` holds open, fitted under the open-file limit."""

    #: Connections open at once, at most: the setting, lowered to fit ``open_files``.
    max_connections: int
    #: What ``TRACELAKE_MAX_CONNECTIONS`` asked for.
    requested: int
    #: The process's open-file limit (soft ``RLIMIT_NOFILE``) after raising it; None where unknown or unlimited.
    open_files: int | None

    @property
    def limit_concurrency(self) -> int:
        """uvicorn's ``limit_concurrency``: requests in progress past it are answered 503.

        uvicorn counts open connections against it too, so it must stay above
        ``max_connections`` or a flood of idle connections would turn every request
        into a 503; what it bounds is requests still running after their client left.
        """
        return REQUESTS_PER_CONNECTION * self.max_connections

    def describe(self) -> str:
        """One line for the server's start-up output."""
        files = f"open-file limit {self.open_files:,}" if self.open_files is not None else "no open-file limit"
        if self.max_connections < self.requested:
            fitted = (f", lowered from {self.requested:,} (TRACELAKE_MAX_CONNECTIONS) to fit the {files} "
                      f"less {RESERVED_FILES} for other files")
        else:
            fitted = f" ({files})"
        return (f"connections: at most {self.max_connections:,} open{fitted}, the idle longest closed to make room; "
                f"requests in progress past {self.limit_concurrency:,} get 503")


def connections_for(requested: int, open_files: int | None) -> int:
    """``requested`` connections, lowered to leave :data:`RESERVED_FILES` of ``open_files`` for other files.

    With a small open-file limit, half of it still goes to connections.
    """
    if open_files is None:
        return requested
    return max(1, min(requested, max(open_files - RESERVED_FILES, open_files // 2)))


def fit_open_files(requested: int) -> ConnectionBudget:
    """Raise this process's soft open-file limit to its hard limit and fit ``requested`` connections under it.

    Raises:
        InvalidArgument: ``requested`` is below 1.
    """
    if requested < 1:
        raise InvalidArgument(f"TRACELAKE_MAX_CONNECTIONS={requested}: the server needs at least 1 connection")
    try:
        import resource
    except ImportError:  # not a Unix: no such limit to raise
        return ConnectionBudget(requested, requested, None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # an unlimited hard limit is refused by some systems (macOS): ask for a generous finite one then
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    open_files = None if soft == resource.RLIM_INFINITY else soft
    return ConnectionBudget(connections_for(requested, open_files), requested, open_files)


__all__ = ["ConnectionBudget", "connections_for", "fit_open_files", "guarded_h11_protocol"]
