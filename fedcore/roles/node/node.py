"""The node role: a long-lived process that serves its link's messages with the runs' ClientApps.

Theory of operation. A :class:`Node` is an async context manager; while its body
runs, the node works in the background:

1. **Register** with the link (``register_node``), retrying with backoff while the
   link is unavailable. The link's answer is the node's id.
2. **Heartbeat** every ``heartbeat_interval`` (on the clock's cadence, not after
   each other), naming the messages in flight so that the link renews their leases
   for ``lease`` seconds: a ClientApp may work for longer than any lease. Ids the
   link answers as released are abandoned (:mod:`.work`).
3. **Pull** with a long wait (``wait_seconds``: the link answers as soon as a
   message arrives) for as many messages as there are free slots
   (``max_concurrent``). Each message runs in a task of its own: its content is
   fetched if it came as a payload (:mod:`.payloads`), its run handles it
   (:mod:`.runs`: bundle, runner, Context), and its reply is pushed until the link
   holds it or refuses it for good (:mod:`.replies`).
4. Every heartbeat interval, ask the link about each run the node holds a ClientApp
   runner for, and end those that finished (:meth:`.runs.RunCache.end_finished`):
   a finished run's ClientApp process goes at once, not an idle timeout later.
5. A heartbeat or pull answered with ``NodeNotFoundError`` means the link forgot
   the node (deleted, or restarted without its database): the node abandons the
   work of its old id, registers again and carries on under the new one, with no
   operator involved. Every other call retries only ``LinkUnavailableError`` (the
   link away, or its ``LinkBusyError``: too many requests, a rate to wait out); the
   link's other answers are final for that call, and a message that gets one is
   logged and dropped (its lease runs out and the link delivers it again or
   answers it).

Leaving the body stops the node: it stops pulling, waits up to ``drain_timeout``
for the messages in flight (heartbeats still renew their leases meanwhile),
abandons what is left, unregisters (best effort, within ``drain_timeout``) and stops
the runs' runners. That shutdown runs shielded, so a cancelled body still leaves
the link told and no ClientApp process behind.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Self

import anyio
import anyio.abc

from fedcore.backoff import DEFAULT_BACKOFF, BackoffPolicy
from fedcore.clock import Clock
from fedcore.domain import Error, ErrorCode, Message, UserConfigValue
from fedcore.domain.fleet import LeasedMessage, PulledMessages
from fedcore.errors import (
    FedcoreError,
    LinkUnavailableError,
    NodeNotFoundError,
    ResourceError,
    RunFinishedError,
    ValueOverCapError,
)
from fedcore.roles.node.payloads import MemoryPayloads, PayloadStore, with_payload
from fedcore.roles.node.replies import OutgoingReply
from fedcore.roles.node.retry import Retrier, asked_wait
from fedcore.roles.node.runner import RunnerFactory
from fedcore.roles.node.runs import RunCache
from fedcore.roles.node.work import InFlight
from fedcore.transport.fleet import FleetService
from fedcore.wire import MAX_VALUE_LEN, DecodeLimits

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 10.0
"""Seconds between heartbeats, by default."""
LEASE_HEARTBEATS = 3
"""A lease lasts this many heartbeat intervals by default: one lost heartbeat does not end it."""
PULL_WAIT = 30.0
"""Seconds a pull waits for a message, by default, before asking again."""
IDLE_TIMEOUT = 600.0
"""Seconds without a message after which a run's ClientApp runner is stopped, by default."""
DRAIN_TIMEOUT = 5.0
"""Seconds a stopping node gives its messages in flight, and then its unregistration."""


class Node:
    """A node of the federation, serving its link's messages while its ``async with`` body runs.

    - ``fleet``: the link's fleet API, already entered by the caller (a
      :class:`~fedcore.transport.grpc.GrpcFleetClient` in deployment).
    - ``node_config``: sent when registering, and each Context's ``node_config``.
    - ``cache_dir``: where app bundles are unpacked, one directory per bundle hash.
    - ``runner_factory``: builds each run's ClientApp runner (:mod:`.runner`).
    - ``clock``: all waiting and timing.
    - ``heartbeat_interval``: seconds between heartbeats; the link marks the node
      offline after its patience × this.
    - ``lease``: seconds each pull and heartbeat leases the messages in flight for
      (default 3 × ``heartbeat_interval``; must be longer than it).
    - ``wait_seconds``: how long one pull waits for a message.
    - ``max_concurrent``: messages handled at once. They must be of different runs
      to run at once: a run's messages go one at a time, to keep its state whole.
    - ``idle_timeout``: a run without messages for this long has its runner stopped.
    - ``drain_timeout``: on stopping, the wait for messages in flight, and then for
      unregistering.
    - ``backoff`` and ``seed``: how retries space out while the link is away, and
      the seed of their jitter.
    - ``heartbeat_fleet``: the fleet API heartbeats go through, if not ``fleet``:
      in deployment a connection of their own, so that a heartbeat never queues
      behind the megabytes of a payload on the same connection.
    - ``payload_store``: where pulled payloads land and are decoded (default: the
      node's own memory); in deployment, shared memory the ClientApp process maps.
    - ``max_value_len``: the most bytes one str or bytes value of a record may take in
      a pulled payload (``--max-value-bytes``); a message holding a longer one is
      answered with an error reply.

    :meth:`wait_registered` returns the node's id once it has one. A node runs once.
    """

    def __init__(
        self,
        fleet: FleetService,
        *,
        node_config: Mapping[str, UserConfigValue],
        cache_dir: Path,
        runner_factory: RunnerFactory,
        clock: Clock,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        lease: float | None = None,
        wait_seconds: float = PULL_WAIT,
        max_concurrent: int = 1,
        idle_timeout: float = IDLE_TIMEOUT,
        drain_timeout: float = DRAIN_TIMEOUT,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        seed: int | None = None,
        heartbeat_fleet: FleetService | None = None,
        payload_store: PayloadStore | None = None,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> None:
        lease = LEASE_HEARTBEATS * heartbeat_interval if lease is None else lease
        for name, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("lease", lease),
            ("wait_seconds", wait_seconds),
            ("idle_timeout", idle_timeout),
            ("drain_timeout", drain_timeout),
        ):
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if lease <= heartbeat_interval:
            raise ValueError(
                f"lease ({lease} s) must be longer than heartbeat_interval "
                f"({heartbeat_interval} s), or leases run out between heartbeats"
            )
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._fleet = fleet
        self._heartbeat_fleet = heartbeat_fleet or fleet
        self._payloads = payload_store or MemoryPayloads()
        self._limits = DecodeLimits(max_value_len=max_value_len)
        self._node_config = dict(node_config)
        self._clock = clock
        self._heartbeat_interval = heartbeat_interval
        self._lease = lease
        self._wait_seconds = wait_seconds
        self._idle_timeout = idle_timeout
        self._drain_timeout = drain_timeout
        self._retry = Retrier(clock, backoff, seed)
        self._inflight = InFlight(max_concurrent)
        self._runs = RunCache(
            fleet,
            node_config=node_config,
            cache_dir=cache_dir,
            runner_factory=runner_factory,
            clock=clock,
            retry=self._retry,
            idle_timeout=idle_timeout,
        )
        self._node_id: int | None = None
        self._registered = anyio.Event()
        self._stopping = False
        self._waiting: anyio.CancelScope | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        if self._task_group is not None or self._stopping:
            raise RuntimeError("a Node runs once")
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._lifetime, name="fedcore node")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        self._stop()
        try:
            await self._task_group.__aexit__(None, None, None)
        except BaseExceptionGroup as group:  # the node failed: raise its one error as it is
            error: BaseException = group
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]
            raise error from None

    async def wait_registered(self) -> int:
        """The node's id, once it registered (after registering again, the new one)."""
        await self._registered.wait()
        assert self._node_id is not None
        return self._node_id

    # The lifetime -------------------------------------------------------------------

    async def _lifetime(self) -> None:
        """Serve until stopped, then shut down in order; shielded, so shutdown completes."""
        with anyio.CancelScope(shield=True):
            async with self._runs:
                async with anyio.create_task_group() as work:
                    node_id = await self._serve(work)
                    if self._inflight:
                        log.warning(
                            "stopping with %d messages unfinished; the link will deliver "
                            "them again or answer them",
                            len(self._inflight),
                        )
                    work.cancel_scope.cancel()
                if node_id is not None:
                    await self._unregister(node_id)

    async def _serve(self, work: anyio.abc.TaskGroup) -> int | None:
        """Register and serve, again each time the link forgets the node; the last id at stop."""
        while True:
            node_id: int | None = None
            with self._interruptible():
                node_id = await self._register()
            if node_id is None:
                return None
            try:
                await self._session(node_id, work)
                return node_id
            except* NodeNotFoundError:
                log.warning(
                    "the link does not know node %d any more (deleted, or restarted without "
                    "its database): dropping its work and registering again",
                    node_id,
                )
                self._inflight.abandon(self._inflight.ids())

    async def _register(self) -> int:
        node_id = await self._retry(
            lambda: self._fleet.register_node(self._node_config, self._heartbeat_interval)
        )
        self._node_id = node_id
        self._registered.set()
        log.info("registered with the link as node %d", node_id)
        return node_id

    async def _session(self, node_id: int, work: anyio.abc.TaskGroup) -> None:
        """Heartbeat and pull as ``node_id`` until stopped, then let the work in flight drain."""
        async with anyio.create_task_group() as session:
            session.start_soon(self._heartbeats, node_id)
            session.start_soon(self._sweeps, node_id)
            session.start_soon(self._end_finished_runs, node_id)
            with self._interruptible():
                await self._pull(node_id, work)
            if self._inflight:
                log.info(
                    "stopping: waiting up to %g s for %d messages in flight",
                    self._drain_timeout,
                    len(self._inflight),
                )
            with self._clock.move_on_after(self._drain_timeout):
                await self._inflight.wait_empty()
            session.cancel_scope.cancel()

    async def _unregister(self, node_id: int) -> None:
        with self._clock.move_on_after(self._drain_timeout) as deadline:
            try:
                await self._fleet.unregister_node(node_id)
            except FedcoreError as exc:
                log.warning("node %d could not unregister: %s", node_id, exc)
                return
        if deadline.cancelled_caught:
            log.warning("node %d could not unregister: the link did not answer", node_id)
            return
        log.info("unregistered node %d", node_id)

    # The loops ----------------------------------------------------------------------

    async def _heartbeats(self, node_id: int) -> NoReturn:
        """Beat every interval on the clock's cadence; abandon the messages the link released."""
        next_beat = self._clock.now()
        while True:
            next_beat = max(next_beat + self._heartbeat_interval, self._clock.now())
            await self._clock.sleep(next_beat - self._clock.now())
            working = self._inflight.ids()
            lease = self._lease if working else None
            try:
                with self._clock.move_on_after(self._heartbeat_interval) as deadline:
                    released = await self._heartbeat_fleet.heartbeat(
                        node_id, self._heartbeat_interval, working, lease
                    )
                if deadline.cancelled_caught:
                    raise LinkUnavailableError("the link did not answer a heartbeat in time")
            except LinkUnavailableError as exc:
                self._retry.unavailable(exc)
                continue
            self._retry.available()
            for message_id in self._inflight.abandon(released):
                log.info(
                    "message %s: the link released its lease (expired, answered, or its run "
                    "finished); abandoning it",
                    message_id,
                )

    async def _pull(self, node_id: int, work: anyio.abc.TaskGroup) -> NoReturn:
        """Pull for the free slots and start a task per message; back off while the link is away."""
        backoff = self._retry.backoff()
        while True:
            await self._inflight.wait_for_room()
            try:
                pulled = await self._pull_once(node_id)
            except LinkUnavailableError as exc:
                self._retry.unavailable(exc)
                await backoff.wait(asked_wait(exc))
                continue
            self._retry.available()
            backoff.reset()
            for leased in pulled.messages:
                message_id = leased.message.metadata.message_id
                if message_id in self._inflight:  # delivered again: its lease is renewed anyway
                    continue
                scope = self._inflight.add(message_id)
                work.start_soon(self._work, node_id, leased, scope, name=f"message {message_id}")

    async def _pull_once(self, node_id: int) -> PulledMessages:
        with self._clock.move_on_after(self._wait_seconds + self._heartbeat_interval):
            return await self._fleet.pull_messages(
                node_id,
                limit=self._inflight.free,
                lease_seconds=self._lease,
                wait_seconds=self._wait_seconds,
            )
        raise LinkUnavailableError("the link did not answer a pull in time")

    async def _sweeps(self, node_id: int) -> NoReturn:
        """Every half idle timeout, stop the runners of idle runs and forget finished runs."""
        while True:
            await self._clock.sleep(self._idle_timeout / 2)
            await self._runs.sweep(node_id)

    async def _end_finished_runs(self, node_id: int) -> NoReturn:
        """Every heartbeat interval, end the runners of the runs the link says finished."""
        while True:
            await self._clock.sleep(self._heartbeat_interval)
            await self._runs.end_finished(node_id)  # a link away: asked again next time

    # One message --------------------------------------------------------------------

    async def _work(self, node_id: int, leased: LeasedMessage, scope: anyio.CancelScope) -> None:
        """Fetch, run and reply to one message; a final refusal on the way drops it."""
        message = leased.message
        message_id, run_id = message.metadata.message_id, message.metadata.run_id
        try:
            with scope:
                reply = await self._answer(node_id, leased)
                pushed = await OutgoingReply(reply).push(self._fleet, node_id, self._retry)
                log.debug(
                    "message %s: reply stored%s",
                    message_id,
                    " (again: a retry)" if pushed.duplicate else "",
                )
        except RunFinishedError:
            log.info("message %s: run %d has finished; dropping it", message_id, run_id)
            await self._runs.forget(run_id)
        except FedcoreError as exc:
            log.warning("message %s of run %d dropped: %s", message_id, run_id, exc)
        except Exception:  # a bug on one message must not stop the node serving the others
            log.exception("message %s of run %d dropped: unexpected error", message_id, run_id)
        finally:
            self._inflight.remove(message_id, scope)

    async def _answer(self, node_id: int, leased: LeasedMessage) -> Message:
        """The reply to a leased message: its ClientApp's, or an error if it cannot be held.

        A content that does not fit here (shared memory full), or that this node
        refuses to decode (a value over its cap), would not fit the next time the
        link hands it out either: the ServerApp hears so in its round rather than at
        the message's TTL, hours later.
        """
        message, ref = leased.message, leased.payload
        if ref is not None:
            try:
                message = await self._retry(
                    lambda: with_payload(
                        self._fleet, node_id, leased.message, ref, self._payloads, self._limits
                    )
                )
            except (ResourceError, ValueOverCapError) as exc:
                log.error("message %s: %s", message.metadata.message_id, exc)
                reason = f"the node cannot hold the message's content: {exc}"
                return Message(error=Error(ErrorCode.UNKNOWN, reason), reply_to=message)
        return await self._runs.handle(node_id, message)

    # Stopping -----------------------------------------------------------------------

    def _interruptible(self) -> anyio.CancelScope:
        """A scope for waiting on the link (registering, pulling) that stopping cancels."""
        scope = self._waiting = anyio.CancelScope()
        if self._stopping:
            scope.cancel()
        return scope

    def _stop(self) -> None:
        self._stopping = True
        if self._waiting is not None:
            self._waiting.cancel()
