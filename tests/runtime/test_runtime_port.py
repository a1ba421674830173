"""The link's runtime port across restarts: kept in its work directory, bound again.

A restarted link must listen where its surviving ServerApps call (the README's
"Restarting the link"; the processes themselves: tests/deployment/test_one_machine.py).
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import anyio
import pytest

from fedcore.runtime.addresses import Address
from fedcore.runtime.link import LinkOptions, serve_link
from fedcore.runtime.runtime_port import (
    preferred_runtime_address,
    remember_runtime_port,
    runtime_port_file,
)

pytestmark = pytest.mark.anyio

ANY_PORT = Address("127.0.0.1", 0)


def _options(work_dir: Path, runtime: Address = ANY_PORT) -> LinkOptions:
    return LinkOptions(
        fleet_address=ANY_PORT,
        control_address=ANY_PORT,
        runtime_address=runtime,
        database=":memory:",
        work_dir=work_dir,
    )


async def _runtime_of(options: LinkOptions) -> Address:
    """Start the link, and stop it once it is ready: where its runtime API listened."""
    async with anyio.create_task_group() as tasks:
        bound = await tasks.start(serve_link, options)
        tasks.cancel_scope.cancel()
    return bound["runtime"]


async def test_a_link_started_again_binds_the_runtime_port_it_had(tmp_path: Path) -> None:
    first = await _runtime_of(_options(tmp_path))
    assert first.port != 0
    assert runtime_port_file(tmp_path).read_text() == f"{first.port}\n"
    assert await _runtime_of(_options(tmp_path)) == first


async def test_a_port_taken_meanwhile_gives_a_new_one_and_says_what_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        remember_runtime_port(tmp_path, port)
        with caplog.at_level(logging.WARNING, logger="fedcore.runtime.link"):
            runtime = await _runtime_of(_options(tmp_path))
    assert runtime.port not in (0, port)
    assert runtime_port_file(tmp_path).read_text() == f"{runtime.port}\n"
    (warning,) = [r.getMessage() for r in caplog.records if "runtime API's port" in r.getMessage()]
    assert f"port {port}" in warning
    assert "cannot reach it" in warning
    assert "--runtime-address" in warning


async def test_a_fixed_runtime_address_is_bound_whatever_the_file_says(tmp_path: Path) -> None:
    remember_runtime_port(tmp_path, 1)  # a port a test cannot bind
    with socket.create_server(("127.0.0.1", 0)) as probe:
        free = probe.getsockname()[1]
    fixed = Address("127.0.0.1", free)
    assert await _runtime_of(_options(tmp_path, fixed)) == fixed


@pytest.mark.parametrize("text", ["", "lots", "0", "70000", "-5", "\xff"])
def test_a_file_that_holds_no_port_is_ignored(tmp_path: Path, text: str) -> None:
    runtime_port_file(tmp_path).write_text(text, encoding="latin-1")
    assert preferred_runtime_address(ANY_PORT, tmp_path) == ANY_PORT


def test_without_a_file_port_0_stays(tmp_path: Path) -> None:
    assert preferred_runtime_address(ANY_PORT, tmp_path / "new") == ANY_PORT
