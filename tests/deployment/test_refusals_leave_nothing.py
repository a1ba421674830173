"""What a refused request leaves on a real link: nothing in its bundle cache, no log flood.

A bundle the link refuses (not UTF-8, not an app) must not stay unpacked in the
link's cache, however often it is sent; a request aiohttp refuses for its headers
is answered 4xx without a traceback in the link's log, however many there are.
"""

from __future__ import annotations

import io
import socket
import zipfile
from pathlib import Path

import anyio
import pytest

from fedcore.errors import BundleError
from fedcore.testing.deployment import Deployment
from fedcore.transport.http.control import HttpControlClient

TRIES = 5
PADDING = 256 * 1024
"""A file in each refused bundle big enough that a leaked copy is plain to see."""
HEADER_REQUESTS = 200
LOG_GROWTH_LIMIT = 4096
"""Bytes the link's log may grow by over all the refused header requests together."""


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def _bundle(pyproject: bytes) -> bytes:
    return _zip(
        {
            "pyproject.toml": pyproject,
            "app.py": b"x = 1\n",
            "padding.bin": bytes(range(256)) * (PADDING // 256),
        }
    )


NOT_UTF8 = _bundle(b'[project]\nname = "caf\xe9"\n[tool.fedcore.app]\nserverapp = "app:x"\n')
NOT_AN_APP = _bundle(b'[project]\nname = "plain"\n')


def _cache_entries(deployment: Deployment) -> list[Path]:
    cache = deployment.link_work_dir / "bundles"
    return sorted(cache.iterdir()) if cache.is_dir() else []


async def _submit_refused(port: int, token: str, bundle: bytes) -> str:
    async with HttpControlClient("127.0.0.1", port, token=token) as client:
        with pytest.raises(BundleError) as refused:
            await client.submit_run(bundle, {})
    return str(refused.value)


@pytest.mark.parametrize(
    ("bundle", "reason"),
    [(NOT_UTF8, "not UTF-8"), (NOT_AN_APP, "no [tool.fedcore.app] table")],
    ids=["not-utf8", "not-an-app"],
)
def test_a_refused_bundle_leaves_nothing_in_the_link_s_cache(
    tmp_path: Path, bundle: bytes, reason: str
) -> None:
    with Deployment(tmp_path) as deployment:
        link = deployment.start_link()
        port = int(link.address("control").rpartition(":")[2])
        token = deployment.control_token_file.read_text().strip()
        before = _cache_entries(deployment)
        for _ in range(TRIES):
            message = anyio.run(_submit_refused, port, token, bundle)
            assert message.startswith("the bundle is not an app"), message
            assert reason in message, message
            assert str(deployment.link_work_dir) not in message
            assert _cache_entries(deployment) == before
        listed = deployment.fedcore("ls")
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in link.tail(200)


def _status_line(port: int, head: bytes) -> bytes:
    """Send one request's ``head`` raw; the status line the link answers it with."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.partition(b"\r\n")[0]


OVER_LONG_HEADER = b"X-Long: " + b"a" * 20_000 + b"\r\nConnection: close\r\n"
TOO_MANY_HEADERS = b"".join(b"X-H%d: v\r\n" % i for i in range(200))


def test_requests_refused_for_their_headers_are_answered_4xx_and_leave_the_log_small(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path) as deployment:
        link = deployment.start_link()
        port = int(link.address("control").rpartition(":")[2])
        assert deployment.fedcore("ls").returncode == 0  # the log has its start-up lines
        size = link.output.stat().st_size
        for head in [OVER_LONG_HEADER] * HEADER_REQUESTS + [TOO_MANY_HEADERS] * 5:
            status = _status_line(port, head)
            assert status.split(b" ")[1].startswith(b"4"), status
        listed = deployment.fedcore("ls")
        assert listed.returncode == 0, listed.stderr
        grown = link.output.read_bytes()[size:]
        assert b"Traceback" not in grown, grown[:2000].decode(errors="replace")
        assert len(grown) <= LOG_GROWTH_LIMIT, grown[:2000].decode(errors="replace")
