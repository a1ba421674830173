"""The link's gate on the fleet API: signatures, freshness, replays, keys and their nodes."""

from __future__ import annotations

import pytest

from fedcore.auth import fleet_gate
from fedcore.auth.fleet_gate import SESSIONS_PER_KEY, NodeGate
from fedcore.auth.keys import NodeKey
from fedcore.auth.sessions import SESSION_SECONDS, ClientSession, FrameSeal, Offer
from fedcore.auth.signatures import LINK as LINK_HEADER
from fedcore.auth.signatures import credentials, sign
from fedcore.auth.stamps import NO_LINK_YET
from fedcore.errors import (
    AuthenticationError,
    NodeNotFoundError,
    UnknownSessionError,
    WrongLinkError,
)
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.wire.rpc import FleetMethod

pytestmark = pytest.mark.anyio

HEARTBEAT = FleetMethod.HEARTBEAT.value
FRAME = b"\x08\x01 a heartbeat"
LINK = "the-link"


@pytest.fixture
async def state(fake_clock: FakeClock) -> InMemoryLinkState:
    async with InMemoryLinkState(fake_clock) as entered:
        return entered


def signed(key: NodeKey, clock: FakeClock, method: str = HEARTBEAT, frame: bytes = FRAME):
    return credentials(sign(key, method, frame, clock.now(), link=LINK))


def signed_for(key: NodeKey, clock: FakeClock, link: str):
    return credentials(sign(key, HEARTBEAT, FRAME, clock.now(), link=link))


async def test_a_signed_request_is_admitted_once(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    request = signed(key, fake_clock)
    await gate.admit(HEARTBEAT, FRAME, request)
    with pytest.raises(AuthenticationError, match="replayed"):
        await gate.admit(HEARTBEAT, FRAME, request)
    await gate.admit(HEARTBEAT, FRAME, signed(key, fake_clock))  # a fresh nonce is fine


async def test_a_request_signed_for_another_link_or_before_a_restart_is_refused(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    key = NodeKey.generate()
    before = NodeGate(state, fake_clock)
    captured = credentials(sign(key, HEARTBEAT, FRAME, fake_clock.now(), link=before.link))
    await before.admit(HEARTBEAT, FRAME, captured)
    after = NodeGate(state, fake_clock)  # the link restarted on the same state: a new name
    assert after.link != before.link
    with pytest.raises(WrongLinkError, match="before the link restarted") as refused:
        await after.admit(HEARTBEAT, FRAME, captured)
    assert refused.value.link == after.link
    assert not refused.value.learning
    # A node that knows no name yet is told it, and signs for it.
    with pytest.raises(WrongLinkError, match="no link yet") as told:
        await after.admit(HEARTBEAT, FRAME, signed_for(key, fake_clock, NO_LINK_YET))
    assert told.value.link == after.link
    assert told.value.learning
    await after.admit(HEARTBEAT, FRAME, signed_for(key, fake_clock, told.value.link))


async def test_a_signature_is_checked_over_the_gates_own_name(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    headers = dict(sign(key, HEARTBEAT, FRAME, fake_clock.now(), link="another-link"))
    headers[LINK_HEADER] = LINK  # the name swapped in: the signature covers the other
    with pytest.raises(AuthenticationError, match="does not match"):
        await gate.admit(HEARTBEAT, FRAME, credentials(headers.items()))


def test_a_signature_that_names_no_link_is_refused_saying_so() -> None:
    headers = sign(NodeKey.generate(), HEARTBEAT, FRAME, 1_700_000_000.0, link=LINK)
    older = tuple((name, value) for name, value in headers if name != LINK_HEADER)
    with pytest.raises(AuthenticationError, match=r"names no link.*upgrade the node"):
        credentials(older)
    with pytest.raises(AuthenticationError, match="link header is malformed"):
        credentials((*older, (LINK_HEADER, "not a name!")))


async def test_a_stale_or_future_timestamp_is_refused(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    stale = credentials(sign(key, HEARTBEAT, FRAME, fake_clock.now() - 31, link=LINK))
    future = credentials(sign(key, HEARTBEAT, FRAME, fake_clock.now() + 31, link=LINK))
    edge = credentials(sign(key, HEARTBEAT, FRAME, fake_clock.now() - 29, link=LINK))
    for request in (stale, future):
        with pytest.raises(AuthenticationError, match="off the receiver's clock"):
            await gate.admit(HEARTBEAT, FRAME, request)
    await gate.admit(HEARTBEAT, FRAME, edge)
    fake_clock.advance(31)  # the future one's time has come
    await gate.admit(HEARTBEAT, FRAME, future)


async def test_a_signature_holds_for_its_own_method_and_body_only(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    with pytest.raises(AuthenticationError, match="does not match"):
        await gate.admit(HEARTBEAT, FRAME + b"!", signed(key, fake_clock))
    with pytest.raises(AuthenticationError, match="does not match"):
        await gate.admit(FleetMethod.UNREGISTER_NODE.value, FRAME, signed(key, fake_clock))
    large = bytes(200_000)  # hashed and checked off the event loop
    with pytest.raises(AuthenticationError, match="does not match"):
        await gate.admit(HEARTBEAT, large + b"!", signed(key, fake_clock, frame=large))
    await gate.admit(HEARTBEAT, large, signed(key, fake_clock, frame=large))


async def test_a_key_speaks_for_its_own_node_only(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate = NodeGate(state, fake_clock, link=LINK)
    a, b, stranger = NodeKey.generate(), NodeKey.generate("p256"), NodeKey.generate("p384")
    node_a = await state.register_node(a.public.der, heartbeat_interval=1.0)
    node_b = await state.register_node(b.public.der, heartbeat_interval=1.0)
    await gate.check_speaks_for(a.public, node_a)  # read from the state
    await gate.check_speaks_for(b.public, node_b)
    with pytest.raises(AuthenticationError, match=f"not node {node_b}'s"):
        await gate.check_speaks_for(a.public, node_b)
    with pytest.raises(NodeNotFoundError):  # a key that registered nothing: it must register
        await gate.check_speaks_for(stranger.public, node_b)


async def test_with_an_authorized_list_only_its_keys_are_admitted(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    listed, other = NodeKey.generate(), NodeKey.generate()
    gate = NodeGate(state, fake_clock, link=LINK, authorized=[listed.public])
    await gate.admit(HEARTBEAT, FRAME, signed(listed, fake_clock))
    with pytest.raises(AuthenticationError, match=other.public.fingerprint.replace("+", r"\+")):
        await gate.admit(HEARTBEAT, FRAME, signed(other, fake_clock))
    gate.authorize([other.public])  # SIGHUP re-read the list
    await gate.admit(HEARTBEAT, FRAME, signed(other, fake_clock))
    with pytest.raises(AuthenticationError, match="not among"):
        await gate.admit(HEARTBEAT, FRAME, signed(listed, fake_clock))
    gate.authorize(None)
    await gate.admit(HEARTBEAT, FRAME, signed(listed, fake_clock))


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("fedcore-node-key", "AAAA"),),
        (("fedcore-node-key", "AAAA"), ("fedcore-timestamp", "1"), ("fedcore-nonce", "0" * 32),
         ("fedcore-signature", "not base64!")),
    ],
    ids=["none", "a key alone", "malformed"],
)  # fmt: skip
def test_missing_or_malformed_signatures_are_refused(metadata: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(AuthenticationError):
        credentials(metadata)


def test_a_repeated_signature_header_is_refused() -> None:
    headers = sign(NodeKey.generate(), HEARTBEAT, FRAME, 1_700_000_000.0, link=LINK)
    with pytest.raises(AuthenticationError, match="not signed"):
        credentials((*headers, headers[0]))


async def _open(gate: NodeGate, key: NodeKey, clock: FakeClock) -> ClientSession:
    """A session opened by a signed heartbeat's offer, as the node holds it."""
    offer = Offer()
    presented = credentials(sign(key, HEARTBEAT, FRAME, clock.now(), link=LINK, offer=offer.header))
    admission = await gate.admit(HEARTBEAT, FRAME, presented)
    assert admission.public_key == key.public
    session = offer.accept(dict(admission.headers), key.public.der, clock.now())
    assert session is not None
    return session


def macd(session: ClientSession, clock: FakeClock, method: str = HEARTBEAT, frame: bytes = FRAME):
    return credentials(session.metadata(method, frame, clock.now()))


async def test_a_session_admits_macd_calls_as_its_key_once_each(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    session = await _open(gate, key, fake_clock)
    request = macd(session, fake_clock)
    admission = await gate.admit(HEARTBEAT, FRAME, request)
    assert admission.public_key == key.public
    assert admission.headers == ()
    with pytest.raises(AuthenticationError, match="replayed"):
        await gate.admit(HEARTBEAT, FRAME, request)
    with pytest.raises(AuthenticationError, match="MAC is wrong"):
        await gate.admit(HEARTBEAT, FRAME + b"!", macd(session, fake_clock))
    with pytest.raises(AuthenticationError, match="MAC is wrong"):
        await gate.admit(FleetMethod.UNREGISTER_NODE.value, FRAME, macd(session, fake_clock))
    large = bytes(200_000)  # checked off the event loop
    await gate.admit(HEARTBEAT, large, macd(session, fake_clock, frame=large))


async def test_a_session_someone_else_derived_is_refused(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    session = await _open(gate, key, fake_clock)
    # One who saw the offer and the answer knows the id and both public keys, not the key.
    forged = ClientSession(session.session_id, bytes(32), session.renew_at)
    with pytest.raises(AuthenticationError, match="MAC is wrong"):
        await gate.admit(HEARTBEAT, FRAME, macd(forged, fake_clock))
    unknown = ClientSession("A" * 22, session.key, session.renew_at)
    with pytest.raises(UnknownSessionError):
        await gate.admit(HEARTBEAT, FRAME, macd(unknown, fake_clock))


async def test_a_key_holds_a_few_sessions_and_a_new_one_ends_the_oldest(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    # A node's calls and its heartbeats go on two connections, each with a session.
    sessions = [await _open(gate, key, fake_clock) for _ in range(SESSIONS_PER_KEY)]
    for session in sessions:
        await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    newest = await _open(gate, key, fake_clock)
    with pytest.raises(UnknownSessionError):
        await gate.admit(HEARTBEAT, FRAME, macd(sessions[0], fake_clock))
    for session in [*sessions[1:], newest]:
        await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))


async def test_a_session_ends_after_its_time(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    session = await _open(gate, key, fake_clock)
    admission = await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    assert session.renew_at == fake_clock.now() + SESSION_SECONDS / 2
    fake_clock.advance(SESSION_SECONDS)
    with pytest.raises(UnknownSessionError):
        await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    with pytest.raises(UnknownSessionError):
        gate.check_session(admission)


async def test_the_gate_holds_at_most_max_sessions_and_ends_the_oldest_first(
    state: InMemoryLinkState, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_gate, "MAX_SESSIONS", 3)
    gate = NodeGate(state, fake_clock, link=LINK)
    keys = [NodeKey.generate() for _ in range(4)]
    sessions = [await _open(gate, key, fake_clock) for key in keys]
    with pytest.raises(UnknownSessionError):
        await gate.admit(HEARTBEAT, FRAME, macd(sessions[0], fake_clock))
    for session in sessions[1:]:
        await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    again = await _open(gate, keys[0], fake_clock)  # its key lost its only session: a new one
    await gate.admit(HEARTBEAT, FRAME, macd(again, fake_clock))


async def test_a_long_call_is_checked_against_its_session_frame_by_frame(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    key = NodeKey.generate()
    gate = NodeGate(state, fake_clock, link=LINK, authorized=[key.public])
    session = await _open(gate, key, fake_clock)
    admission = await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    gate.check_session(admission)
    signed = await gate.admit(
        HEARTBEAT, FRAME, credentials(sign(key, HEARTBEAT, FRAME, fake_clock.now(), link=LINK))
    )
    assert signed.seal is None
    with pytest.raises(UnknownSessionError, match="not made in a session"):
        gate.check_session(signed)
    assert admission.seal is not None
    gate.check_frame(admission, 1, FRAME, admission.seal.mac(1, FRAME))
    with pytest.raises(AuthenticationError, match="MAC of the call's frame 2"):
        gate.check_frame(admission, 2, FRAME, admission.seal.mac(1, FRAME))
    with pytest.raises(AuthenticationError, match="in a session, not signed"):
        gate.check_frame(signed, 0, FRAME, b"")
    gate.authorize([])
    with pytest.raises(AuthenticationError, match="not among"):
        gate.check_session(admission)


def test_a_frame_seal_is_good_for_one_place_in_one_call() -> None:
    seal, other = FrameSeal(bytes(32), "a" * 32), FrameSeal(bytes(32), "b" * 32)
    mac = seal.mac(3, FRAME)
    seal.verify(3, FRAME, mac)
    for number, frame, checked_by in ((2, FRAME, seal), (3, FRAME + b"!", seal), (3, FRAME, other)):
        with pytest.raises(AuthenticationError, match="MAC of the call's frame"):
            checked_by.verify(number, frame, mac)
    with pytest.raises(AuthenticationError):
        FrameSeal(bytes(range(32)), "a" * 32).verify(3, FRAME, mac)


async def test_a_session_of_a_key_taken_off_the_authorized_list_is_refused(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    key = NodeKey.generate()
    gate = NodeGate(state, fake_clock, link=LINK, authorized=[key.public])
    session = await _open(gate, key, fake_clock)
    await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))
    gate.authorize([])
    with pytest.raises(AuthenticationError, match="not among"):
        await gate.admit(HEARTBEAT, FRAME, macd(session, fake_clock))


async def test_an_offer_is_covered_by_the_signature(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    gate, key = NodeGate(state, fake_clock, link=LINK), NodeKey.generate()
    headers = dict(sign(key, HEARTBEAT, FRAME, fake_clock.now(), link=LINK, offer=Offer().header))
    headers["fedcore-session-offer"] = Offer().header  # someone else's key in its place
    with pytest.raises(AuthenticationError, match="does not match"):
        await gate.admit(HEARTBEAT, FRAME, credentials(headers.items()))
