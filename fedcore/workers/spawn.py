"""Starting worker processes: as children of this process, or through an exec.

A worker is a fresh ``python`` running :mod:`fedcore.workers.worker` on one end of a
socket pair, passed as an inherited file descriptor (:func:`worker_command`).
:func:`spawn_local` starts it as a child; for process isolation — the ClientApp under
another user, in another cgroup or container — a node leaves that to an exec
(``fedcore serve --role exec --for-node SOCKET``) listening on a Unix socket:
:func:`spawn_remote` hands the exec the channel *as a file descriptor*
(``SCM_RIGHTS``), which the exec passes on to the child (:func:`serve_spawner`).
Nothing of the node's is on the child's command line or in its environment but that
descriptor's number; the channel is the launch token, and only the node holds the
other end.

The child inherits a part of the environment of whoever starts it — an exec's or a
node's minimal one for app processes (:func:`fedcore.apps.environment.app_environment`),
a simulation's whole one but fedcore's secrets — with the ``environment`` asked for on
top, and ``defaults`` (the thread caps of :mod:`fedcore.workers.threads`) only where
the inherited one lacks them: :func:`child_environment`, the one rule for all.

The conversation, one ``SOCK_SEQPACKET`` connection per process, each message a
:func:`~fedcore.wire.worker.pack_spec` document::

    node → exec   {"secret": S, "environment": ["K=V", ...], "defaults": ["K=V", ...]}
                  + the channel's descriptor
    exec → node   {"pid": N}                or {"refused": why}
    node → exec   {"kill": 1}               (a ClientApp past its TTL)
    exec → node   {"exit": status}          when the process ends (-N: killed by signal N)

A node that goes away (its end of the connection closes) lets go of the process:
the process exits by itself once its channel closes, and the exec kills it if it
has not after :data:`LET_GO_GRACE` seconds. An exec that dies takes its processes with it (they
die with their parent); the node sees their channels close, answers their messages
with error code 8 and asks again, and :func:`spawn_remote` waits up to
:data:`CONNECT_PATIENCE` seconds for an exec to answer.

:class:`RemoteProcess` is what the node holds: a ``subprocess.Popen`` look-alike
(``pid``, ``poll``, ``wait``, ``kill``, ``returncode``), so that the pool treats a
process it started and one an exec started alike.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import anyio
import anyio.abc
import anyio.to_thread

from fedcore.apps.environment import app_environment, without_secrets
from fedcore.errors import AppLoadError, DecodeError
from fedcore.wire.worker import pack_spec, unpack_spec

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024
"""The longest message either side reads (an environment is a few kilobytes)."""
CONNECT_PATIENCE = 30.0
"""Seconds :func:`spawn_remote` keeps trying an exec that is not listening (yet, or again)."""
LET_GO_GRACE = 5.0
"""Seconds a let-go process gets to exit by itself before the exec kills it."""

Command = Callable[[int], Sequence[str]]
"""The command line of a ClientApp process given the number of its channel's descriptor."""


def child_environment(
    inherited: Mapping[str, str], environment: Mapping[str, str], defaults: Mapping[str, str]
) -> dict[str, str]:
    """A ClientApp process's environment: ``inherited`` with ``environment`` on top, and
    each of ``defaults`` only where ``inherited`` does not set it (a user's choice stands)."""
    return {**defaults, **inherited, **environment}


# Starting a worker here ---------------------------------------------------------

_WORKER_MAIN = "import sys; from fedcore.workers.worker import main; main(sys.argv[1])"


class WorkerProcess(Protocol):
    """A worker process as the pool handles it: a ``subprocess.Popen``, or a look-alike."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


Spawn = Callable[[socket.socket, dict[str, str], dict[str, str]], WorkerProcess]
"""Starts a worker on its end of the channel, with ``environment`` added to its own and
``defaults`` (its thread caps) where its own lacks them
(:func:`child_environment`).

Blocking: the pool calls it in a thread. :func:`spawn_local` by default; a node
whose ClientApps an exec starts passes one that asks the exec
(:func:`spawn_remote`).
"""


def worker_command(channel: int) -> list[str]:
    """The command line of a worker whose channel is file descriptor ``channel``."""
    return [sys.executable, "-c", _WORKER_MAIN, str(channel)]


def spawn_local(
    channel: socket.socket,
    environment: dict[str, str],
    defaults: dict[str, str],
    *,
    inherited: Mapping[str, str] | None = None,
    user: tuple[int, int] | None = None,
    cwd: Path | None = None,
) -> WorkerProcess:
    """Start a worker as a child of this process.

    It inherits ``inherited``: by default this process's environment but for
    fedcore's secrets (a simulation's rule, :func:`without_secrets`); a node passes
    the minimal one of a deployment's app processes. ``user`` (uid, gid) runs it as
    another user, with that primary group and no other (a node's ``--app-user``;
    this process must be root), in ``cwd``.
    """
    base = without_secrets(os.environ) if inherited is None else inherited
    uid, gid = user if user is not None else (None, None)
    return subprocess.Popen(
        worker_command(channel.fileno()),
        pass_fds=(channel.fileno(),),
        env=child_environment(base, environment, defaults),
        cwd=cwd,
        user=uid,
        group=gid,
        extra_groups=() if user is not None else None,
    )


# The node's side ------------------------------------------------------------------


class RemoteProcess:
    """A ClientApp process an exec started for this node; used as a ``subprocess.Popen``.

    A thread reads the exec's one report, the exit status, so that :meth:`wait` and
    :meth:`poll` can be called from any thread, as the pool does.
    """

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self._ended = threading.Event()
        self._reader = threading.Thread(target=self._read_exit, daemon=True)
        self._reader.start()

    def _read_exit(self) -> None:
        try:
            answer = unpack_spec(self._connection.recv(MAX_MESSAGE))
            status = answer.get("exit")
        except (OSError, DecodeError):
            status = None
        # An exec that went away took the process with it (it dies with its parent).
        self.returncode = status if isinstance(status, int) else -9
        self._ended.set()
        self._connection.close()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"ClientApp process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if not self._ended.is_set():
            with contextlib.suppress(OSError):
                self._connection.send(pack_spec({"kill": 1}))


def spawn_remote(
    path: Path,
    secret: str,
    channel: socket.socket,
    environment: Mapping[str, str],
    defaults: Mapping[str, str] = MappingProxyType({}),
    *,
    patience: float = CONNECT_PATIENCE,
) -> RemoteProcess:
    """Have the exec at ``path`` start a ClientApp process on ``channel``.

    ``environment`` goes on top of the exec's own; ``defaults`` only where the exec's
    lacks them (:func:`child_environment`).

    Blocking (call it in a thread). Keeps trying for ``patience`` seconds while
    nothing listens at ``path``; raises :class:`AppLoadError` when the exec
    refuses (a wrong secret) or never answers.
    """
    connection = _connect(path, patience)
    try:
        request = pack_spec(
            {"secret": secret, "environment": _pairs(environment), "defaults": _pairs(defaults)}
        )
        socket.send_fds(connection, [request], [channel.fileno()])
        answer = unpack_spec(connection.recv(MAX_MESSAGE))
    except (OSError, DecodeError) as exc:
        connection.close()
        raise AppLoadError(f"the exec at {path} did not start a ClientApp process: {exc}") from None
    pid = answer.get("pid")
    if not isinstance(pid, int):
        connection.close()
        raise AppLoadError(f"the exec at {path} refused: {answer.get('refused', answer)}")
    return RemoteProcess(connection, pid)


def _pairs(environment: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in environment.items()]


def _connect(path: Path, patience: float) -> socket.socket:
    deadline = time.monotonic() + patience
    pause = 0.1
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(os.fspath(path))
            return connection
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            connection.close()
            if time.monotonic() + pause > deadline:
                raise AppLoadError(
                    f"no exec answers at {path} ({exc.strerror}); is `fedcore serve --role "
                    f"exec --for-node {path}` running?"
                ) from None
            time.sleep(pause)  # a thread of the node's, not its event loop
            pause = min(2 * pause, 2.0)


# The exec's side ------------------------------------------------------------------


async def serve_spawner(
    path: Path,
    secret: str,
    command: Command,
    *,
    app_env: tuple[str, ...] = (),
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Start ClientApp processes for the nodes that ask at ``path``, until cancelled.

    The socket is made private to this user (mode 0600) and removed on the way out;
    a node must also present ``secret``. ``task_status`` is told once the socket
    listens. Leaving kills the processes started. Each process inherits the minimal
    environment of app processes and the variables named in ``app_env``.
    """
    listener = _listen(path)
    try:
        task_status.started()
        async with anyio.create_task_group() as tasks:
            while True:
                await anyio.wait_readable(listener)
                try:
                    connection, _ = listener.accept()
                except BlockingIOError:
                    continue
                tasks.start_soon(_serve_one, connection, secret, command, app_env)
    finally:
        listener.close()
        _remove(path)


def _listen(path: Path) -> socket.socket:
    """A listening socket at ``path`` (replacing a stale one), private to this user."""
    _remove(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.setblocking(False)
    previous = os.umask(0o177)
    try:
        listener.bind(os.fspath(path))
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(previous)
    listener.listen()
    return listener


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


async def _serve_one(
    connection: socket.socket, secret: str, command: Command, app_env: tuple[str, ...]
) -> None:
    """One node's request: check it, start the process, report its end, kill on demand."""
    with connection:
        connection.setblocking(False)
        await anyio.wait_readable(connection)
        try:
            data, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 1)
        except OSError:
            return
        with contextlib.ExitStack() as owned:
            for fd in fds:
                owned.callback(os.close, fd)
            try:
                process = _start(data, fds, secret, command, app_env)
            except _Refused as refused:
                log.warning("refused a node's request: %s", refused)
                with contextlib.suppress(OSError):
                    connection.send(pack_spec({"refused": str(refused)}))
                return
        log.info("started ClientApp process %d", process.pid)
        connection.send(pack_spec({"pid": process.pid}))
        try:
            status = await _watch(connection, process)
        except BaseException:  # the exec is stopping: its processes go with it
            process.kill()
            process.wait()  # at once after SIGKILL: reaped, not left a zombie
            raise
        with contextlib.suppress(OSError):
            connection.send(pack_spec({"exit": status}))


class _Refused(Exception):
    """A request the exec does not carry out; the message says why."""


def _start(
    data: bytes, fds: list[int], secret: str, command: Command, app_env: tuple[str, ...]
) -> subprocess.Popen[bytes]:
    """The process a node's request asks for; :class:`_Refused` for a bad request."""
    try:
        request = unpack_spec(data)
    except DecodeError as exc:
        raise _Refused(f"not a request: {exc}") from None
    given = request.get("secret")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), secret.encode()):
        raise _Refused("not the exec's secret")
    if len(fds) != 1:
        raise _Refused("a request names one channel")
    environment = _variables(request.get("environment"))
    defaults = _variables(request.get("defaults", []))  # a node of before thread caps: none
    (channel,) = fds
    try:
        return subprocess.Popen(
            list(command(channel)),
            pass_fds=(channel,),
            env=child_environment(app_environment(os.environ, app_env), environment, defaults),
        )
    except OSError as exc:
        raise _Refused(f"could not start the process: {exc}") from None


def _variables(pairs: object) -> dict[str, str]:
    """A request's list of ``K=V`` as a mapping; :class:`_Refused` for anything else."""
    if not isinstance(pairs, list) or not all(isinstance(p, str) and "=" in p for p in pairs):
        raise _Refused("a request's environment and defaults are lists of K=V")
    return dict(pair.split("=", 1) for pair in pairs)


async def _watch(connection: socket.socket, process: subprocess.Popen[bytes]) -> int:
    """Wait for the process to end, killing it when the node asks; its exit status."""
    async with anyio.create_task_group() as tasks:

        async def listen() -> None:
            while True:
                await anyio.wait_readable(connection)
                try:
                    message = connection.recv(MAX_MESSAGE)
                except BlockingIOError:
                    continue
                except OSError:
                    message = b""
                if not message:  # the node let go: the process ends with its channel
                    with anyio.move_on_after(LET_GO_GRACE):
                        await anyio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
                    process.kill()
                    return
                process.kill()

        tasks.start_soon(listen)
        status = await anyio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
        tasks.cancel_scope.cancel()
    log.info("ClientApp process %d ended with status %d", process.pid, status)
    return status
