"""A pytest plugin: anyio on uvloop, a fake clock, a blocked-loop check, and Ray for the
tests marked ``ray``.

Enable it with ``-p fedcore.testing.plugin`` (fedcore's own suite does so in
pyproject.toml). Async tests run on the event loop fedcore runs on in production,
uvloop (``--event-loop asyncio``: the standard library's instead); those marked
``every_event_loop`` run on both, once each. With ``--loop-debug`` the loops run in
debug mode, and a test fails if its loop reports a callback that held it for longer
than ``BLOCKING_THRESHOLD`` seconds: code that blocks the loop stalls every node and
reply in a simulation, so it is a bug even when the test's assertions pass.

The simulations a test session runs keep their results directories in one
temporary directory (``$FEDCORE_RESULTS``, which the processes they start inherit),
not in whatever directory the tests run from.

Tests marked ``ray`` run after all the others, share one Ray
(:mod:`fedcore.testing.backends`), and are skipped where Ray is not installed. Ray's
usage statistics, which it would send out over the network, are off for the session
and the processes it starts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from fedcore.results import RESULTS_ENV
from fedcore.testing import backends
from fedcore.testing.clock import FakeClock

BLOCKING_THRESHOLD = 0.5
EVENT_LOOPS = ("uvloop", "asyncio")
"""The event loops async tests can run on: uvloop (production's), the standard library's."""
EVERY_EVENT_LOOP = "every_event_loop"
"""The marker of tests that run on each of :data:`EVENT_LOOPS`."""


def pytest_addoption(parser: pytest.Parser) -> None:
    installed = importlib.util.find_spec("uvloop") is not None
    parser.addoption(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0] if installed else "asyncio",
        help="the event loop async tests run on (uvloop, production's, where installed); "
        f"tests marked {EVERY_EVENT_LOOP} run on each",
    )
    parser.addoption(
        "--loop-debug",
        action="store_true",
        help="run the async tests' loops in debug mode, and fail a test whose loop a callback "
        f"held for over {BLOCKING_THRESHOLD:g} s",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marked = metafunc.definition.get_closest_marker(EVERY_EVENT_LOOP) is not None
    if marked and "anyio_backend" in metafunc.fixturenames:
        metafunc.parametrize("anyio_backend", EVENT_LOOPS, indirect=True)


class _EventLoop:
    """The ``anyio_backend`` fixture, in a plugin of its own that :func:`pytest_configure`
    registers: a fixture overrides those of the plugins registered before its own, and
    anyio's plugin, an entry point, is registered after the ``-p`` ones (this module)."""

    @pytest.fixture
    def anyio_backend(self, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
        loop = getattr(request, "param", None) or request.config.getoption("event_loop")
        debug = request.config.getoption("loop_debug")
        return "asyncio", {"debug": debug, "use_uvloop": loop == "uvloop"}


@pytest.fixture(scope="session", autouse=True)
def _results_out_of_the_way(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    saved = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(tmp_path_factory.mktemp("results"))
    try:
        yield
    finally:
        if saved is None:
            del os.environ[RESULTS_ENV]
        else:
            os.environ[RESULTS_ENV] = saved


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith("Executing "):
            return
        seconds = float(message.rsplit(" took ", 1)[-1].removesuffix(" seconds"))
        if seconds >= BLOCKING_THRESHOLD:
            self.reports.append(message)


@pytest.fixture(autouse=True)
def _event_loop_never_blocks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test during which something held the event loop too long (a loop reports
    that in debug mode only: ``--loop-debug``)."""
    handler = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.reports and request.node.get_closest_marker("blocks_loop") is None:
        pytest.fail("the event loop was blocked:\n" + "\n".join(handler.reports), pytrace=False)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[None]:
    """One Ray for every test marked ``ray`` (:func:`fedcore.testing.backends.shared_ray`)."""
    yield from backends.shared_ray()


@pytest.fixture(autouse=True)
def _ray_for_ray_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker(backends.RAY_MARKER) is not None:
        request.getfixturevalue("shared_ray")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "blocks_loop: the test knowingly blocks the event loop (skips the check)"
    )
    config.addinivalue_line(
        "markers", f"{EVERY_EVENT_LOOP}: an async test that runs on uvloop and on asyncio's loop"
    )
    config.pluginmanager.register(_EventLoop(), "fedcore-event-loop")
    config.addinivalue_line("markers", f"{backends.RAY_MARKER}: needs Ray (the [ray] extra)")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Started in the background by a shell (`make test &`) or under nohup, this process,
    # and so every process a test starts, would ignore SIGINT or SIGHUP, and the tests of
    # what those signals do would fail for it. A handled signal is reset to the default
    # in each child; an ignored one is inherited.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``ray`` run last, together, or are skipped where Ray is not installed.

    Last: the shared Ray's processes (children of this one) then live beside no other
    test — one that counts or kills this process's children, say — and cost no CPU
    while the rest of the suite runs.
    """
    marked = [item for item in items if item.get_closest_marker(backends.RAY_MARKER)]
    if not backends.ray_installed():
        skip = pytest.mark.skip(reason="Ray is not installed: pip install 'fedcore[ray]'")
        for item in marked:
            item.add_marker(skip)
    chosen = set(marked)
    items[:] = [item for item in items if item not in chosen] + marked
