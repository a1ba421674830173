"""A reply on its way to the link: kept and retried until the link holds it, or refuses it for good.

The node keeps a reply until ``push_reply`` returns: from then on the link holds it
durably (R2). While the link is unavailable the push is retried with backoff, and
every retry sends the same :class:`OutgoingReply`, built once, so that a retry of a
push whose answer was lost is an identical duplicate: the link stores it once and
says ``duplicate`` (R3).

Content over :data:`~fedcore.wire.fleet.MAX_INLINE_CONTENT` goes first as a payload
(``push_payload``, streamed from the encoded parts — views of the reply's arrays, not
a copy) and the reply then names it. The link keeps a pushed payload only until the
reply naming it is stored, and not across a restart, so a retried reply may find its
payload gone (``DecodeError``): the payload is pushed again, once, and the reply with
it. Any other refusal is final and raised for the caller to log and drop.
"""

from __future__ import annotations

import anyio.to_thread

from fedcore.domain import Message
from fedcore.domain.fleet import Digest, PayloadRef, PushedReply
from fedcore.errors import DecodeError
from fedcore.roles.node.retry import Retrier
from fedcore.transport.fleet import FleetService
from fedcore.wire import Parts, pack_recorddict_parts, parts_size
from fedcore.wire.fleet import MAX_INLINE_CONTENT


class OutgoingReply:
    """A reply as it is pushed, with its content's encoding when that goes as a payload."""

    __slots__ = ("_digest", "_parts", "payload", "reply")

    def __init__(self, reply: Message) -> None:
        self.reply = reply
        self.payload: PayloadRef | None = None
        """The payload the link holds for the content, once pushed."""
        self._parts: Parts | None = None
        self._digest: Digest | None = None
        if reply.has_content():
            parts = pack_recorddict_parts(reply.content)
            if parts_size(parts) > MAX_INLINE_CONTENT:
                self._parts = parts

    @property
    def message_id(self) -> str:
        """The id of the message this replies to."""
        return self.reply.metadata.reply_to_message_id

    async def push(self, fleet: FleetService, node_id: int, retry: Retrier) -> PushedReply:
        """Push until the link holds the reply; raise the link's final refusal."""
        try:
            return await retry(lambda: self._push_once(fleet, node_id))
        except DecodeError:
            if self.payload is None:
                raise
            self.payload = None  # the link lost the payload the reply names: push it again
            return await retry(lambda: self._push_once(fleet, node_id))

    async def _push_once(self, fleet: FleetService, node_id: int) -> PushedReply:
        if self._parts is not None and self.payload is None:
            if self._digest is None:  # hashing megabytes: off the event loop
                self._digest = await anyio.to_thread.run_sync(Digest.of, self._parts)
            payload_id = await fleet.push_payload(
                node_id, self.message_id, self._digest, self._parts
            )
            self.payload = PayloadRef(payload_id, self._digest)
        return await fleet.push_reply(node_id, self.reply, self.payload)
