"""Who the link lets speak for a node: signatures checked, keys admitted, ids bound to keys.

Every fleet request is signed with its node's key (:mod:`fedcore.auth.signatures`).
:class:`NodeGate` is the link's :class:`FleetGate`:

- **admit**, before anything of the request is decoded: the timestamp is within the
  window, the request names this link (:attr:`NodeGate.link`, new at each start: so
  a request captured before a restart, or at another link, is refused although the
  nonces seen before are forgotten), the key is one the link admits (any key, unless
  an authorized list is set: trust on first use otherwise), the signature signs this
  method, this body and this link's name, and the nonce is new. A request that fails
  any of these costs the link one signature check at most, and nothing of it is kept.
  A signed request may open a session (:mod:`fedcore.auth.sessions`); a request MAC'd
  in one is admitted the same way, with the session's key for the signer's, at the
  cost of an HMAC. The gate holds
  up to :data:`SESSIONS_PER_KEY` sessions per node key (a node calls on two
  connections, each with its own) and :data:`MAX_SESSIONS` in all — the oldest go
  first: their node signs again — each for
  :data:`~fedcore.auth.sessions.SESSION_SECONDS`.
- **check_session**, before each later frame of a long call in a session: the
  session is still held and its key still admitted.
- **check_speaks_for**, once the request's node id is read: the signer's key is the
  one that node registered with. The binding lives in the LinkState (it survives a
  restart on SQLite) or whatever else answers :class:`KeyBindings`; the gate keeps
  the keys it has seen in memory so that a heartbeat costs no database read (and
  forgets those of nodes retired, :meth:`NodeGate.forget`).

So a process that knows node B's id but not B's key cannot pull B's messages, push
replies as B, unregister B or fetch B's runs; and node A's key cannot speak for B.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import anyio.to_thread

from fedcore.auth.admission import Arrival, Door
from fedcore.auth.keys import PublicKey
from fedcore.auth.replay import MAX_SKEW, ReplayGuard
from fedcore.auth.sessions import (
    SESSION,
    SESSION_KEY,
    SESSION_SECONDS,
    FrameSeal,
    MacRequest,
    encode_key,
    exchange,
    new_exchange_key,
    new_session_id,
    session_key,
)
from fedcore.auth.signatures import SignedRequest, check_link_name, credentials
from fedcore.auth.stamps import NO_LINK_YET, new_link_name
from fedcore.clock import Clock
from fedcore.errors import AuthenticationError, UnknownSessionError, WrongLinkError
from fedcore.wire.frame import Buffer

log = logging.getLogger(__name__)

HASH_OFF_LOOP = 64 * 1024
"""Frames longer than this are hashed and verified in a thread: a 4 MiB reply's SHA-256
would hold the event loop for milliseconds."""
MAX_SESSIONS = 100_000
"""Sessions the gate holds at once: some 200 bytes each."""
SESSIONS_PER_KEY = 4
"""Sessions one node key may hold at once: a node's own connections each open one (its
calls and its heartbeats go on two), and one that opens a fifth ends its oldest."""


@dataclass(frozen=True, slots=True)
class _Session:
    public_key: PublicKey
    key: bytes
    ends: float


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted call: the node key it proved, and headers for the response, if any
    (the answer to a session offer). A call MAC'd in a session also has the session's
    id and the seal its later frames carry (:class:`~fedcore.auth.sessions.FrameSeal`)."""

    public_key: PublicKey
    headers: tuple[tuple[str, str], ...] = ()
    session_id: str | None = None
    seal: FrameSeal | None = None


Credentials = SignedRequest | MacRequest
"""What a fleet call's metadata presents: a node key's signature, or a session's MAC."""


class FleetGate(Door[Credentials, tuple[bytes, Admission]]):
    """Who may call the fleet API, and for which node: the link decides, the transport asks.

    As a :class:`~fedcore.auth.admission.Door`, it admits a call's first frame (the
    transport's :class:`~fedcore.auth.admission.Arrival` reads it) and answers it
    with the :class:`Admission`.
    """

    def present(self, arrival: Arrival) -> Credentials:
        return credentials(arrival.headers.items())

    async def check(self, arrival: Arrival, presented: Credentials) -> tuple[bytes, Admission]:
        frame = await arrival.body()
        return frame, await self.admit(arrival.method, frame, presented)

    @abstractmethod
    async def admit(
        self, method: str, frame: Buffer, presented: SignedRequest | MacRequest
    ) -> Admission:
        """Admit ``frame`` as the first request of a call to ``method``, or raise.

        Called before the frame is decoded. Raises
        :class:`~fedcore.errors.AuthenticationError` for a bad signature or MAC, a
        stale timestamp, a replayed nonce or a key the link does not admit,
        :class:`~fedcore.errors.WrongLinkError` for a signature meant for another link
        (or this one before a restart), and
        :class:`~fedcore.errors.UnknownSessionError` for a session it does not hold.
        """

    @abstractmethod
    def check_session(self, admission: Admission) -> None:
        """Return if the session an admitted call was MAC'd in still admits calls now.

        A long call asks before each frame after its first: the session may have
        ended, been replaced, or its key been taken off the authorized list since.
        Raises :class:`~fedcore.errors.UnknownSessionError` for a session the gate no
        longer holds, :class:`~fedcore.errors.AuthenticationError` for a key it no
        longer admits.
        """

    def check_frame(self, admission: Admission, number: int, frame: bytes, mac: bytes) -> None:
        """Return if ``mac`` seals ``frame`` as frame ``number`` of a long call admitted as
        ``admission``; else :class:`~fedcore.errors.AuthenticationError` (also for a call
        that was signed, not MAC'd in a session: its frames carry no seal)."""
        if admission.seal is None:
            raise AuthenticationError("a Heartbeats call is made in a session, not signed")
        admission.seal.verify(number, frame, mac)

    @abstractmethod
    async def check_speaks_for(self, key: PublicKey, node_id: int) -> None:
        """Return if ``key``, proved by an admitted request, is node ``node_id``'s.

        Raises ``NodeNotFoundError`` when the key belongs to no node (it must
        register), and :class:`~fedcore.errors.AuthenticationError` when it belongs to
        another node than ``node_id``.
        """

    @abstractmethod
    def registered(self, key: PublicKey, node_id: int) -> None:
        """Note that ``key``, proved by an admitted registration, is node ``node_id``'s."""


class KeyBindings(Protocol):
    """Where a node's key is bound to its id: the LinkState, or a fake link in tests."""

    async def node_with_key(self, public_key: bytes) -> int:
        """The node registered with ``public_key``; ``NodeNotFoundError`` if none."""
        ...


class NodeGate(FleetGate):
    """Admits signed fleet requests on ``clock``'s time; the keys' nodes from ``state``.

    ``authorized``: the only keys that may register (``None``: any key). ``link``: the
    name signatures must name (default: a new one, as a link process that starts takes).
    """

    def __init__(
        self,
        state: KeyBindings,
        clock: Clock,
        *,
        authorized: Iterable[PublicKey] | None = None,
        max_skew: float = MAX_SKEW,
        link: str | None = None,
    ) -> None:
        self.link = new_link_name() if link is None else check_link_name(link)
        """The name of this link, for as long as the gate lives."""
        self._state = state
        self._clock = clock
        self._guard = ReplayGuard(clock, max_skew=max_skew)
        self._authorized = None if authorized is None else frozenset(authorized)
        self._nodes: dict[bytes, int] = {}
        """The node of each key seen since start (a cache of the state's bindings)."""
        self._sessions: dict[str, _Session] = {}
        """By id, oldest first."""
        self._session_of: dict[bytes, list[str]] = {}
        """Each node key's sessions, oldest first."""

    def authorize(self, keys: Iterable[PublicKey] | None) -> None:
        """Admit only ``keys`` from now on (``None``: any key). Nodes already registered
        whose key is no longer listed are refused at their next request."""
        self._authorized = None if keys is None else frozenset(keys)

    async def admit(
        self, method: str, frame: Buffer, presented: SignedRequest | MacRequest
    ) -> Admission:
        self._guard.check_fresh(presented.timestamp)
        if isinstance(presented, MacRequest):
            session = self._held(presented.session_id)
            self._check_authorized(session.public_key)
            await _off_loop_if_large(frame, presented.verify, session.key, method, frame)
            self._guard.use_once(presented.nonce, presented.timestamp)
            seal = presented.seal(session.key)
            return Admission(session.public_key, session_id=presented.session_id, seal=seal)
        self._check_link(presented.link)
        self._check_authorized(presented.public_key)
        await _off_loop_if_large(frame, presented.verify, method, frame, self.link)
        self._guard.use_once(presented.nonce, presented.timestamp)
        if presented.offer is None:
            return Admission(presented.public_key)
        return Admission(presented.public_key, self._open_session(presented, presented.offer))

    def check_session(self, admission: Admission) -> None:
        if admission.session_id is None:
            raise UnknownSessionError("the call was not made in a session")
        session = self._held(admission.session_id)
        if session.public_key != admission.public_key:
            raise UnknownSessionError("the link holds no such session: sign the call")
        self._check_authorized(session.public_key)

    def _held(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None or session.ends <= self._clock.now():
            raise UnknownSessionError("the link holds no such session: sign the call")
        return session

    def _check_link(self, named: str) -> None:
        if named == self.link:
            return
        if named == NO_LINK_YET:
            raise WrongLinkError(
                "the request names no link yet: told the node this link's name",
                self.link,
                learning=True,
            )
        raise WrongLinkError(
            f"the request is signed for the link {named}, not this one ({self.link}): "
            "a request from before the link restarted, or meant for another link (a "
            "node's first call after a restart is refused so too, and signs again)",
            self.link,
        )

    def _check_authorized(self, key: PublicKey) -> None:
        if self._authorized is not None and key not in self._authorized:
            raise AuthenticationError(
                f"the key {key.fingerprint} is not among the link's "
                "authorized nodes (--authorized-nodes)"
            )

    def _open_session(self, signed: SignedRequest, offer: bytes) -> tuple[tuple[str, str], ...]:
        """A new session for the signer, ending its oldest if it holds
        :data:`SESSIONS_PER_KEY`; the headers that answer the offer."""
        private, answer = new_exchange_key()
        shared = exchange(private, offer)
        session_id = new_session_id()
        der = signed.public_key.der
        held = self._session_of.setdefault(der, [])
        if len(held) >= SESSIONS_PER_KEY:
            del self._sessions[held.pop(0)]
        while len(self._sessions) >= MAX_SESSIONS:
            self._end_oldest()
        key = session_key(shared, session_id, offer, answer, der)
        self._sessions[session_id] = _Session(
            signed.public_key, key, self._clock.now() + SESSION_SECONDS
        )
        self._session_of.setdefault(der, []).append(session_id)
        return ((SESSION, session_id), (SESSION_KEY, encode_key(answer)))

    def _end_oldest(self) -> None:
        session_id, oldest = next(iter(self._sessions.items()))
        del self._sessions[session_id]
        der = oldest.public_key.der
        held = self._session_of[der]
        held.remove(session_id)
        if not held:
            del self._session_of[der]

    async def check_speaks_for(self, public_key: PublicKey, node_id: int) -> None:
        key = public_key.der
        bound = self._nodes.get(key)
        if bound != node_id:
            bound = await self._state.node_with_key(key)  # NodeNotFoundError: not registered
            self._nodes[key] = bound
        if bound != node_id:
            log.warning("refused a request about node %d signed by node %d's key", node_id, bound)
            raise AuthenticationError(f"the request's key is not node {node_id}'s")

    def registered(self, public_key: PublicKey, node_id: int) -> None:
        self._nodes[public_key.der] = node_id

    def forget(self, node_ids: Iterable[int]) -> None:
        """Drop the keys of nodes the state deleted (retired) from the gate's cache."""
        gone = set(node_ids)
        self._nodes = {key: node for key, node in self._nodes.items() if node not in gone}


async def _off_loop_if_large(frame: Buffer, check: Callable[..., None], *args: object) -> None:
    """``check(*args)``: in a thread when ``frame`` is long enough to be worth hashing there."""
    if len(frame) > HASH_OFF_LOOP:
        await anyio.to_thread.run_sync(check, *args)
    else:
        check(*args)
