"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): stdlib only.

The browser reads commands (JSON, each ended by a NUL byte) on its fd 3 and writes
answers and events on its fd 4. :class:`Chromium` starts it, :meth:`Chromium.open`
loads a page in a fresh tab and returns a :class:`Tab` that remembers every console
message, exception, log entry and network request of the page.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

#: What Chromium needs to run headless as root in a container, and nothing that phones home.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
    "--no-first-run", "--no-default-browser-check", "--mute-audio", "--hide-scrollbars",
    "--remote-debugging-pipe",
)

#: Moves its first two arguments (fds) to 3 and 4, by way of fds >= 100 so that neither clobbers the other.
_LAUNCHER = (
    "import fcntl, os, sys; "
    "fds = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 100) for fd in sys.argv[1:3]]; "
    "os.dup2(fds[0], 3); os.dup2(fds[1], 4); [os.close(fd) for fd in fds]; "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def find_chromium() -> str | None:
    """The Chromium executable: ``$TRACELAKE_CHROMIUM``, else ``chromium`` on the PATH, else /usr/bin/chromium."""
    for candidate in (os.environ.get("TRACELAKE_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class DevToolsError(RuntimeError):
    """The browser answered a command with an error, closed the pipe, or took too long."""


class Chromium:
    """One headless browser process (use as a context manager)."""

    def __init__(self, executable: str, profile: Path, log: Path) -> None:
        self.log_path = log
        to_browser, self._write_fd = os.pipe()
        self._read_fd, from_browser = os.pipe()
        command = [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"]
        self._log = log.open("wb")
        # A small Python launcher puts the browser's ends on fds 3 and 4, then becomes the browser.
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(to_browser), str(from_browser), *command],
            pass_fds=(to_browser, from_browser), stdout=self._log, stderr=subprocess.STDOUT,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    @classmethod
    def start(cls, executable: str, folder: Path, ready_timeout: float = 90, attempts: int = 2) -> Chromium:
        """A browser that has answered its first command.

        A cold start on a loaded machine (a fresh install, font caches, D-Bus lookups that
        time out in a container) can take tens of seconds; a browser that has not answered
        within ``ready_timeout`` is killed and started again, up to ``attempts`` times.
        """
        for attempt in range(1, attempts + 1):
            browser = cls(executable, folder / f"profile-{attempt}", folder / f"chromium-{attempt}.log")
            try:
                browser.send("Browser.getVersion", timeout=ready_timeout)
                return browser
            except DevToolsError as exc:
                browser.process.kill()  # it did not answer, so it will not answer Browser.close either
                browser.close()
                if attempt == attempts:
                    raise
                warnings.warn(f"Chromium start {attempt} of {attempts} failed, starting it again: {exc}", stacklevel=2)
        raise AssertionError("unreachable")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to quit, then make sure it has."""
        try:
            self.send("Browser.close", timeout=5)
        except (DevToolsError, OSError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for fd in (self._write_fd, self._read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        """Run one command and return its result; events that arrive meanwhile are kept in :attr:`events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._write_fd, json.dumps(message).encode() + b"\0")
        answer = self._wait(lambda m: m.get("id") == message["id"], timeout, f"no answer to {method}")
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def wait_event(self, method: str, session: str | None, timeout: float = 30) -> dict[str, Any]:
        """The first event ``method`` of ``session`` (kept or yet to come)."""
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        return self._wait(lambda m: m.get("method") == method and m.get("sessionId") == session, timeout,
                          f"no {method} event")

    def _wait(self, match: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                message = json.loads(raw)
                if "id" not in message:
                    self.events.append(message)
                if match(message):
                    return message  # type: ignore[no-any-return]
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError(f"{what} within {timeout} s; {self.log_tail()}")
            ready, _, _ = select.select([self._read_fd], [], [], left)
            if ready:
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    raise DevToolsError(f"the browser closed the pipe ({what}); exit code {self.process.poll()}; "
                                        f"{self.log_tail()}")
                self._buffer += chunk

    def log_tail(self, lines: int = 15) -> str:
        """The end of the browser's own log, for error messages."""
        if not self._log.closed:
            self._log.flush()
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"no browser log ({exc})"
        return "browser log ends:\n" + "\n".join(tail)

    def open(self, url: str, width: int = 1280, height: int = 900, timeout: float = 60) -> Tab:
        """Load ``url`` in a new tab and wait for its load event."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session, timeout)
        return Tab(self, session, width)


class Tab:
    """One page in the browser, and what it reported."""

    def __init__(self, browser: Chromium, session: str, width: int) -> None:
        self.browser = browser
        self.session = session
        self.width = width

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression in the page (JSON-able; promises awaited)."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, session=self.session, timeout=timeout)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def _events(self, method: str) -> list[dict[str, Any]]:
        return [e["params"] for e in self.browser.events if e.get("sessionId") == self.session
                and e.get("method") == method]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads, CSP violations) of the page."""
        found = [f"exception: {e['exceptionDetails'].get('exception', {}).get('description') or e['exceptionDetails']}"
                 for e in self._events("Runtime.exceptionThrown")]
        found += [f"console.{e['type']}: {[a.get('value', a.get('description')) for a in e.get('args', [])]}"
                  for e in self._events("Runtime.consoleAPICalled") if e["type"] in ("error", "assert")]
        found += [f"log: {e['entry'].get('text')} ({e['entry'].get('url', '')})"
                  for e in self._events("Log.entryAdded") if e["entry"].get("level") == "error"]
        return found

    def requests(self) -> list[str]:
        """The URLs the page asked for, in order."""
        return [e["request"]["url"] for e in self._events("Network.requestWillBeSent")]

    def screenshot(self, path: Path, max_height: int = 16_000) -> Path:
        """A PNG of the whole page (up to ``max_height`` pixels)."""
        metrics = self.browser.send("Page.getLayoutMetrics", session=self.session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        height = int(min(max(size["height"], 1), max_height))
        self.browser.send("Emulation.setDeviceMetricsOverride",
                          {"width": self.width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                          session=self.session)
        shot = self.browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                 session=self.session, timeout=60)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
