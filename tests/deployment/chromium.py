"""Headless Chromium for the page's browser test, driven over its DevTools pipe.

Chromium started with ``--remote-debugging-pipe`` reads DevTools protocol commands
(JSON, each ended by a NUL byte) on its file descriptor 3 and answers on 4, so the
test needs no debugging port and no driver package: the standard library speaks it.
:class:`Chromium` opens one page and evaluates JavaScript in it; every wait has a
deadline. The browser is Debian's (``apt-get install chromium``), found as
``$FEDCORE_CHROMIUM`` or ``chromium`` on the ``PATH``; :func:`find_chromium` says
where, or why not.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from fedcore.testing.waiting import wait_until

CHROMIUM_ENV = "FEDCORE_CHROMIUM"
DEADLINE = 30.0
"""Seconds any one DevTools command may take."""
PAGE_TEXT = "document.body ? document.body.innerText : ''"
"""What the page says, shown when it does not get where a test waits for it to."""


def find_chromium() -> str | None:
    """The Chromium to drive: ``$FEDCORE_CHROMIUM``, else ``chromium`` on the PATH."""
    return os.environ.get(CHROMIUM_ENV) or shutil.which("chromium")


class Chromium:
    """A headless Chromium with one page; use it as a context manager."""

    def __init__(self, executable: str, profile: Path) -> None:
        self._executable = executable
        self._profile = profile
        self._next_id = 0
        self._buffer = b""
        self._process: subprocess.Popen[bytes] | None = None
        self._session = ""

    def __enter__(self) -> Self:
        commands_in, self._commands = os.pipe()  # we write, Chromium reads on fd 3
        self._answers, answers_out = os.pipe()  # Chromium writes on fd 4, we read

        def onto_3_and_4() -> None:
            # Out of the way first, so that neither end lands on the other's number.
            high_in = fcntl.fcntl(commands_in, fcntl.F_DUPFD, 10)
            high_out = fcntl.fcntl(answers_out, fcntl.F_DUPFD, 10)
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        with (self._profile.parent / "chromium.log").open("wb") as log:
            self._process = subprocess.Popen(
                [
                    self._executable,
                    "--headless",
                    "--no-sandbox",  # root, in a container: the sandbox needs user namespaces
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--remote-debugging-pipe",
                    f"--user-data-dir={self._profile}",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # Safe here: the test process holds no lock a thread could have taken.
                preexec_fn=onto_3_and_4,
                pass_fds=(3, 4),
                start_new_session=True,
            )
        os.close(commands_in)
        os.close(answers_out)
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
            self._session = attached["sessionId"]
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: its helpers too
        if process is not None:
            process.wait(timeout=30)
        for descriptor in (self._commands, self._answers):
            os.close(descriptor)
        self._process = None

    def call(self, method: str, *, page: bool = False, **params: Any) -> dict[str, Any]:
        """Send a DevTools command (to the page with ``page``) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if page:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        give_up = time.monotonic() + DEADLINE
        while True:
            answer = self._read(give_up)
            if answer.get("id") != self._next_id:
                continue  # an event, or the answer to a command given up on
            if "error" in answer:
                raise RuntimeError(f"{method}: {answer['error']}")
            result: dict[str, Any] = answer["result"]
            return result

    def _read(self, give_up: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = give_up - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer in {DEADLINE:g} s")
            ready, _, _ = select.select([self._answers], [], [], left)
            if ready:
                chunk = os.read(self._answers, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe (it exited)")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        decoded: dict[str, Any] = json.loads(message)
        return decoded

    def open(self, url: str) -> None:
        """Load ``url`` in the page."""
        self.call("Page.navigate", page=True, url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of the JavaScript ``expression`` in the page (as JSON comes back)."""
        result = self.call(
            "Runtime.evaluate",
            page=True,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, deadline: float = DEADLINE) -> Any:
        """Evaluate ``expression`` until it is truthy (then return it), up to ``deadline`` s."""
        return wait_until(
            lambda: self.evaluate(expression),
            deadline,
            lambda: f"{expression!r} true; page:\n{self.evaluate(PAGE_TEXT)}",
            interval=0.1,
        )

    def screenshot(self, path: Path) -> None:
        """A PNG of the page, for a person to look at when a test fails."""
        import base64

        data = self.call("Page.captureScreenshot", page=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
