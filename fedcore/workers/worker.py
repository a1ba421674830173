"""A process-pool worker: import the ClientApp once, then serve tasks until the channel closes.

The engine starts each worker as a fresh ``python`` calling :func:`main` with one end
of a socket pair as an inherited file descriptor. (Not with
``multiprocessing``: its "spawn" start re-runs the parent's main script in every
child, which would restart a simulation written at a script's top level.) The
environment — ``CUDA_VISIBLE_DEVICES`` included — is set before Python starts. The
worker reads its spec, takes the parent's ``sys.path``, imports the ClientApp,
enters its lifespan, says hello, and loops: receive a task, run the handler, send
the outcome. Async handlers run on one event loop that lives as long as the worker.

A worker never outlives the engine: on Linux it asks the kernel to kill it when
its parent dies, and everywhere it exits when its channel reaches end-of-file. It
ignores the signals that end a run (:data:`fedcore.event_loop.ENDING_SIGNALS`), which a
terminal (Ctrl-C, a hangup), ``docker stop`` or systemd may send to the whole process
group: stopping is the engine's decision — it stops its workers, then unlinks their
segments — so a Ctrl-C never litters the screen with worker tracebacks, and no worker
dies under a task that the engine would then start a replacement for.

Loading the ClientApp (:func:`load_client`) and running one task into a packed outcome
(:func:`run_task`) are what every kind of worker does; the Ray backend's actors
(:mod:`fedcore.simulation.backends.ray_tasks`) call the same two functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import logging
import mmap
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from fedcore.apps.client_app import ClientApp
from fedcore.apps.flower_imports import install_flower_imports
from fedcore.apps.loading import load_object
from fedcore.clock import Clock, SystemClock
from fedcore.domain import Context, Error, ErrorCode, Message, RecordDict
from fedcore.domain.message import mark_delivered
from fedcore.errors import AppLoadError
from fedcore.event_loop import ENDING_SIGNALS
from fedcore.non_dumpable import make_non_dumpable
from fedcore.wire import DecodeLimits, Parts, parts_size, unpack_recorddict
from fedcore.wire.records import check_value_sizes
from fedcore.wire.worker import (
    HELLO,
    pack_failure,
    pack_outcome,
    pack_pointer,
    pointer_target,
    release_target,
    unpack_spec,
    unpack_task,
)
from fedcore.workers.shared_memory import SegmentSpace, map_segment, write_segment

WORKER_ENV = "FEDCORE_WORKER"
"""Set in every worker's environment; a simulation refuses to start where it is set."""
MAIN_ALIAS = "__fedcore_main__"
"""The name a worker imports the parent's ``__main__`` script under, so that code
guarded by ``if __name__ == "__main__":`` does not run again."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to start; the first thing it receives."""

    index: int
    client_ref: str
    search_path: str
    segment_root: str
    segment_prefix: str
    inline_limit: int
    max_value_len: int
    sys_path: list[str] = field(default_factory=list)
    main_file: str = ""
    private_memory: bool = False
    """Make the worker non-dumpable before the ClientApp is imported (a deployed node's)."""

    @classmethod
    def here(
        cls,
        *,
        index: int,
        client_ref: str,
        search_path: str,
        segment_root: str,
        segment_prefix: str,
        inline_limit: int,
        max_value_len: int,
        private_memory: bool = False,
    ) -> WorkerSpec:
        """A spec carrying this process's ``sys.path`` and main script."""
        main = sys.modules.get("__main__")
        return cls(
            index=index,
            client_ref=client_ref,
            search_path=search_path,
            segment_root=segment_root,
            segment_prefix=segment_prefix,
            inline_limit=inline_limit,
            max_value_len=max_value_len,
            sys_path=[os.path.abspath(p) if p else os.getcwd() for p in sys.path],
            main_file=str(getattr(main, "__file__", "") or ""),
            private_memory=private_memory,
        )

    def as_dict(self) -> dict[str, str | int | list[str]]:
        return {**asdict(self), "private_memory": int(self.private_memory)}  # a spec has no bools


def serve(connection: Connection) -> None:
    """The worker's main function, once its channel is open."""
    _die_with_parent()
    for signum in ENDING_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    spec = WorkerSpec(**unpack_spec(connection.recv_bytes()))
    if spec.private_memory:
        make_non_dumpable()
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s worker {spec.index} %(levelname)s %(message)s"
    )
    adopt_sys_path(spec.sys_path)
    try:
        client = load_client(spec.client_ref, Path(spec.search_path), spec.main_file)
        lifespan = client.started()
        lifespan.__enter__()
    except Exception as exc:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the run ended
            connection.send_bytes(pack_failure(load_failure(exc)))
        return
    space = SegmentSpace(Path(spec.segment_root), spec.segment_prefix)
    limits = DecodeLimits(max_value_len=spec.max_value_len)
    server = _Server(client, space, spec.inline_limit, limits)
    try:
        server.serve(connection)
    finally:
        server.close()
        lifespan.__exit__(*sys.exc_info())


def adopt_sys_path(parent: list[str]) -> None:
    """Put the engine's ``sys.path`` in front of this process's own, each entry once."""
    sys.path[:] = [*parent, *(p for p in sys.path if p not in parent)]


def load_client(client_ref: str, search_path: Path, main_file: str) -> ClientApp:
    """Import the ClientApp ``client_ref`` names, as the engine's process found it.

    ``__main__:attr`` is an attribute of the engine's main script, ``main_file``: it is
    imported under :data:`MAIN_ALIAS`, so its ``if __name__ == "__main__":`` part does
    not run again here.
    """
    ref = client_ref
    if ref.startswith("__main__:"):
        install_flower_imports()  # load_object installs it for the others
        module_spec = importlib.util.spec_from_file_location(MAIN_ALIAS, main_file)
        if module_spec is None or module_spec.loader is None:
            raise AppLoadError(f"cannot import the main script {main_file!r} in a worker")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[MAIN_ALIAS] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise AppLoadError(
                f"cannot load ClientApp {ref!r}: {type(exc).__name__}: {exc}"
            ) from exc
        ref = MAIN_ALIAS + ref.removeprefix("__main__")
    client = load_object(ref, search_path, ClientApp, "ClientApp")
    assert isinstance(client, ClientApp)
    return client


def load_failure(exc: Exception) -> str:
    """The one line a worker sends back when loading its ClientApp (or its lifespan) failed."""
    if isinstance(exc, AppLoadError):
        return str(exc)
    return f"the ClientApp's lifespan raised {type(exc).__name__}: {exc}"


def run_task(
    client: ClientApp,
    message: Message,
    context: Context,
    run_until_complete: Callable[[Awaitable[Message]], Message],
    clock: Clock,
    limits: DecodeLimits,
) -> Parts:
    """Run ``client`` on ``message`` and pack the outcome: the reply and the node's state.

    A reply that cannot be encoded (a record holding what no wire can carry), or that
    the engine would refuse to decode (a value over ``limits.max_value_len``), becomes
    an error reply (code 2) rather than a worker that dies on it.
    """
    mark_delivered(message, clock.now())
    reply = client.handle_blocking(message, context, run_until_complete)
    try:
        if reply.has_content():
            check_value_sizes(reply.content, limits.max_value_len)
        check_value_sizes(context.state, limits.max_value_len)
        return pack_outcome(reply, context.state)
    except (TypeError, ValueError) as exc:
        reason = f"the reply could not be sent: {exc}"
        failed = Error(int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION), reason)
        return pack_outcome(Message(error=failed, reply_to=message), context.state)


class _Server:
    """A worker's state between tasks: its ClientApp, event loop and segments.

    Message contents arrive in segments the engine wrote: a round's content is one
    segment shared by all its tasks, so the last few are kept mapped rather than
    mapped again for every task (until the engine unlinks them). Large outcomes go
    out in segments this worker owns: once the engine has let go of one (a
    release), the next outcome is written over it, into pages already allocated.
    """

    KEEP_CONTENTS = 2

    def __init__(
        self, client: ClientApp, space: SegmentSpace, inline_limit: int, limits: DecodeLimits
    ) -> None:
        self.client = client
        self.limits = limits
        self.space = space
        self.inline_limit = inline_limit
        self.loop = asyncio.new_event_loop()
        self.clock = SystemClock()
        self._contents: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._free: list[str] = []

    def serve(self, connection: Connection) -> None:
        """Serve tasks until the engine closes the channel.

        The engine closes it when the run ends, whatever this worker is doing (saying
        hello, as a replacement; running a task, whose outcome then has no reader): a
        closed channel ends the worker quietly, however it shows — end-of-file, a
        broken pipe, or a reset when the engine closed it with an outcome unread.
        """
        try:
            connection.send_bytes(HELLO)
            while True:
                data = connection.recv_bytes()
                released = release_target(data)
                if released is not None:
                    if released.startswith(self.space.prefix):
                        self._free.append(released)
                    continue
                connection.send_bytes(self._work(data))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return  # the ClientApp's own errors never get here: they are error replies

    def close(self) -> None:
        self.loop.close()
        self._contents.clear()

    def _work(self, data: bytes) -> bytes:
        """Run one task; return what to send back (the outcome, or a pointer to it)."""
        segment = pointer_target(data)
        if segment is None:
            payload: bytes | memoryview = data
        else:
            payload = memoryview(map_segment(self.space.root / segment, take=True))
        message, context = unpack_task(payload, self._content, self.limits)
        parts = run_task(
            self.client, message, context, self.loop.run_until_complete, self.clock, self.limits
        )
        if parts_size(parts) <= self.inline_limit:
            return b"".join(parts)
        name = self._free.pop() if self._free else self.space.new_name()
        write_segment(self.space.root / name, parts, reuse=True)
        return pack_pointer(name)

    def _content(self, name: str) -> RecordDict:
        # A kept segment whose name is gone was let go of by the engine (its content was
        # collected): no task names it again, so its pages need not wait for two more.
        for kept in [kept for kept in self._contents if kept != name]:
            if not (self.space.root / kept).exists():
                del self._contents[kept]
        mapped = self._contents.pop(name, None)
        if mapped is None:
            mapped = map_segment(self.space.root / name, take=False)
        self._contents[name] = mapped
        while len(self._contents) > self.KEEP_CONTENTS:
            self._contents.popitem(last=False)
        return unpack_recorddict(memoryview(mapped), self.limits)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (elsewhere: rely on EOF)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def main(descriptor: str) -> None:
    """The entry point of ``python -c``: serve on the inherited socket ``descriptor``."""
    serve(Connection(int(descriptor)))
