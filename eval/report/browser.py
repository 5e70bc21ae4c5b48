"""Headless Chromium (Debian's ``chromium`` package) for the report page, driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in a NUL byte, the browser
reading commands on its fd 3 and answering on fd 4): one browser start serves many page loads, DOM
reads and screenshots. Each browser gets a fresh profile and its own network services off; the page
itself fetches nothing.

    with Chromium() as browser:
        browser.open("file:///.../report.html?correct=0")
        count = browser.evaluate("document.getElementById('count').dataset.matching")
        browser.screenshot("report.png", 1280, 1800)
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import write_file

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    """Chromium is missing, failed or did not answer (the message says which)."""


def chromium() -> str:
    """The Chromium executable (BrowserError when none is installed)."""
    for found in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")):
        if found:
            return found
    raise BrowserError("no chromium on PATH: apt-get install -y chromium (make test does it when missing)")


class Chromium:
    """One headless browser with one page (a context manager; see the module docstring)."""

    def __init__(self, timeout: float = 60) -> None:
        self.timeout = timeout
        self._ids = itertools.count(1)  # the protocol's message ids
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._profile = tempfile.mkdtemp(prefix="rpg-chromium-")
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()

        def fds_3_and_4() -> None:  # in the child, before exec: the protocol's two pipe ends
            # copied above 10 first: a pipe end may itself be fd 3 or 4 (dup2 onto itself would keep it
            # close-on-exec, and the first dup2 could overwrite the other end)
            r, w = fcntl.fcntl(commands_r, fcntl.F_DUPFD, 10), fcntl.fcntl(answers_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self._proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds_3_and_4,
            close_fds=False,  # fds 3 and 4 must survive; the parent's own are close-on-exec anyway
        )
        os.close(commands_r)
        os.close(answers_w)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the browser and remove its profile."""
        try:
            if self._proc.poll() is None:
                self._send({"id": next(self._ids), "method": "Browser.close"})
                self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        finally:
            for fd in (self._commands, self._answers):
                with contextlib.suppress(OSError):
                    os.close(fd)
            shutil.rmtree(self._profile, ignore_errors=True)

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._commands, json.dumps(message).encode() + b"\0")

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                raise BrowserError(f"chromium did not answer within {self.timeout:g} s")
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                raise BrowserError(f"chromium ended (exit status {self._proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: bool = False
    ) -> dict[str, Any]:
        """Send one protocol command and return its result (events that arrive meanwhile are kept)."""
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._send(message)
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == message["id"]:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result", {})
            self._events.append(answer)

    def open(self, url: str) -> None:
        """Load ``url`` in the page and wait until it has loaded (its scripts have run)."""
        self._events = [e for e in self._events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._events.append(self._receive(deadline))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, png: str | Path, width: int = 1280, height: int = 1800) -> Path:
        """A PNG of the page's first ``width`` x ``height`` CSS pixels."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session=True)
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        png = Path(png)
        write_file(png, base64.b64decode(data), "screenshot")  # a link, FIFO or device there: refused
        return png
