"""Who the link lets speak for a node: signatures checked, keys admitted, ids bound to keys.

Every fleet request is signed with its node's key (:mod:`fedcore.wire.signatures`).
:class:`NodeGate` is the link's :class:`~fedcore.transport.fleet.FleetGate`:

- **admit**, before anything of the request is decoded: the timestamp is within the
  window, the key is one the link admits (any key, unless an authorized list is set:
  trust on first use otherwise), the signature signs this method and this body, and
  the nonce is new. A request that fails any of these costs the link one signature
  check at most, and nothing of it is kept.
- **check_speaks_for**, once the request's node id is read: the signer's key is the
  one that node registered with. The binding lives in the LinkState (it survives a
  restart on SQLite) or whatever else answers :class:`KeyBindings`; the gate keeps
  the keys it has seen in memory so that a heartbeat costs no database read.

So a process that knows node B's id but not B's key cannot pull B's messages, push
replies as B, unregister B or fetch B's runs; and node A's key cannot speak for B.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import anyio.to_thread

from fedcore.clock import Clock
from fedcore.errors import AuthenticationError
from fedcore.transport.fleet import FleetGate
from fedcore.transport.replay import MAX_SKEW, ReplayGuard
from fedcore.wire.frame import Buffer
from fedcore.wire.keys import PublicKey
from fedcore.wire.signatures import SignedRequest

log = logging.getLogger(__name__)

HASH_OFF_LOOP = 64 * 1024
"""Frames longer than this are hashed and verified in a thread: a 4 MiB reply's SHA-256
would hold the event loop for milliseconds."""


class KeyBindings(Protocol):
    """Where a node's key is bound to its id: the LinkState, or a fake link in tests."""

    async def node_with_key(self, public_key: bytes) -> int:
        """The node registered with ``public_key``; ``NodeNotFoundError`` if none."""
        ...


class NodeGate(FleetGate):
    """Admits signed fleet requests on ``clock``'s time; the keys' nodes from ``state``.

    ``authorized``: the only keys that may register (``None``: any key).
    """

    def __init__(
        self,
        state: KeyBindings,
        clock: Clock,
        *,
        authorized: Iterable[PublicKey] | None = None,
        max_skew: float = MAX_SKEW,
    ) -> None:
        self._state = state
        self._guard = ReplayGuard(clock, max_skew=max_skew)
        self._authorized = None if authorized is None else frozenset(authorized)
        self._nodes: dict[bytes, int] = {}
        """The node of each key seen since start (a cache of the state's bindings)."""

    def authorize(self, keys: Iterable[PublicKey] | None) -> None:
        """Admit only ``keys`` from now on (``None``: any key). Nodes already registered
        whose key is no longer listed are refused at their next request."""
        self._authorized = None if keys is None else frozenset(keys)

    async def admit(self, method: str, frame: Buffer, signed: SignedRequest) -> None:
        self._guard.check_fresh(signed.timestamp)
        if self._authorized is not None and signed.public_key not in self._authorized:
            raise AuthenticationError(
                f"the key {signed.public_key.fingerprint} is not among the link's "
                "authorized nodes (--authorized-nodes)"
            )
        if len(frame) > HASH_OFF_LOOP:
            await anyio.to_thread.run_sync(signed.verify, method, frame)
        else:
            signed.verify(method, frame)
        self._guard.use_once(signed.nonce, signed.timestamp)

    async def check_speaks_for(self, signed: SignedRequest, node_id: int) -> None:
        key = signed.public_key.der
        bound = self._nodes.get(key)
        if bound != node_id:
            bound = await self._state.node_with_key(key)  # NodeNotFoundError: not registered
            self._nodes[key] = bound
        if bound != node_id:
            log.warning("refused a request about node %d signed by node %d's key", node_id, bound)
            raise AuthenticationError(f"the request's key is not node {node_id}'s")

    def registered(self, signed: SignedRequest, node_id: int) -> None:
        self._nodes[signed.public_key.der] = node_id
