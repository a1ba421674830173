"""The link's composition root: state, its APIs, and the ServerApp launcher.

``fedcore serve --role link`` comes here (through :mod:`fedcore.runtime.serve`).
:func:`serve_link` opens the LinkState (SQLite on disk by default, ``:memory:`` for
tests), serves the fleet API (gRPC), the control API and the runtime API (HTTP) — and
the exec API (HTTP, signed with a shared secret) when given an exec address, for execs
started on their own (:mod:`fedcore.runtime.exec`) — starts the exec's launcher in the
same process unless told not to, writes the ready file, and serves until cancelled. Each
piece is one ``enter_async_context``; leaving unwinds them in reverse, so the launcher
stops its ServerApps before the APIs close and the state is closed last.
"""

from __future__ import annotations

import gc
import logging
import ssl as _ssl
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from importlib.metadata import version
from pathlib import Path

import anyio

from fedcore.auth.authorized_nodes import (
    AuthorizedNodesFile,
    read_authorized_nodes,
    reload_on_hangup,
)
from fedcore.auth.control_token import LINK_WORK_DIR, link_token_file
from fedcore.auth.fleet_gate import NodeGate
from fedcore.auth.secret_files import read_secret
from fedcore.clock import Clock, SystemClock
from fedcore.errors import UsageError
from fedcore.roles.exec.launcher import LaunchSettings, ServerAppLauncher
from fedcore.roles.link.control import LinkControl
from fedcore.roles.link.exec import LinkExec
from fedcore.roles.link.fleet import MAX_HEARTBEAT_INTERVAL, LinkFleet
from fedcore.roles.link.retirement import RETIRE_NODES_AFTER, retire_nodes
from fedcore.roles.link.runtime import LinkRuntime
from fedcore.runtime.addresses import Address, check_exposure
from fedcore.runtime.ready import write_ready_file
from fedcore.runtime.runtime_port import preferred_runtime_address, remember_runtime_port
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE, LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.stalls import LAG_BUCKETS_MS, LAG_PERIOD, LoopLag, StallWatch
from fedcore.transport.grpc.guard import DEFAULT_FLEET_LIMITS, FleetLimits
from fedcore.transport.grpc.server import serve_fleet
from fedcore.transport.http.control import control_app
from fedcore.transport.http.exec import exec_app
from fedcore.transport.http.guard import DEFAULT_HTTP_LIMITS, HttpLimits
from fedcore.transport.http.runtime import runtime_app
from fedcore.transport.http.server import serve_http
from fedcore.wire import MAX_VALUE_LEN

log = logging.getLogger(__name__)

MEMORY = ":memory:"
FLEET_ADDRESS = Address("127.0.0.1", 9092)
CONTROL_ADDRESS = Address("127.0.0.1", 9093)
RUNTIME_ADDRESS = Address("127.0.0.1", 0)


@dataclass(frozen=True)
class LinkOptions:
    """Everything ``fedcore serve --role link`` takes.

    ``exec_address``: where to serve the exec API (None: not at all), to holders of
    the secret in ``exec_secret_file`` (default: ``exec.secret`` in the work
    directory). ``local_exec``: whether the link launches ServerApps itself. The
    control API always wants a bearer token: the one in ``control_token_file``
    (default: ``control.token`` in the work directory, made on first start).
    ``max_value_len``: the most bytes one str or bytes value of a record may take in
    what the link decodes (nodes' replies, its ServerApps' pushes), and in what the
    ServerApps it launches push and decode (it overrides ``launch``'s).
    ``max_heartbeat_interval``: the longest heartbeat interval a node may declare (a
    longer one is refused). ``retire_nodes_after``: seconds a node registered with a
    key may stay offline before it is deleted (None: never).
    """

    fleet_address: Address = FLEET_ADDRESS
    control_address: Address = CONTROL_ADDRESS
    runtime_address: Address = RUNTIME_ADDRESS
    database: str = "fedcore-link.db"
    work_dir: Path = LINK_WORK_DIR
    ready_file: Path | None = None
    fleet_ssl: _ssl.SSLContext | None = None
    control_ssl: _ssl.SSLContext | None = None
    control_token_file: Path | None = None
    insecure: bool = False
    heartbeat_patience: float = DEFAULT_HEARTBEAT_PATIENCE
    authorized_nodes: Path | None = None
    """A file of the public keys of the nodes admitted; None: any key (trust on first use)."""
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    exec_address: Address | None = None
    exec_secret_file: Path | None = None
    exec_ssl: _ssl.SSLContext | None = None
    local_exec: bool = True
    fleet_limits: FleetLimits = DEFAULT_FLEET_LIMITS
    http_limits: HttpLimits = DEFAULT_HTTP_LIMITS
    """The bounds of each HTTP API (control, runtime, exec) on connections and requests."""
    max_value_len: int = MAX_VALUE_LEN
    max_heartbeat_interval: float = MAX_HEARTBEAT_INTERVAL
    retire_nodes_after: float | None = RETIRE_NODES_AFTER

    def check(self) -> None:
        """Refuse plaintext listeners that other machines can reach, unless insecure.

        Refuse too a link that would launch no run: no exec of its own, no exec API.
        """
        if self.retire_nodes_after is not None and not self.retire_nodes_after > 0:
            raise UsageError(
                f"retire_nodes_after must be positive (None: never), got {self.retire_nodes_after}"
            )
        if not self.local_exec and self.exec_address is None:
            raise UsageError(
                "a link without its own exec needs an exec address for external execs, "
                "or no run would ever be launched"
            )
        if self.exec_address is not None:
            check_exposure(
                self.exec_address,
                tls=self.exec_ssl is not None,
                insecure=self.insecure,
                what="the exec address",
            )
        check_exposure(
            self.fleet_address,
            tls=self.fleet_ssl is not None,
            insecure=self.insecure,
            what="the fleet address",
        )
        check_exposure(
            self.control_address,
            tls=self.control_ssl is not None,
            insecure=self.insecure,
            what="the control address",
            certificates="--control-ssl-certfile/--control-ssl-keyfile",
        )
        check_exposure(
            self.runtime_address, tls=False, insecure=self.insecure, what="the runtime address"
        )


@asynccontextmanager
async def open_state(
    database: str, clock: Clock, patience: float, stalls: StallWatch
) -> AsyncIterator[LinkState]:
    """The link's LinkState: SQLite in ``database``, or in memory for ``:memory:``.

    Either way it runs ``stalls``, which watches for stalls of the link's own event
    loop, so that nobody is failed for heartbeats the link did not read
    (:mod:`fedcore.state.stalls`), and measures the loop's lag for the metrics.
    """
    if database == MEMORY:
        async with InMemoryLinkState(clock, heartbeat_patience=patience, stalls=stalls) as state:
            yield state
        return
    from fedcore.state.sqlite import SqliteLinkState  # sqlite3 only where a file is used

    Path(database).parent.mkdir(parents=True, exist_ok=True)
    async with SqliteLinkState(
        database, clock, heartbeat_patience=patience, stalls=stalls
    ) as sqlite_state:
        yield sqlite_state


async def serve_link(
    options: LinkOptions,
    clock: Clock | None = None,
    *,
    task_status: anyio.abc.TaskStatus[dict[str, Address]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the link until cancelled; ``task_status`` gets the bound listener addresses."""
    options.check()
    clock = clock or SystemClock()
    stalls = StallWatch(clock, period=LAG_PERIOD)
    async with AsyncExitStack() as stack:
        state = await stack.enter_async_context(
            open_state(options.database, clock, options.heartbeat_patience, stalls)
        )
        fleet = options.fleet_address
        gate = NodeGate(state, clock)
        authorized = None
        if options.authorized_nodes is None:
            log.warning(
                "any node key may register (trust on first use): --authorized-nodes FILE "
                "admits only the keys it lists"
            )
        else:
            authorized = AuthorizedNodesFile(options.authorized_nodes, gate)
            gate.authorize(read_authorized_nodes(options.authorized_nodes))
        link_fleet = LinkFleet(
            state,
            clock,
            max_value_len=options.max_value_len,
            max_heartbeat_interval=options.max_heartbeat_interval,
        )
        listener = await stack.enter_async_context(
            serve_fleet(
                link_fleet,
                fleet.host,
                fleet.port,
                gate=gate,
                ssl=options.fleet_ssl,
                limits=options.fleet_limits,
            )
        )
        control = options.control_address
        control_token = read_secret(
            link_token_file(options.work_dir, options.control_token_file), what="control token"
        )
        control_service = LinkControl(
            state, options.work_dir / "bundles", version=version("fedcore"), authorized=authorized
        )
        control_port = await stack.enter_async_context(
            serve_http(
                control_app(
                    control_service, token=control_token, metrics=partial(_metrics, stalls, clock)
                ),
                control.host,
                control.port,
                name="control",
                ssl=options.control_ssl,
                limits=options.http_limits,
            )
        )
        runtime = options.runtime_address
        runtime_port = await _serve_runtime(stack, options, state, clock)
        bound = {
            "fleet": Address(fleet.host, listener.port),
            "control": Address(control.host, control_port),
            "runtime": Address(runtime.host, runtime_port),
        }
        link_exec = LinkExec(state, clock, runtime_address=str(bound["runtime"]))
        if options.exec_address is not None:
            secret = read_secret(
                options.exec_secret_file or options.work_dir / "exec.secret", what="exec secret"
            )
            exec_port = await stack.enter_async_context(
                serve_http(
                    exec_app(link_exec, secret, clock=clock, link=gate.link),
                    options.exec_address.host,
                    options.exec_address.port,
                    name="exec",
                    ssl=options.exec_ssl,
                    limits=options.http_limits,
                )
            )
            bound["exec"] = Address(options.exec_address.host, exec_port)
        tasks = await stack.enter_async_context(anyio.create_task_group())
        if options.authorized_nodes is not None:
            tasks.start_soon(reload_on_hangup, options.authorized_nodes, gate)
        if options.retire_nodes_after is not None:
            tasks.start_soon(
                retire_nodes, state, clock, options.retire_nodes_after, (gate, link_fleet)
            )
        if options.local_exec:
            settings = replace(options.launch, max_value_len=options.max_value_len)
            launcher = ServerAppLauncher(
                link_exec, clock, work_dir=options.work_dir, settings=settings
            )
            await tasks.start(launcher.serve)
        if options.ready_file is not None:
            write_ready_file(options.ready_file, bound)
        log.info(
            "link ready: %s; %s; state %s",
            ", ".join(f"{name} {address}" for name, address in bound.items()),
            "launching ServerApps here" if options.local_exec else "ServerApps left to execs",
            options.database,
        )
        _settle_garbage_collector()
        # The metrics count from here: start-up (imports, the collection above) blocks.
        stalls.lag = LoopLag(since=clock.now())
        task_status.started(bound)
        await anyio.sleep_forever()


async def _serve_runtime(
    stack: AsyncExitStack, options: LinkOptions, state: LinkState, clock: Clock
) -> int:
    """Serve the runtime API on the port it had before, if it may (see
    :mod:`fedcore.runtime.runtime_port`); the bound port, remembered for the next start."""
    wanted = options.runtime_address
    preferred = preferred_runtime_address(wanted, options.work_dir)

    def serve(address: Address) -> AbstractAsyncContextManager[int]:
        service = LinkRuntime(state, clock)
        app = runtime_app(service, max_value_len=options.max_value_len)
        return serve_http(
            app, address.host, address.port, name="runtime", limits=options.http_limits
        )

    try:
        port = await stack.enter_async_context(serve(preferred))
    except OSError as exc:
        if preferred == wanted:
            raise
        log.warning(
            "the runtime API's port %d, which ServerApps still running from the last start "
            "of this link call, is taken (%s): serving it on a new port, where they cannot "
            "reach it; give --runtime-address a fixed port to keep it",
            preferred.port,
            exc.strerror or exc,
        )
        port = await stack.enter_async_context(serve(wanted))
    remember_runtime_port(options.work_dir, port)
    return port


def _metrics(stalls: StallWatch, clock: Clock) -> dict[str, object]:
    """What ``GET /v1/metrics`` answers: how long the link's event loop was held at most."""
    lag = stalls.lag
    return {
        "loop_lag_max_ms": {
            "last_minute": round(lag.recent_max(clock.now()) * 1000, 3),
            "since_start": round(lag.max_since_start * 1000, 3),
        },
        "loop_lag_histogram_ms": {
            **{
                f"le_{bound:g}": count
                for bound, count in zip(LAG_BUCKETS_MS, lag.counts[:-1], strict=True)
            },
            "more": lag.counts[-1],
        },
    }


GC_THRESHOLDS = (50_000, 20, 20)
"""The link's collector thresholds: allocations before a young collection, and so on."""


def _settle_garbage_collector() -> None:
    """Keep Python's collector from pausing a busy link for a fifth of a second.

    With a thousand nodes connected, the default thresholds had the link collect
    its oldest generation every few seconds, each pause 100-200 ms long: a
    heartbeat's p99 of about 200 ms, against 18 ms with these thresholds (measured
    by the heartbeat benchmark). What start-up made lives as long as the link, so
    it is frozen out of every collection; reference counting still frees
    everything that is not a cycle at once.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
