"""LinkState: everything the link knows — nodes, runs, messages and their replies.

One interface, several implementations (``memory.py`` for simulation and tests,
``sqlite.py`` for deployment), and one conformance suite for all of them, in two
halves: ``fedcore.testing.linkstate`` (nodes, messages, replies) and
``fedcore.testing.runstate`` (runs, claims, bundles, contexts, logs). Every method is
async so that an implementation may do I/O off the event loop; notifications
(``watch_*``) are synchronous callbacks, see :mod:`fedcore.state.notify`.

Message flow and the promises kept (R1–R4, docs/reliability.md):

- ``push_messages`` stores a ServerApp's messages; each is delivered to its node by
  ``pull_messages`` under a lease, and redelivered if the lease runs out.
- ``push_reply`` stores a node's reply. An identical retry is accepted and changes
  nothing; a different reply to an answered message raises ``ConflictError``.
- A message that cannot be answered still gets exactly one reply: the state stores
  an error reply when its node is unknown or goes offline (``NODE_UNAVAILABLE``) or
  when its TTL passes first (``MESSAGE_UNAVAILABLE``). The ServerApp therefore
  never waits on a message that can no longer complete.
- ``get_replies`` returns replies until the ServerApp acknowledges them with
  ``ack_replies``; only then are message and reply deleted.
- A node working on a message keeps its lease with ``renew_leases`` (sent with its
  heartbeats), so a long ClientApp is not redelivered while it works.

Runs in deployment (R4–R6, docs/reliability.md). ``fedcore run`` stores the app bundle
(``put_bundle``) and creates the run, ``pending``. An exec claims it with
``claim_runs``: the run goes ``starting`` and the claim carries a fencing token and a
launch secret. The exec renews the claim while it launches the ServerApp
(``renew_claim``) and moves the run to ``running`` with ``start_run``; a claim that
runs out while the run is ``starting`` sends it back to ``pending`` for another exec,
at most :data:`MAX_CLAIM_ATTEMPTS` times, then ``finished:failed``. Once running, the
run is kept alive by two voices: the ServerApp's own ``heartbeat_run``, and its exec's
``renew_claim`` — the exec holds the process and renews only while it runs, so an app
whose own code blocks its heartbeats (a slow ``import torch``, a loop held for
seconds) is still known alive. A run fails for silence only when both stop: no
heartbeat for ``patience × heartbeat_interval`` and no renewal for a claim's lease.
(A process that exits is reported by its exec at once.) Every status
change is announced by ``watch_runs``. Logs (``append_logs``) and saved contexts
(``save_context``) outlive the run, for ``fedcore log`` and for the record.

A run's record (``fedcore pull``, the link's page) is the run itself, its log, its
metrics (``append_metrics``: the ``metrics.jsonl`` lines the ServerApp reports, a
header and a line per round) and its artifacts (``put_artifact``: named RecordDicts,
the final model among them). Each finished run keeps ``finished_at``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from fedcore.domain import (
    SERVER_NODE_ID,
    Error,
    ErrorCode,
    LogLine,
    Message,
    Metadata,
    MetricsLine,
    RecordDict,
    Run,
    RunStatus,
)
from fedcore.domain.message import assemble_message
from fedcore.errors import (
    ClaimLostError,
    InvalidTransitionError,
    NotFoundError,
    ReplyRejectedError,
    RunFinishedError,
)
from fedcore.state.notify import Subscription

DEFAULT_HEARTBEAT_PATIENCE = 3.0
"""A node is offline once ``patience × heartbeat_interval`` passes without a heartbeat.

The same patience applies to a running run's ServerApp and its ``heartbeat_run``.
Three beats, not two: on a loaded machine one late heartbeat is ordinary."""
MAX_CLAIM_ATTEMPTS = 3
"""How many claims of one run may run out before the run is ``finished:failed``."""


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


class LinkState(ABC):
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
        RecordDict under a name (:func:`check_artifact_name`): its final model
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

    # The ServerApp's side ------------------------------------------------------------

    @abstractmethod
    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        """Store messages for their nodes; stamp and return their ids.

        Each message gets ``run_id``, ``src_node_id`` (the server) and ``created_at``
        written into its metadata, and a fresh ``message_id`` unless it comes with
        one: a ServerApp across the network names its messages itself (32 lowercase
        hex digits, see :func:`check_message_id`), so that pushing them again after a
        lost response stores nothing twice — a message whose id the run holds
        already is taken as that retry and left as it is. An id held by another run
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


def new_id(ids: random.Random, taken: Callable[[int], bool]) -> int:
    """A fresh node or run id from ``ids``: 63 bits, above the server's id, not ``taken``."""
    while True:
        candidate = ids.getrandbits(63)
        if candidate > SERVER_NODE_ID and not taken(candidate):
            return candidate


def new_message_id(ids: random.Random, taken: Callable[[str], bool]) -> str:
    """A fresh message or reply id from ``ids``: 32 lowercase hex digits, not ``taken``."""
    while True:
        message_id = f"{ids.getrandbits(128):032x}"
        if not taken(message_id):
            return message_id


def check_message_id(message_id: str) -> None:
    """Refuse a message id a ServerApp chose that is not 32 lowercase hex digits."""
    if len(message_id) != 32 or message_id.strip("0123456789abcdef"):
        raise ValueError(f"a message id is 32 lowercase hex digits, got {message_id[:40]!r}")


def check_heartbeat_interval(heartbeat_interval: float) -> None:
    """Refuse a heartbeat interval that is not a positive number of seconds."""
    if not heartbeat_interval > 0:
        raise ValueError(f"heartbeat_interval must be positive, got {heartbeat_interval}")


def check_retirement(offline_for: float) -> None:
    """Refuse a retirement age that is not a finite number of seconds, 0 or more."""
    if not (offline_for >= 0 and math.isfinite(offline_for)):
        raise ValueError(f"offline_for must be finite and not negative, got {offline_for}")


def check_takes_messages(run_id: int, status: RunStatus) -> None:
    """Refuse a push to a finished run."""
    if status.finished:
        raise RunFinishedError(f"run {run_id} is {status}; it takes no messages")


def check_reply_type(reply: Message, message_type: str) -> None:
    """Refuse a reply whose type is not that of the message it answers."""
    if reply.metadata.message_type != message_type:
        raise ReplyRejectedError(
            f"reply type {reply.metadata.message_type!r} does not match "
            f"message type {message_type!r}"
        )


def unknown_message_reply(run_id: int, message_id: str) -> Message:
    """The error reply ``get_replies`` gives for an id the run does not hold.

    Its type is ``system`` (as Flower's answer to the same question): the message,
    and so its type, is unknown, and a reply must carry a valid type to cross the
    wire — a deployed ServerApp gets this very reply in a batch.
    """
    metadata = Metadata(
        run_id=run_id,
        dst_node_id=SERVER_NODE_ID,
        reply_to_message_id=message_id,
        message_type="system",
    )
    reason = f"run {run_id} has no message {message_id!r} (never pushed, or already acknowledged)"
    return assemble_message(metadata, error=Error(int(ErrorCode.MESSAGE_UNAVAILABLE), reason))


def check_lease(lease: float) -> None:
    """Refuse a lease (of a message or a claim) that is not a positive number of seconds."""
    if not lease > 0:
        raise ValueError(f"lease must be positive, got {lease}")


def new_launch_secret() -> tuple[str, bytes]:
    """A claim's launch secret, and its digest: all that a state keeps of it."""
    secret = secrets.token_urlsafe(32)
    return secret, _digest(secret)


def secret_matches(digest: bytes | None, secret: str) -> bool:
    """Whether ``secret`` is the one ``digest`` was made from, in constant time."""
    return digest is not None and hmac.compare_digest(digest, _digest(secret))


def _digest(secret: str) -> bytes:
    # surrogatepass: a secret from the network may hold any str; it then only fails to match.
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def check_claim_token(run_id: int, current: int | None, token: int) -> None:
    """Refuse ``token`` unless it is the run's live claim, ``current`` (None: no claim)."""
    if token != current:
        raise ClaimLostError(f"token {token} is not the claim of run {run_id}")


def check_running(run_id: int, status: RunStatus) -> None:
    """What ``heartbeat_run`` refuses: a finished run, and one not running yet."""
    if status.finished:
        raise RunFinishedError(f"run {run_id} is {status}: its ServerApp should end")
    if status is not RunStatus.RUNNING:
        raise InvalidTransitionError(f"run {run_id} is {status}, not running yet")


def after_claim_expired(attempts: int) -> tuple[RunStatus, str]:
    """Where a ``starting`` run goes when its claim runs out, and why (R5)."""
    if attempts >= MAX_CLAIM_ATTEMPTS:
        return RunStatus.FAILED, (
            f"no exec launched the run: its claim ran out {attempts} times "
            f"(the exec that claimed it died or hung each time)"
        )
    return RunStatus.PENDING, (
        f"claim {attempts} ran out before its exec launched the run; waiting for another exec"
    )


def silent_serverapp_reason(patience: float, heartbeat_interval: float) -> str:
    """Why a running run failed when its ServerApp stopped heartbeating (R4)."""
    return (
        f"the ServerApp went silent: no heartbeat for {patience * heartbeat_interval:g} s "
        f"({patience:g} × its interval of {heartbeat_interval:g} s), and no exec vouched "
        f"for its process meanwhile (its exec is gone)"
    )


_ARTIFACT_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")


def check_artifact_name(name: str) -> None:
    """Refuse an artifact name that is not 1-64 lowercase letters, digits and dashes."""
    if not isinstance(name, str) or not _ARTIFACT_NAME.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else type(name).__name__
        raise ValueError(f"an artifact name is lowercase letters, digits and dashes, got {shown!r}")


def encode_metrics(documents: Sequence[dict[str, Any]]) -> list[str]:
    """Each metrics document as the JSON text a state keeps; ``ValueError``/``TypeError``
    for one that is not a JSON object (then none is kept).

    Non-finite numbers are written as ``metrics.jsonl`` writes them (``NaN``), so a
    diverged loss survives the trip.
    """
    if isinstance(documents, dict):
        raise TypeError("append_metrics takes a sequence of documents, not one")
    encoded = []
    for document in documents:
        if not isinstance(document, dict):
            raise TypeError(f"a metrics line is a JSON object, not {type(document).__name__}")
        encoded.append(json.dumps(document, separators=(",", ":")))
    return encoded


def decode_metrics(seq: int, text: str) -> MetricsLine:
    """A kept metrics line."""
    return MetricsLine(seq, json.loads(text))


def missing_artifact(run_id: int, name: str) -> NotFoundError:
    """What ``get_artifact`` raises for an artifact the run does not keep."""
    return NotFoundError(f"run {run_id} keeps no {name}")
