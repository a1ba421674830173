"""LinkState: everything the link knows — nodes, runs, messages and their replies.

One interface, several implementations (``memory.py`` for simulation and tests,
``sqlite.py`` for deployment), and one conformance suite for all of them in
``fedcore.testing.linkstate``. Every method is async so that an implementation may
do I/O off the event loop; notifications (``watch_*``) are synchronous callbacks,
see :mod:`fedcore.state.notify`.

Message flow and the promises kept (DESIGN.md §5):

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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

from fedcore.domain import SERVER_NODE_ID, Error, ErrorCode, Message, Metadata, Run, RunStatus
from fedcore.domain.message import assemble_message
from fedcore.state.notify import Subscription

DEFAULT_HEARTBEAT_PATIENCE = 2.0
"""A node is offline once ``patience × heartbeat_interval`` passes without a heartbeat."""


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
    async def delete_node(self, node_id: int) -> None:
        """Remove a node; its unanswered messages get ``NODE_UNAVAILABLE`` replies."""

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
    async def create_run(self, run_config: dict[str, Any], *, seed: int | None = None) -> Run:
        """Create a run in status ``pending``."""

    @abstractmethod
    async def get_run(self, run_id: int) -> Run:
        """The run, or ``RunNotFoundError``."""

    @abstractmethod
    async def update_run_status(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        """Move a run along its lifecycle table.

        Finishing a run drops its undelivered messages and unacknowledged replies.
        """

    # The ServerApp's side ------------------------------------------------------------

    @abstractmethod
    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        """Store messages for their nodes; stamp and return their ids.

        Each message gets ``run_id``, a fresh ``message_id``, ``src_node_id`` (the
        server) and ``created_at`` written into its metadata. A finished run raises
        ``RunFinishedError``.
        """

    @abstractmethod
    async def get_replies(self, run_id: int, message_ids: Iterable[str]) -> list[Message]:
        """The replies available now for these messages, in the order asked.

        An id this run does not know (never pushed, or already acknowledged) yields
        a ``MESSAGE_UNAVAILABLE`` error reply, so that nobody waits for it forever.
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
        remains of the message's, so a reply never outlives its message.
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


def check_heartbeat_interval(heartbeat_interval: float) -> None:
    """Refuse a heartbeat interval that is not a positive number of seconds."""
    if not heartbeat_interval > 0:
        raise ValueError(f"heartbeat_interval must be positive, got {heartbeat_interval}")


def unknown_message_reply(run_id: int, message_id: str) -> Message:
    """The error reply ``get_replies`` gives for an id the run does not hold."""
    metadata = Metadata(run_id=run_id, dst_node_id=SERVER_NODE_ID, reply_to_message_id=message_id)
    reason = f"run {run_id} has no message {message_id!r} (never pushed, or already acknowledged)"
    return assemble_message(metadata, error=Error(int(ErrorCode.MESSAGE_UNAVAILABLE), reason))
