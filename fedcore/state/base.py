"""LinkState: everything the link knows — nodes, runs, messages and their replies.

One interface in three parts, each checked by its conformance suite in
``fedcore.testing``: :class:`MessageState` (nodes, messages, replies; ``linkstate``),
:class:`RunState` (runs, claims, bundles, contexts, logs; ``runstate``) and
:class:`RecordState` (metrics, artifacts; ``recordstate``). Two stores implement it
(``memory.py`` for simulation and tests, ``sqlite.py`` for deployment); they keep and
schedule, and one set of rules decides (:mod:`fedcore.state.ledger`). The promises are
R1–R6 of docs/reliability.md. Every method is async, so that a store may do I/O off the
event loop; notifications (``watch_*``) are synchronous callbacks
(:mod:`fedcore.state.notify`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from fedcore.defaults import HEARTBEAT_PATIENCE
from fedcore.domain import LogLine, Message, MetricsLine, RecordDict, Run, RunStatus
from fedcore.state.notify import Subscription

DEFAULT_HEARTBEAT_PATIENCE = HEARTBEAT_PATIENCE
"""A node is offline once ``patience × heartbeat_interval`` passes without a heartbeat.

The same patience applies to a running run's ServerApp and its ``heartbeat_run``.
Three beats, not two: on a loaded machine one late heartbeat is ordinary."""


@dataclass(frozen=True, slots=True)
class RunClaim:
    """An exec's exclusive right to launch a run, until ``expires_at`` unless renewed.

    ``token`` is the fencing token: strictly greater than every token handed out
    before by this state, and checked by every call the claimant makes for the run
    (``renew_claim``, ``start_run``, ``update_run_status``), which raise
    :class:`~fedcore.errors.ClaimLostError` once a newer claim exists or the run moved
    on. ``secret`` is the launch secret the ServerApp process presents to the
    runtime API (:meth:`LinkState.check_run_secret`); the state keeps only its hash.
    ``attempt`` counts the claims of this run, from 1.
    """

    run: Run
    token: int
    secret: str
    attempt: int
    expires_at: float


class MessageState(ABC):
    """Nodes, messages and replies: what the fleet and the Grid use.

    Its contract is the suite :mod:`fedcore.testing.linkstate`.
    """

    # Nodes -------------------------------------------------------------------------

    @abstractmethod
    async def create_nodes(self, count: int, *, heartbeat_interval: float) -> list[int]:
        """Register ``count`` nodes, online now, and return their new ids.

        ``heartbeat_interval`` is how often each node promises to heartbeat;
        ``math.inf`` registers nodes that never go offline (simulation). A negative
        ``count`` or an interval that is not positive raises ``ValueError``.
        """

    async def create_node(self, *, heartbeat_interval: float) -> int:
        """Register one node and return its id."""
        (node_id,) = await self.create_nodes(1, heartbeat_interval=heartbeat_interval)
        return node_id

    @abstractmethod
    async def register_node(self, public_key: bytes, *, heartbeat_interval: float) -> int:
        """The node of ``public_key``, online from now: the id of the node registered with
        that key, or of a new one bound to it.

        A node's key is bound for its life; deleting the node frees the key. Registering
        again with a key is a heartbeat with the new interval, so a node whose first
        registration answer was lost gets the same id back, not a second node.
        """

    @abstractmethod
    async def node_with_key(self, public_key: bytes) -> int:
        """The id of the node registered with ``public_key``; ``NodeNotFoundError`` if none."""

    @abstractmethod
    async def delete_node(self, node_id: int) -> None:
        """Remove a node; its unanswered messages get ``NODE_UNAVAILABLE`` replies."""

    @abstractmethod
    async def retire_nodes(self, *, offline_for: float) -> list[int]:
        """Delete the nodes registered with a key that have been offline for at least
        ``offline_for`` seconds (since their last heartbeat's deadline); their ids.

        Under trust on first use any key registers, and a registration nobody will ever
        use again would otherwise be kept for ever. A retired node's key is free: the
        node, if it comes back, registers again (as a new node). Nodes created without a
        key (simulation) are never retired. A bad ``offline_for``, ``ValueError``.
        """

    @abstractmethod
    async def heartbeat(self, node_id: int, *, heartbeat_interval: float) -> None:
        """Mark a node alive for another ``patience × heartbeat_interval`` seconds.

        Revives a node that went offline (its messages stay answered). An unknown or
        deleted node raises ``NodeNotFoundError``; a bad interval, ``ValueError``.
        """

    @abstractmethod
    async def get_node_ids(self) -> list[int]:
        """The ids of the nodes online now, in registration order."""

    # The ServerApp's side ------------------------------------------------------------

    @abstractmethod
    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        """Store messages for their nodes; stamp and return their ids.

        Each message gets ``run_id``, ``src_node_id`` (the server) and ``created_at``
        written into its metadata, and a fresh ``message_id`` unless it comes with
        one: a ServerApp across the network names its messages itself (32 lowercase
        hex digits, :func:`~fedcore.state.ledger.check_message_id`), so that pushing
        them again after a lost response stores nothing twice — a message whose id
        the run holds already is taken as that retry and left as it is. An id held by another run
        raises ``ConflictError``. A finished run raises ``RunFinishedError``.
        """

    @abstractmethod
    async def get_replies(self, run_id: int, message_ids: Iterable[str] | None) -> list[Message]:
        """The replies available now for these messages, in the order asked.

        An id this run does not know (never pushed, or already acknowledged) yields
        a ``MESSAGE_UNAVAILABLE`` error reply, so that nobody waits for it forever.
        ``None`` names no message: every reply the run holds, not yet acknowledged,
        in the order they were stored (what Flower's ``pull_messages()`` without ids
        asks for).
        """

    @abstractmethod
    async def ack_replies(self, run_id: int, message_ids: Iterable[str]) -> None:
        """The ServerApp has these replies: delete them and their messages.

        Ids the run does not know (never pushed, another run's, already acknowledged)
        are ignored, so acknowledging twice is harmless. A message without its reply
        yet raises ``InvalidTransitionError``, and then nothing is deleted.
        """

    # The node's side -----------------------------------------------------------------

    @abstractmethod
    async def renew_leases(
        self, node_id: int, message_ids: Sequence[str], *, lease: float
    ) -> list[str]:
        """Extend to ``lease`` seconds from now the leases the node holds on these messages.

        Returns, in the order given, the ids whose lease was not extended: not
        leased to this node (any more) — expired, answered, of a finished run, or
        unknown. A lease taken until the message expires (``lease=None`` on pulling)
        becomes a lease of ``lease`` seconds. Raises ``NodeNotFoundError`` for an
        unknown node, ``ValueError`` for a ``lease`` that is not positive.
        """

    @abstractmethod
    async def pull_messages(
        self, node_id: int, *, limit: int | None = None, lease: float | None = None
    ) -> list[Message]:
        """Lease up to ``limit`` of the node's pending messages, oldest first.

        A leased message is not handed out again until ``lease`` seconds pass
        without a reply (``None``: until the message expires).
        """

    @abstractmethod
    async def push_reply(self, node_id: int, reply: Message) -> str:
        """Store a reply from ``node_id`` (the authenticated sender) and return its id.

        The state stamps the reply from the message it answers (run, sender,
        destination, group, ``created_at``, a fresh id) and bounds its ``ttl`` by what
        remains of the message's, so a reply never outlives its message. An identical
        retry returns the first reply's id and leaves ``reply`` as it came, unstamped:
        that is how a caller (the link's fleet API) tells a retry from a first push.
        """

    # Notifications ---------------------------------------------------------------

    @abstractmethod
    def watch_messages(
        self, callback: Callable[[int], None], node_id: int | None = None
    ) -> Subscription:
        """Call ``callback(node_id)`` when a message becomes available to a node."""

    @abstractmethod
    def watch_replies(self, run_id: int, callback: Callable[[str], None]) -> Subscription:
        """Call ``callback(message_id)`` when a message of the run gets its reply."""

    @abstractmethod
    def watch_nodes(self, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(node_id)`` when a node comes online, goes offline or is deleted.

        Once per change: a node that stays offline is not announced again.
        """


class RunState(ABC):
    """Runs, the exec's claims, bundles, saved contexts and logs.

    Its contract is the suite :mod:`fedcore.testing.runstate`.
    """

    # Runs --------------------------------------------------------------------------

    @abstractmethod
    async def create_run(
        self, run_config: dict[str, Any], *, seed: int | None = None, bundle_hash: str = ""
    ) -> Run:
        """Create a run in status ``pending``, stamped with ``created_at``.

        ``bundle_hash`` names a bundle stored with :meth:`put_bundle` (deployment);
        an unknown one raises ``NotFoundError``. Empty: no bundle (simulation).
        """

    @abstractmethod
    async def list_runs(self) -> list[Run]:
        """Every run, finished ones included, oldest first."""

    @abstractmethod
    async def get_run(self, run_id: int) -> Run:
        """The run, or ``RunNotFoundError``."""

    @abstractmethod
    async def update_run_status(
        self, run_id: int, status: RunStatus, reason: str = "", *, token: int | None = None
    ) -> Run:
        """Move a run along its lifecycle table.

        Finishing a run drops its undelivered messages and unacknowledged replies,
        ends its claim and stops its ServerApp heartbeat timer; moving it back to
        ``pending`` ends its claim too. With ``token``, the move is the claimant's: it
        raises ``ClaimLostError`` unless ``token`` is the run's current claim (an exec
        reporting its ServerApp's exit), and then nothing changes; without, it is the
        operator's or the ServerApp's own (``fedcore stop``, the app finishing).
        """

    @abstractmethod
    def watch_runs(self, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(run_id)`` when a run is created or changes status."""

    # Claims: the exec's side ------------------------------------------------------

    @abstractmethod
    async def claim_runs(self, *, limit: int, lease: float) -> list[RunClaim]:
        """Claim up to ``limit`` pending runs, oldest first: each goes ``starting``.

        Each claim lasts ``lease`` seconds unless renewed. Claims made by concurrent
        callers never overlap: one pending run goes to exactly one claim. A negative
        ``limit`` or a ``lease`` that is not positive raises ``ValueError``.
        """

    @abstractmethod
    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        """Extend the claim ``lease`` seconds from now; return its new expiry.

        For a running run whose ServerApp is watched, the renewal also vouches for the
        ServerApp until the new expiry: the exec renews only while the process lives.

        Raises ``ClaimLostError`` unless ``token`` is the run's current claim and the
        run is still starting or running; ``RunNotFoundError`` for an unknown run.
        """

    @abstractmethod
    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        """The claimant launched the ServerApp: ``starting → running``.

        From now on the run is alive while its ServerApp heartbeats
        (:meth:`heartbeat_run`) at least every ``patience × heartbeat_interval``
        seconds; the claim's own expiry no longer matters. Raises ``ClaimLostError``
        for a stale ``token``, ``RunNotFoundError`` for an unknown run. Called again
        with the same token once the run is running (a retry after a lost response),
        it changes nothing and returns the run.
        """

    @abstractmethod
    async def heartbeat_run(self, run_id: int, *, heartbeat_interval: float) -> Run:
        """The run's ServerApp is alive; its next deadline is ``patience × interval`` away.

        Raises ``RunFinishedError`` once the run has finished (stopped by an
        operator, or failed): the ServerApp should end. A run that is not running
        yet raises ``InvalidTransitionError``. A run moved to ``running`` without
        :meth:`start_run` (by ``update_run_status``) is watched from its first heartbeat.
        """

    @abstractmethod
    async def check_run_secret(self, run_id: int, secret: str) -> Run:
        """The run, if ``secret`` is the launch secret of its current claim.

        Anything else — an unknown run, a wrong secret, the secret of an earlier
        claim or of a claim that ran out — raises ``RunNotFoundError`` alike: a caller
        cannot tell a run that exists but is not theirs from one that does not exist
        (docs/security.md). The secret outlives the run's finishing, which ends the claim
        for its exec but not for its ServerApp: that can still send its last logs and
        learn from :meth:`heartbeat_run` that it should end.
        """

    # Bundles, contexts and logs ----------------------------------------------------

    @abstractmethod
    async def put_bundle(self, data: bytes) -> str:
        """Store an app bundle and return its SHA-256 in hex; the same bytes are stored once."""

    @abstractmethod
    async def get_bundle(self, bundle_hash: str) -> bytes:
        """The bundle stored under ``bundle_hash``, or ``NotFoundError``."""

    @abstractmethod
    async def save_context(self, run_id: int, node_id: int, state: RecordDict) -> None:
        """Keep ``state`` as the context state of ``node_id`` in the run (replacing any).

        ``node_id`` is :data:`~fedcore.domain.SERVER_NODE_ID` for the ServerApp's.
        Raises ``RunNotFoundError``.
        """

    @abstractmethod
    async def load_context(self, run_id: int, node_id: int) -> RecordDict:
        """The state last saved for ``node_id`` in the run; empty when none was saved.

        Raises ``RunNotFoundError``.
        """

    @abstractmethod
    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> int:
        """Append lines to the run's log and return the number of the last one.

        Lines of a finished run are still accepted (a ServerApp's last words).
        ``batch`` names the append for its sender: the same non-empty name as the
        run's last named append is a retry after a lost response, and appends
        nothing (a sender names each batch anew and retries only its last).
        Raises ``RunNotFoundError``.
        """

    @abstractmethod
    async def get_logs(self, run_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        """Up to ``limit`` lines numbered above ``after``, in order.

        Raises ``RunNotFoundError``; a negative ``limit``, ``ValueError``.
        """

    @abstractmethod
    def watch_logs(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(seq)`` with the number of the last line of every append."""


class RecordState(ABC):
    """A run's record besides its log: its metrics and artifacts.

    Its contract is the suite :mod:`fedcore.testing.recordstate`.
    """

    # A run's record: its metrics and artifacts -----------------------------------------

    @abstractmethod
    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> int:
        """Append JSON objects to the run's metrics; return the number of the last one.

        The lines of ``metrics.jsonl`` (:class:`~fedcore.domain.MetricsLine`): the
        ServerApp's header, then a line per round. As :meth:`append_logs`: a finished
        run still takes lines, and ``batch`` names the append so that a retry after a
        lost response appends nothing. A document that is not a JSON object raises
        ``ValueError`` or ``TypeError``, and nothing is appended. Raises
        ``RunNotFoundError``.
        """

    @abstractmethod
    async def get_metrics(
        self, run_id: int, *, after: int = 0, limit: int = 1000
    ) -> list[MetricsLine]:
        """Up to ``limit`` metrics lines numbered above ``after``, in order.

        Raises ``RunNotFoundError``; a negative ``limit``, ``ValueError``.
        """

    @abstractmethod
    def watch_metrics(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(seq)`` with the number of the last line of every append."""

    @abstractmethod
    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        """Keep ``content`` as the run's artifact ``name``, replacing any kept before.

        Artifacts are what a run leaves besides its log and metrics, each a
        RecordDict under a name (:func:`~fedcore.state.ledger.check_artifact_name`): its final model
        (:data:`~fedcore.domain.run.MODEL_ARTIFACT`), later a checkpoint. They
        outlive the run, and a finished run still takes them (a ServerApp stopped as
        ``main`` returned keeps what it returned). Raises ``RunNotFoundError``; a bad
        name, ``ValueError``.
        """

    @abstractmethod
    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        """The run's artifact ``name``; ``NotFoundError`` if it keeps none by that name.

        Raises ``RunNotFoundError`` for an unknown run.
        """


class LinkState(MessageState, RunState, RecordState):
    """The link's state. Use it as an async context manager: enter starts its timers."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
