"""The node's composition root: the fleet client, the node role, and its ClientApp processes.

``fedcore serve --role node`` comes here. :func:`serve_node` connects to the link's
fleet API (gRPC, TLS when given), runs the node role with a runner factory that
gives each run one ClientApp process — the simulation's process pool with a single
worker, so a crash is answered with code 8 and a replacement starts, and a message
past its TTL gets code 3 — writes the ready file once registered, and serves until
cancelled. With an exec of its own (``exec_socket``: ``fedcore serve --role exec
--exec-socket``, for process isolation) the pool asks that exec to start each
ClientApp process (:mod:`fedcore.workers.spawn`) instead of starting it itself.
Either way a ClientApp process gets the minimal environment of app processes, no
secret of the node's (:mod:`fedcore.apps.environment`), and makes itself
non-dumpable (:mod:`fedcore.non_dumpable`) before it imports the ClientApp.

With an app user (``--app-user``, :mod:`fedcore.roles.exec.app_user`) the node starts
each ClientApp process as that user, on a private copy of the run's app (its working
directory's, and ``TMPDIR``, removed when the run's process pool stops), and makes
the shared-memory segments it writes for them over to that user: the process can then
read neither the node's key nor anything else in the node's work directory.

The node and those pools share one space of shared-memory segments: the node
streams each pulled payload into a segment of it, and the pool names that segment
in the task, so a large model is in the node's memory once, in the pages the
ClientApp process maps. Each segment goes with its content; whatever is left goes
when the node stops.

Each ClientApp process runs as many compute threads (BLAS, OpenMP, torch) as it has
CPUs (:mod:`fedcore.workers.threads`): ``num_cpus`` if the operator gave
it, else the CPUs this node may run on shared among the ``max_concurrent`` processes
that may train at once (at least one thread each). A node alone on its machine
lets its one ClientApp use every core, and its processes together run no more
threads than it has cores, unless more of them may train at once than it has cores.
"""

from __future__ import annotations

import logging
import os
import ssl as _ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType, TracebackType

import anyio
import anyio.abc

from fedcore.apps.environment import app_environment
from fedcore.auth.secret_files import read_node_key, read_secret
from fedcore.clock import Clock, SystemClock
from fedcore.defaults import HEARTBEAT_INTERVAL, MAX_CONCURRENT
from fedcore.domain import Context, Message, Run, UserConfigValue
from fedcore.errors import UsageError
from fedcore.roles.exec.app_user import AppUser, remove_copy, same_user_warning
from fedcore.roles.node import ClientAppRunner, Node, RunnerFactory
from fedcore.runtime.addresses import Address
from fedcore.runtime.ready import write_ready_file
from fedcore.runtime.work_dir import hold_work_dir
from fedcore.transport.grpc.client import GrpcFleetClient
from fedcore.wire import MAX_VALUE_LEN
from fedcore.workers.pool import ProcessPoolBackend
from fedcore.workers.shared_memory import SegmentSpace
from fedcore.workers.sizing import PoolPlan, detect_cpus
from fedcore.workers.spawn import Spawn, spawn_local, spawn_remote
from fedcore.workers.threads import thread_count

log = logging.getLogger(__name__)


NODE_KEY_FILE = "node.key"
"""The node key's file in the node's work directory, unless ``--auth-key`` names one."""


@dataclass(frozen=True)
class NodeOptions:
    """Everything ``fedcore serve --role node`` takes."""

    link: Address
    node_config: dict[str, UserConfigValue]
    work_dir: Path = Path(".fedcore-node")
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    max_concurrent: int = MAX_CONCURRENT
    ssl: _ssl.SSLContext | None = None
    ready_file: Path | None = None
    exec_socket: Path | None = None
    """The Unix socket of the exec that starts this node's ClientApp processes, if not itself."""
    exec_secret_file: Path | None = None
    num_cpus: float | None = None
    """CPUs each ClientApp process may use; None: this node's CPUs ÷ ``max_concurrent``."""
    app_env: tuple[str, ...] = ()
    """Variables of the node's environment its ClientApp processes get beside the allowed
    ones (:func:`fedcore.apps.environment.app_environment`), when it starts them itself."""
    auth_key: Path | None = None
    """The node's signing key; None: ``work_dir/node.key``, made on first start."""
    max_value_len: int = MAX_VALUE_LEN
    """The most bytes one str or bytes value of a record may take in the messages the node
    pulls and in what its ClientApp processes decode and reply (``--max-value-bytes``)."""
    app_user: AppUser | None = None
    """The user the node's ClientApp processes run as (``--app-user``); None: the node's."""

    def key_file(self) -> Path:
        return self.auth_key if self.auth_key is not None else self.work_dir / NODE_KEY_FILE

    def cpu_share(self) -> float:
        """The CPUs of each of this node's ClientApp processes."""
        if self.num_cpus is not None:
            return self.num_cpus
        return detect_cpus() / self.max_concurrent


def process_runner(
    clock: Clock,
    space: SegmentSpace,
    spawn: Spawn = spawn_local,
    *,
    num_cpus: float = 1.0,
    max_value_len: int = MAX_VALUE_LEN,
    app_user: AppUser | None = None,
    inherited: Mapping[str, str] = MappingProxyType({}),
) -> RunnerFactory:
    """A runner factory giving each run one ClientApp worker process, its segments in ``space``.

    ``spawn`` starts the process: this node itself by default, or its exec. Each
    process runs ``ceil(num_cpus)`` compute threads, and decodes and replies within
    ``max_value_len`` (a reply over it becomes an error reply, code 2). With
    ``app_user`` the node starts it itself (not with ``spawn``), as that user, on a
    private copy of the app, with ``inherited`` and the user's own variables as its
    environment.
    """
    plan = PoolPlan(1, (), thread_count(num_cpus))

    def pool(client_ref: str, app_dir: Path, spawn: Spawn) -> ClientAppRunner:
        return ProcessPoolBackend(
            client_ref,
            app_dir,
            plan,
            clock,
            space=space,
            spawn=spawn,
            max_value_len=max_value_len,
            private_memory=True,
        )

    def build(run: Run, app_dir: Path, client_ref: str) -> ClientAppRunner:
        if app_user is None:
            return pool(client_ref, app_dir, spawn)
        user = app_user

        def on_copy(copy: Path) -> ClientAppRunner:
            environment = {**inherited, **user.environment(), "TMPDIR": str(copy.parent)}
            as_user = partial(
                spawn_local, inherited=environment, user=(user.uid, user.gid), cwd=copy.parent
            )
            return pool(client_ref, copy, as_user)

        return _OnPrivateCopy(user, app_dir, on_copy)

    return build


class _OnPrivateCopy:
    """A run's ClientApp runner on a private copy of its app, owned by the app user.

    The copy is made as the runner starts and removed once it has stopped (its
    process gone), so that the app user never reads the node's bundle cache.
    """

    def __init__(
        self, user: AppUser, app_dir: Path, build: Callable[[Path], ClientAppRunner]
    ) -> None:
        self._user = user
        self._app_dir = app_dir
        self._build = build
        self._copy: Path | None = None
        self._runner: ClientAppRunner | None = None

    async def __aenter__(self) -> object:
        self._copy = await anyio.to_thread.run_sync(self._user.private_copy, self._app_dir)
        self._runner = self._build(self._copy)
        try:
            return await self._runner.__aenter__()
        except BaseException:
            await self._remove_copy()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._runner is not None
        try:
            return await self._runner.__aexit__(exc_type, exc, tb)
        finally:
            await self._remove_copy()

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        assert self._runner is not None
        return await self._runner.run(message, context)

    async def _remove_copy(self) -> None:
        if self._copy is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_copy, self._copy)
            self._copy = None


def _spawner(options: NodeOptions) -> Spawn:
    """How the node's ClientApp processes start: by the node, or by the exec it names."""
    if options.exec_socket is None:
        return partial(spawn_local, inherited=app_environment(os.environ, options.app_env))
    if options.exec_secret_file is None:
        raise UsageError("a node whose exec starts its ClientApps needs the exec's secret file")
    secret = read_secret(options.exec_secret_file, what="exec secret")
    return partial(spawn_remote, options.exec_socket, secret)


async def serve_node(
    options: NodeOptions,
    clock: Clock | None = None,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve as a node until cancelled; ``task_status`` gets the node id once registered.

    Its work directory is this process's alone while it serves (:mod:`fedcore.runtime.work_dir`):
    a second node on it fails at once with a ``UsageError``.
    """
    clock = clock or SystemClock()
    if options.app_user is not None and options.exec_socket is not None:
        raise UsageError(
            "--app-user is for a node that starts its ClientApps itself: with --exec-socket, "
            "its exec decides who they run as"
        )
    with hold_work_dir(options.work_dir):
        if options.exec_socket is None and options.app_user is None:
            # Said once the work dir is this node's: a second node on it says only that.
            log.warning(_same_user_warning(options))
        await _serve_held(options, clock, task_status)


def _same_user_warning(options: NodeOptions) -> str:
    """What a node's ClientApps, run as the node's own user, can reach."""
    return same_user_warning(
        "ClientApp",
        [
            f"the node's key {options.key_file()} (and with it sign as this node: "
            "register, and fetch every run and bundle the node may see)",
            f"its work directory {options.work_dir} (every run's bundle)",
        ],
        "Give --app-user USER (the node running as root), or start them by an exec of "
        "another user (--exec-socket).",
    )


async def _serve_held(
    options: NodeOptions, clock: Clock, task_status: anyio.abc.TaskStatus[int]
) -> None:
    """Serve as a node, its work directory held by this process."""
    link = options.link
    user = options.app_user
    space = SegmentSpace(owner=(user.uid, user.gid) if user is not None else None)
    key = read_node_key(options.key_file())
    log.info("node key %s (%s)", key.public.fingerprint, options.key_file())
    try:
        async with (
            GrpcFleetClient(link.host, link.port, ssl=options.ssl, key=key, clock=clock) as fleet,
            GrpcFleetClient(
                link.host, link.port, ssl=options.ssl, key=key, clock=clock
            ) as heartbeats,
        ):
            node = Node(
                fleet,
                node_config=options.node_config,
                cache_dir=options.work_dir / "bundles",
                runner_factory=process_runner(
                    clock,
                    space,
                    _spawner(options),
                    num_cpus=options.cpu_share(),
                    max_value_len=options.max_value_len,
                    app_user=user,
                    inherited=app_environment(os.environ, options.app_env),
                ),
                clock=clock,
                heartbeat_interval=options.heartbeat_interval,
                max_concurrent=options.max_concurrent,
                heartbeat_fleet=heartbeats,
                payload_store=space,
                max_value_len=options.max_value_len,
            )
            async with node:
                node_id = await node.wait_registered()
                if options.ready_file is not None:
                    write_ready_file(options.ready_file, {})
                log.info("node %d serving the link at %s", node_id, options.link)
                task_status.started(node_id)
                await anyio.sleep_forever()
    finally:
        space.remove_all()
