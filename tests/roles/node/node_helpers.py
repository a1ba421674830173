"""What the node role's tests share: a fleet that fails on demand, app bundles, inline runners."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import numpy as np

from fedcore.apps.bundle import Bundle, pack_bundle
from fedcore.apps.client_app import ClientApp
from fedcore.clock import Clock
from fedcore.domain import Context, Message, RecordDict, Run, RunStatus, UserConfigValue
from fedcore.domain.fleet import Digest, PayloadRef, PulledMessages, PushedReply
from fedcore.errors import AppLoadError, LinkBusyError, LinkUnavailableError
from fedcore.roles.node import Node
from fedcore.simulation.backends.inline import InlineBackend
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet
from fedcore.transport.fleet import Buffer, FleetService, Transfer
from fedcore.wire import unpack_recorddict

NODE_CONFIG = {"partition-id": 3, "num-partitions": 4}


class FlakyFleet(FleetService):
    """A FakeFleet behind a link that fails when told, and that records what the node asked.

    ``down[method] = n``: the next n calls fail with LinkUnavailableError before
    reaching the fleet. ``lose[method] = n``: the next n calls reach it, and then
    their answer is lost (LinkUnavailableError). ``offline``: every call fails.
    ``rate_limited``: every call is refused as over the link's rate (LinkBusyError).
    ``refuse[method]``: the next call raises that error instead.
    """

    def __init__(self, fake: FakeFleet) -> None:
        self.fake = fake
        self.calls: Counter[str] = Counter()
        self.down: Counter[str] = Counter()
        self.lose: Counter[str] = Counter()
        self.refuse: dict[str, Exception] = {}
        self.offline = False
        self.rate_limited = False
        self.heartbeats: list[tuple[float, tuple[str, ...], float | None]] = []
        self.pushed: list[Message] = []
        self.pull_limits: list[int] = []
        self.tamper_bundle = False
        self.forget_payload_once = False

    def _call(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.refuse:
            raise self.refuse.pop(method)
        if self.rate_limited:
            raise LinkBusyError(f"the link refused the call (RESOURCE_EXHAUSTED): {method}")
        if self.offline or self.down[method] > 0:
            self.down[method] = max(self.down[method] - 1, 0)
            raise LinkUnavailableError(f"the link is unavailable ({method})")

    def _answer(self, method: str) -> None:
        if self.lose[method] > 0:
            self.lose[method] -= 1
            raise LinkUnavailableError(f"the answer to {method} was lost")

    async def register_node(
        self,
        node_config: Mapping[str, UserConfigValue],
        heartbeat_interval: float,
        public_key: bytes | None = None,
    ) -> int:
        self._call("register_node")
        node_id = await self.fake.register_node(node_config, heartbeat_interval, public_key)
        self._answer("register_node")
        return node_id

    async def unregister_node(self, node_id: int) -> None:
        self._call("unregister_node")
        await self.fake.unregister_node(node_id)

    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        self._call("heartbeat")
        self.heartbeats.append((self.fake.clock.now(), tuple(working_message_ids), lease_seconds))
        return await self.fake.heartbeat(
            node_id, heartbeat_interval, working_message_ids, lease_seconds
        )

    async def pull_messages(
        self,
        node_id: int,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> PulledMessages:
        self._call("pull_messages")
        self.pull_limits.append(limit)
        return await self.fake.pull_messages(node_id, limit, lease_seconds, wait_seconds)

    async def push_reply(
        self, node_id: int, reply: Message, payload: PayloadRef | None = None
    ) -> PushedReply:
        self._call("push_reply")
        self.pushed.append(reply)
        if payload is not None and self.forget_payload_once:
            self.forget_payload_once = False
            del self.fake.payloads[payload.payload_id]  # as a link restarted since the push
        pushed = await self.fake.push_reply(node_id, reply, payload)
        self._answer("push_reply")
        return pushed

    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        self._call("get_run")
        return await self.fake.get_run(node_id, run_id)

    @asynccontextmanager
    async def get_bundle(self, node_id: int, run_id: int) -> AsyncIterator[Transfer]:
        self._call("get_bundle")
        async with self.fake.get_bundle(node_id, run_id) as transfer:
            if not self.tamper_bundle:
                yield transfer
                return
            data = bytearray(b"".join([bytes(chunk) async for chunk in transfer.chunks]))
            data[len(data) // 2] ^= 0xFF
            yield Transfer(transfer.digest, _one(bytes(data)))

    async def push_payload(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: Any,
    ) -> str:
        self._call("push_payload")
        return await self.fake.push_payload(node_id, message_id, digest, chunks)

    def pull_payload(self, node_id: int, payload_id: str) -> AbstractAsyncContextManager[Transfer]:
        self._call("pull_payload")
        return self.fake.pull_payload(node_id, payload_id)


async def _one(data: Buffer) -> AsyncIterator[Buffer]:
    yield data


def make_bundle(root: Path, name: str, client_ref: str = "app:client") -> Bundle:
    """An app directory named ``name`` whose pyproject names ``client_ref``, packed.

    Packing refuses a ``client_ref`` that is not ``module:attr``; such a bundle (made by
    something other than fedcore's packer) is written into the zip after packing.
    """
    app_dir = root / name
    app_dir.mkdir()
    pyproject = f'[tool.fedcore.app]\nserver = "app:server"\nclient = "{client_ref}"\n'
    (app_dir / "pyproject.toml").write_text(pyproject.replace(client_ref, "app:client"))
    (app_dir / "app.py").write_text(f"# the app of {name}\n")
    bundle = pack_bundle(app_dir)
    if client_ref == "app:client":
        return bundle
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(bundle.data)) as packed,
        zipfile.ZipFile(buffer, "w") as rewritten,
    ):
        for info in packed.infolist():
            data = packed.read(info)
            rewritten.writestr(info, pyproject if info.filename == "pyproject.toml" else data)
    data = buffer.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), bundle.files)


class Runners:
    """A runner factory over ClientApps by reference, run inline; records starts and stops."""

    def __init__(self, clients: Mapping[str, ClientApp]) -> None:
        self.clients = dict(clients)
        self.clock: Clock | None = None  # the node's, set by node(): TTLs run on it
        self.started: list[tuple[int, Path, str]] = []
        self.stopped: list[int] = []

    def __call__(self, run: Run, app_dir: Path, client_ref: str) -> InlineRunner:
        return InlineRunner(self, run, app_dir, client_ref)

    @property
    def open(self) -> int:
        return len(self.started) - len(self.stopped)


class InlineRunner:
    def __init__(self, runners: Runners, run: Run, app_dir: Path, client_ref: str) -> None:
        self._runners, self._run, self._app_dir, self._ref = runners, run, app_dir, client_ref
        self._backend: InlineBackend | None = None

    async def __aenter__(self) -> InlineRunner:
        if not (self._app_dir / "pyproject.toml").is_file():
            raise AppLoadError(f"{self._app_dir} is not an unpacked app")
        client = self._runners.clients.get(self._ref)
        if client is None:
            raise AppLoadError(f"cannot load ClientApp {self._ref!r}")
        self._backend = InlineBackend(client, clock=self._runners.clock)
        await self._backend.__aenter__()
        self._runners.started.append((self._run.run_id, self._app_dir, self._ref))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._backend is not None
        await self._backend.__aexit__(exc_type, exc, tb)
        self._runners.stopped.append(self._run.run_id)

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        assert self._backend is not None
        return await self._backend.run(message, context)


def add_run(fake: FakeFleet, run_id: int, bundle: Bundle, **run_config: Any) -> Run:
    run = Run(run_id, dict(run_config), RunStatus.RUNNING)
    fake.add_run(run, bundle.data)
    return run


def train(node_id: int, content: RecordDict | None = None, *, ttl: float | None = None) -> Message:
    return Message(content or RecordDict(), node_id, "train", ttl=ttl)


async def settle() -> None:
    """Let every task run until it waits (for the clock, the fleet, or a test's event)."""
    await anyio.wait_all_tasks_blocked()


async def until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Return once ``predicate()`` holds; fail the test if it takes ``timeout`` real seconds.

    Work done in threads (unpacking a bundle, a ClientApp's lifespan) is what this
    waits for; everything on the loop is done after one :func:`settle`.
    """
    with anyio.fail_after(timeout):
        while not predicate():
            await settle()
            await anyio.lowlevel.checkpoint()


async def advance(clock: FakeClock, seconds: float, *, step: float = 0.25) -> None:
    """Move the clock in steps, letting every task react between them."""
    await settle()
    remaining = seconds
    while remaining > 1e-9:
        clock.advance(min(step, remaining))
        remaining -= step
        await settle()


def node(
    fleet: FleetService,
    clock: FakeClock,
    cache_dir: Path,
    runners: Callable[[Run, Path, str], InlineRunner],
    **options: Any,
) -> Node:
    """A Node with short intervals (heartbeat 1 s, lease 3 s), tunable by ``options``."""
    settings: dict[str, Any] = {
        "heartbeat_interval": 1.0,
        "lease": 3.0,
        "wait_seconds": 30.0,
        "drain_timeout": 2.0,
        "seed": 0,
    }
    settings.update(options)
    if isinstance(runners, Runners) and runners.clock is None:
        runners.clock = clock
    return Node(
        fleet,
        node_config=NODE_CONFIG,
        cache_dir=cache_dir,
        runner_factory=runners,
        clock=clock,
        **settings,
    )


def stored(fake: FakeFleet, message_ids: Iterable[str]) -> list[Message]:
    """The replies the fleet stored for ``message_ids``, in that order."""
    return [fake.replies[message_id].reply for message_id in message_ids]


def stored_weights(fake: FakeFleet, message_id: str) -> np.ndarray:
    """The array ``w`` of the reply stored for ``message_id``, which came as a payload."""
    payload = fake.replies[message_id].payload
    assert payload is not None, "the reply's content did not travel as a payload"
    data = b"".join(bytes(part) for part in fake.payloads[payload.payload_id].parts)
    weights: np.ndarray = unpack_recorddict(data)["arrays"]["w"]
    return weights
