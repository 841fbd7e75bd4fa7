"""Headless Chromium driven over the DevTools protocol, for the tests that open the pages the package writes
(the attention explorer, the analysis report).

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``; ``.ci/run`` installs it).
The protocol runs over ``--remote-debugging-pipe`` (fd 3: commands in, fd 4: replies out, each message
JSON followed by a NUL byte) with the Python standard library only, so nothing is installed at test time.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

VIEWPORT = (1400, 1000)

#: JavaScript for the explorer pages: a point (viewport CSS pixels) on a box tag where another query's box is
#: on top, and that query; null when no tag has one.
CLICKABLE_OTHER_BOX = """(() => {
  for (const tag of document.querySelectorAll('#overlay .box .tag rect')) {
    const r = tag.getBoundingClientRect();
    for (let fy = 0.5; fy > 0.1; fy -= 0.3) for (let fx = 0.05; fx < 1; fx += 0.1) {
      const x = r.left + fx * r.width, y = r.top + fy * r.height;
      const hit = document.elementFromPoint(x, y), box = hit && hit.closest('.box');
      if (box && Number(box.dataset.query) !== window.detrExplorer.state.query)
        return {x: x, y: y, query: Number(box.dataset.query)};
    }
  }
  return null; })()"""


def artifacts_dir() -> Path:
    """Where the browser tests keep their screenshots: ``$DETR_TEST_ARTIFACTS``, default ``outputs/test_artifacts``
    of the repository (created)."""
    default = Path(__file__).resolve().parent.parent / "outputs" / "test_artifacts"
    artifacts = Path(os.environ.get("DETR_TEST_ARTIFACTS", default))
    artifacts.mkdir(parents=True, exist_ok=True)
    return artifacts


def find_chromium() -> str | None:
    """$CHROMIUM, else the first of chromium / chromium-browser / google-chrome on PATH."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"])
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevToolsPipe:
    """A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe``."""

    def __init__(self, binary: str, user_data_dir: Path, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        # Chromium reads commands from its fd 3 and writes replies to its fd 4.
        command_read, self._command_write = os.pipe()
        self._reply_read, reply_write = os.pipe()

        def child_fds() -> None:  # runs in the child between fork and exec
            # Copy both ends above 4 first so the two dup2 calls cannot clobber each other.
            high_command = fcntl.fcntl(command_read, fcntl.F_DUPFD, 10)
            high_reply = fcntl.fcntl(reply_write, fcntl.F_DUPFD, 10)
            os.dup2(high_command, 3)
            os.dup2(high_reply, 4)

        self.process = subprocess.Popen(
            [
                binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={user_data_dir}", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "about:blank",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=child_fds, pass_fds=(3, 4), close_fds=True,
        )
        os.close(command_read)
        os.close(reply_write)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read_replies, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.process.stderr), daemon=True).start()

    def _read_replies(self) -> None:
        buffer = b""
        with os.fdopen(self._reply_read, "rb", buffering=0) as stream:
            while chunk := stream.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self._messages.put(json.loads(message))
        self._messages.put(None)

    def _pump(self, deadline: float) -> None:
        message = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
        if message is None:
            stderr = b"".join(self._stderr).decode(errors="replace")[-3000:]
            raise RuntimeError("Chromium closed the DevTools pipe:\n" + stderr)
        if "id" in message:
            self._replies[message["id"]] = message
        else:
            self.events.append(message)

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply; raises on a protocol error."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._command_write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while self._next_id not in self._replies:
            self._pump(deadline)
        reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    def wait_for_event(self, method: str, *, session: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for event in self.events:
                if event["method"] == method and (session is None or event.get("sessionId") == session):
                    return event
            self._pump(deadline)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:  # the browser may already be gone; killing it below is enough
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._command_write)


class Page:
    """One tab of :class:`DevToolsPipe` with helpers for evaluating script and clicking."""

    def __init__(self, browser: DevToolsPipe) -> None:
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.browser.wait_for_event("Page.loadEventFired", session=self.session)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, *, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expression!r}")
            time.sleep(0.05)

    def click(self, x: float, y: float) -> None:
        """A real left click (mouse pressed and released) at viewport CSS pixels (x, y)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries of this tab so far."""
        found = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:2000])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args"))[:2000])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(json.dumps(params["entry"])[:2000])
        return found
