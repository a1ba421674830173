"""The messages a node is working on: its slots, the leases to renew, and abandoning them.

A message is in flight from the pull that leased it until its reply is stored or
dropped. Its id goes with every heartbeat, so the link renews its lease while the
ClientApp works, however long that takes, and while the reply waits for the link to
come back. The node pulls no more messages than it has free slots.

A message is abandoned when the link says its lease is gone (released in a
heartbeat answer: expired, answered by the link, or its run finished) or when the
link forgets the node: its task is cancelled, and a reply still to come is dropped,
since the link has moved on without it.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio


class InFlight:
    """The in-flight messages by id, each with the cancel scope of its task."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._changed = anyio.Event()

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._scopes

    def __len__(self) -> int:
        return len(self._scopes)

    @property
    def free(self) -> int:
        """Slots for more messages."""
        return max(self._capacity - len(self._scopes), 0)

    def ids(self) -> list[str]:
        """The messages whose leases the node renews."""
        return list(self._scopes)

    def add(self, message_id: str) -> anyio.CancelScope:
        """Take a slot for ``message_id``; its task runs in the returned scope."""
        if message_id in self._scopes:
            raise ValueError(f"message {message_id!r} is in flight already")
        scope = self._scopes[message_id] = anyio.CancelScope()
        self._notify()
        return scope

    def remove(self, message_id: str, scope: anyio.CancelScope) -> None:
        """Free the slot that ``add`` gave ``scope``, unless the message was abandoned since."""
        if self._scopes.get(message_id) is scope:
            del self._scopes[message_id]
            self._notify()

    def abandon(self, message_ids: Iterable[str]) -> list[str]:
        """Cancel the tasks of ``message_ids`` and free their slots; the ids that were in flight."""
        abandoned = []
        for message_id in message_ids:
            scope = self._scopes.pop(message_id, None)
            if scope is not None:
                scope.cancel()
                abandoned.append(message_id)
        if abandoned:
            self._notify()
        return abandoned

    async def wait_for_room(self) -> None:
        """Return once a slot is free."""
        while not self.free:
            await self._changed.wait()

    async def wait_empty(self) -> None:
        """Return once no message is in flight."""
        while self._scopes:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
