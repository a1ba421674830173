"""The Ray the ``ray`` backend runs on: which one, connecting to it in bounded time, its size.

Which Ray. The address given (``ray_address=``, ``--ray-address``), else
``$RAY_ADDRESS``, else a Ray started here for this run alone — on this machine's CPUs
and GPUs, or those ``system`` declares — and shut down after it, its processes with
it. A process that is already connected to Ray (its own ``ray.init()``, a notebook's)
keeps that connection: the backend runs on it and leaves it connected. Several
simulations of one process at once share the Ray the first one opened; the last to
finish closes it.

Bounded time. ``ray.init`` pointed at an address where no Ray answers retries for good,
printing a warning every few seconds or nothing at all — the silent hang Flower users
report. Here an address of the ``host:port`` form is first tried with a plain TCP
connection, which fails at once when nothing listens; then ``ray.init`` runs in a
thread of its own, and a connection that is not up within :data:`CONNECT_TIMEOUT`
seconds (:data:`START_TIMEOUT` for a Ray started here) is a
:class:`~fedcore.errors.ClusterUnavailableError` naming the address. The thread is a
daemon's: an ``init`` that never returns does not hold the process at exit. Running
``init`` outside the main thread also keeps Ray's own SIGTERM handler out of a
process whose signals :mod:`fedcore.event_loop` owns.

Size. :func:`plan_actors` counts, node by node, the actors of a ClientApp's
:class:`~fedcore.simulation.resources.Resources` that fit — CPUs and GPUs as
``sizing.py`` counts them for one machine, fractions of a GPU packed on a device as
Ray packs them — so that no actor is created that no node could ever place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import ray

from fedcore.errors import ClusterUnavailableError, UsageError
from fedcore.simulation.resources import Resources
from fedcore.workers.sizing import detect_cpus, detect_gpus, fit, gpu_slots

log = logging.getLogger(__name__)

ADDRESS_VARIABLE = "RAY_ADDRESS"
"""Ray's own variable for the cluster to connect to; the default of ``ray_address``."""
CONNECT_TIMEOUT = 30.0
"""Seconds to connect to a running Ray cluster before giving up with its address."""
START_TIMEOUT = 120.0
"""Seconds for a Ray started here to come up (its processes start on a busy machine too)."""
_PROBE_TIMEOUT = 10.0
_RAY_LOGGING = logging.WARNING
"""Ray's own log level on the driver: its warnings and errors, not its progress notes."""


@dataclass(frozen=True)
class RaySession:
    """The Ray a backend runs on: ``owned`` when this module opened it and must close it;
    ``shipped``, the app directory Ray ships to every node (the job's working
    directory), if any."""

    address: str
    owned: bool
    shipped: Path | None = None


@dataclass(frozen=True)
class NodeShape:
    """What one alive Ray node offers, and the name it goes by in logs."""

    node_id: str
    name: str
    cpus: float
    gpus: float


@dataclass
class _Opened:
    """The Ray this module opened: the thread holding it, and the simulations on it."""

    thread: _RayThread
    shipped: Path | None
    users: int = 1


_opened: _Opened | None = None


async def open_session(
    address: str | None, system: Resources | None, app_dir: Path | None = None
) -> RaySession:
    """Connect to (or start) the Ray the run uses; see the module's docstring for which.

    Connecting to a cluster, ``app_dir`` becomes the job's working directory, which Ray
    ships to every node (only a job's can be a local directory, not an actor's). A Ray
    of the run's own runs on this machine alone, where the app is already.
    """
    global _opened
    if _opened is not None:  # open, or being opened by another simulation: share it
        opened = _opened
        opened.users += 1
        try:
            with anyio.fail_after(START_TIMEOUT):
                await asyncio.wrap_future(opened.thread.started)
        except BaseException:
            opened.users -= 1
            raise
        _not_used(address)
        return RaySession(_current_address(), owned=True, shipped=opened.shipped)
    if ray.is_initialized():
        _not_used(address)
        log.info("ray: using the Ray cluster this process is connected to")
        return RaySession(_current_address(), owned=False)
    address = address or os.environ.get(ADDRESS_VARIABLE) or None
    options: dict[str, Any] = {"logging_level": _RAY_LOGGING}
    if address is None:
        # Ray counts a node's CPUs and GPUs in whole units.
        if system is not None and system.num_cpus < 1:
            raise UsageError(
                f"a Ray of the run's own needs a whole CPU; the system has {system.num_cpus:g}"
            )
        cpus = math.floor(system.num_cpus) if system is not None else detect_cpus()
        gpus = math.floor(system.num_gpus) if system is not None else detect_gpus()
        options |= {"address": "local", "num_cpus": cpus, "num_gpus": gpus}
        options["include_dashboard"] = False
        label, timeout = "a Ray of this run's own", START_TIMEOUT
        app_dir = None
    else:
        await _probe(address)
        options["address"] = address
        if app_dir is not None:
            options["runtime_env"] = {"working_dir": str(app_dir)}
        label, timeout = f"the Ray cluster at {address}", CONNECT_TIMEOUT
    opened = _opened = _Opened(_RayThread(options), shipped=app_dir)
    try:
        await _start(opened.thread, label, timeout)
    except BaseException:
        _opened = None
        opened.thread.abandon()
        raise
    session = RaySession(_current_address(), owned=True, shipped=app_dir)
    log.info("ray: connected to %s (%s)", label, session.address)
    return session


async def close_session(session: RaySession) -> None:
    """Leave the Ray of ``session``: disconnect from it (and stop it, if it is the run's
    own) once the last simulation on it is done."""
    global _opened
    if not session.owned or _opened is None:
        return
    opened = _opened
    opened.users -= 1
    if opened.users == 0:
        _opened = None
        with anyio.CancelScope(shield=True):
            await opened.thread.stop()


def _not_used(address: str | None) -> None:
    if address is not None:
        log.warning("ray: this process is connected to Ray already; %s is not used", address)


def _current_address() -> str:
    address: str = ray.get_runtime_context().gcs_address
    return address


async def _probe(address: str) -> None:
    """Fail at once, naming ``address``, where nothing accepts a TCP connection."""
    if "://" in address or ":" not in address:  # "auto", ray:// (Ray Client): Ray resolves them
        return
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--ray-address {address!r}: expected HOST:PORT") from None

    def connect() -> None:
        with socket.create_connection((host, number), timeout=_PROBE_TIMEOUT):
            pass

    try:
        await anyio.to_thread.run_sync(connect)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ClusterUnavailableError(
            f"no Ray cluster answers at {address} ({reason}): start one there with "
            "`ray start --head`, or leave out the address to run on a Ray of this run's own"
        ) from None


class _RayThread(threading.Thread):
    """The thread that calls ``ray.init`` and, at the end, ``ray.shutdown``, and lives between.

    A Ray started here has its processes (GCS, raylet) ask Linux to kill them when
    their parent goes (``PR_SET_PDEATHSIG``), and the parent that means is the *thread*
    that started them: a thread that returned after ``init`` would take the Ray with
    it. A daemon: an ``init`` that never returns does not hold the process at exit, and
    a process that ends without closing its session takes its Ray along.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(name="fedcore-ray", daemon=True)
        self._options = options
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop = threading.Event()

    def run(self) -> None:
        before = dict(os.environ)
        try:
            ray.init(**self._options)
        except BaseException as exc:
            self.started.set_exception(exc)
            return
        finally:
            _restore(before, keep=lambda name: name.startswith("RAY_"))
        self.started.set_result(None)
        self._stop.wait()
        try:
            ray.shutdown()
        except BaseException as exc:
            self.stopped.set_exception(exc)
        else:
            self.stopped.set_result(None)
        finally:
            _restore(before, keep=lambda name: False)

    async def stop(self) -> None:
        """``ray.shutdown()``, in this thread; wait for it."""
        self._stop.set()
        await asyncio.wrap_future(self.stopped)

    def abandon(self) -> None:
        """Shut down as soon as ``init`` returns, if it ever does: nobody waits for it now."""
        self._stop.set()


def _restore(before: dict[str, str], keep: Callable[[str], bool]) -> None:
    """Put back the environment variables ``ray.init`` changed, but those ``keep`` names.

    ``init`` leaves some in this process for good: ``PYTHONBREAKPOINT``, which would send
    a ``breakpoint()`` in the ServerApp to Ray's remote debugger, is put back at once;
    Ray's own (``RAY_AUTH_MODE``), which it may read again while connected, once it has
    shut down.
    """
    for name in set(os.environ) | set(before):
        if keep(name) or os.environ.get(name) == before.get(name):
            continue
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]


async def _start(thread: _RayThread, label: str, timeout: float) -> None:
    """Start ``thread``'s ``ray.init``; give up on it after ``timeout`` seconds."""
    _quiet_ray_notices()
    thread.start()
    try:
        with anyio.fail_after(timeout):
            await asyncio.wrap_future(thread.started)
    except TimeoutError:
        raise ClusterUnavailableError(
            f"could not connect to {label} within {timeout:g} s: is Ray running there, "
            f"and the same version as here (ray {ray.__version__})?"
        ) from None
    except ConnectionError as exc:
        raise ClusterUnavailableError(f"could not connect to {label}: {exc}") from None


class _RayNotices(logging.Filter):
    """Drops two notices Ray logs on the driver about choices fedcore made on purpose:
    that ``init`` outside the main thread sets no SIGTERM handler (so that fedcore's
    stay), and that a Ray started here has token authentication on (its default, kept)."""

    NOTICES = ("SIGTERM handler is not set", "Token authentication is enabled")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOTICES)


_FILTER = _RayNotices()


def _quiet_ray_notices() -> None:
    for name in ("ray._private.worker", "ray._private.authentication.authentication_token_setup"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


async def cluster_nodes() -> list[NodeShape]:
    """The alive nodes of the connected cluster, with what each offers."""
    nodes = await anyio.to_thread.run_sync(ray.nodes)
    shapes = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        name = str(node.get("NodeName") or node.get("NodeManagerAddress") or "?")
        shapes.append(
            NodeShape(
                node_id=str(node["NodeID"]),
                name=name,
                cpus=float(resources.get("CPU", 0.0)),
                gpus=float(resources.get("GPU", 0.0)),
            )
        )
    return shapes


def plan_actors(request: Resources, nodes: list[NodeShape], max_workers: int | None) -> int:
    """How many actors of ``request`` the cluster of ``nodes`` can place, capped by ``max_workers``.

    A request no node can meet is refused at once with what was asked and what each
    node has: Ray would otherwise keep the actors pending for good.
    """
    if max_workers is not None and (isinstance(max_workers, bool) or max_workers < 1):
        raise UsageError(f"max_workers must be at least 1, got {max_workers!r}")
    if request.num_gpus > 1 and request.num_gpus != int(request.num_gpus):
        raise UsageError(
            f"each ClientApp asks for {request.num_gpus:g} GPUs: Ray shares a GPU between "
            "actors for fractions under 1, and gives whole GPUs above; ask for a whole number"
        )
    total = sum(_fits_on(request, node) for node in nodes)
    if total < 1:
        offered = ", ".join(f"{node.cpus:g} CPUs and {node.gpus:g} GPUs" for node in nodes)
        raise UsageError(
            f"each ClientApp asks for {request.num_cpus:g} CPUs and {request.num_gpus:g} GPUs, "
            f"and no node of the Ray cluster has that many (its nodes: {offered or 'none'})"
        )
    return total if max_workers is None else min(total, max_workers)


def _fits_on(request: Resources, node: NodeShape) -> int:
    by_cpu = fit(node.cpus, request.num_cpus)
    if request.num_gpus == 0:
        return by_cpu
    return min(by_cpu, gpu_slots(request.num_gpus, int(node.gpus)))
