from __future__ import annotations

import asyncio

import pytest


def _on_uvloop() -> bool:
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


@pytest.mark.anyio
async def test_async_tests_run_on_the_loop_the_option_names(request: pytest.FixtureRequest) -> None:
    assert _on_uvloop() is (request.config.getoption("event_loop") == "uvloop")


def test_the_default_loop_is_uvloop_where_installed(pytestconfig: pytest.Config) -> None:
    pytest.importorskip("uvloop")
    parsed = pytestconfig._parser.parse_known_args([])
    assert parsed.event_loop == "uvloop"


@pytest.mark.anyio
@pytest.mark.every_event_loop
async def test_a_test_marked_every_event_loop_runs_on_each(
    request: pytest.FixtureRequest, anyio_backend: tuple[str, dict[str, bool]]
) -> None:
    node = request.node
    assert isinstance(node, pytest.Function)
    loop = node.callspec.params["anyio_backend"]
    assert loop in ("uvloop", "asyncio")
    assert _on_uvloop() is (loop == "uvloop")
    debug = request.config.getoption("loop_debug")
    assert anyio_backend == ("asyncio", {"debug": debug, "use_uvloop": loop == "uvloop"})
    assert asyncio.get_running_loop().get_debug() is debug


BLOCKING = """
import time

import pytest


@pytest.mark.anyio
async def test_holds_its_loop() -> None:
    time.sleep(0.6)
"""


@pytest.mark.blocks_loop  # the run inside logs to this process's asyncio logger
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_with_loop_debug_a_test_that_holds_its_loop_fails(
    pytester: pytest.Pytester, loop: str
) -> None:
    pytester.makepyfile(BLOCKING)
    plugin = ["-p", "fedcore.testing.plugin", "--event-loop", loop]

    pytester.runpytest_inprocess(*plugin).assert_outcomes(passed=1)
    debugged = pytester.runpytest_inprocess(*plugin, "--loop-debug")

    debugged.assert_outcomes(passed=1, errors=1)
    debugged.stdout.fnmatch_lines(["*the event loop was blocked*", "*Executing * took 0.6*"])
