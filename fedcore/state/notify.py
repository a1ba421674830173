"""Change notifications: how waiting code learns that something happened, without polling.

A LinkState publishes on a :class:`Topic` when it stores a message, a reply or a node
change; waiters (a Grid waiting for replies, a dispatcher waiting for work, a fleet
server holding a node's long poll) subscribe with a callback. Callbacks run
synchronously inside the publishing call, on the event loop thread, so they must
only hand the news on (set an event, ``send_nowait`` on a stream) and never block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger(__name__)


class Subscription:
    """A registered callback; close it (or leave its ``with`` block) to stop receiving."""

    __slots__ = ("_unsubscribe",)

    def __init__(self, unsubscribe: Callable[[], None]) -> None:
        self._unsubscribe: Callable[[], None] | None = unsubscribe

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Topic(Generic[K, V]):
    """Callbacks keyed by ``K`` (or by nothing, to hear every key), called with ``V``."""

    def __init__(self) -> None:
        self._by_key: dict[K, dict[int, Callable[[V], None]]] = {}
        self._everything: dict[int, Callable[[V], None]] = {}
        self._next = 0

    def subscribe(self, callback: Callable[[V], None], key: K | None = None) -> Subscription:
        token = self._next
        self._next += 1
        group = self._everything if key is None else self._by_key.setdefault(key, {})
        group[token] = callback

        def unsubscribe() -> None:
            group.pop(token, None)
            if key is not None and not group:
                self._by_key.pop(key, None)

        return Subscription(unsubscribe)

    def publish(self, key: K, value: V) -> None:
        for group in (self._by_key.get(key), self._everything):
            for callback in list(group.values()) if group else ():
                try:
                    callback(value)
                except Exception:
                    log.exception("a subscriber to %r failed; the others are still notified", key)
