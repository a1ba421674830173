"""The one admission path: each API's door reads its credential before the body, then checks it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from fedcore.auth.admission import Arrival, Door, admit, bearer
from fedcore.auth.control_token import BearerToken
from fedcore.auth.exec_signatures import Signer, Verifier
from fedcore.auth.fleet_gate import Admission, NodeGate
from fedcore.auth.keys import NodeKey
from fedcore.auth.signatures import sign
from fedcore.errors import AuthenticationError, WrongLinkError
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.wire.rpc import FleetMethod

pytestmark = pytest.mark.anyio

LINK = "the-link"
SECRET = "a shared secret"
TOKEN = "a control token"
PULL = FleetMethod.PULL_MESSAGES.value
FRAME = b"\x08\x01 a pull"


@dataclass
class Body:
    """A request body that counts how often it is read."""

    data: bytes
    reads: int = field(default=0)

    async def __call__(self) -> bytes:
        self.reads += 1
        return self.data


@dataclass(frozen=True)
class Api:
    """One API's door, and how a request to it is signed."""

    name: str
    door: Callable[[InMemoryLinkState, FakeClock], Door[Any, Any]]
    signed: Callable[[FakeClock, bytes], Mapping[str, str]]
    method: str
    path: str
    reads_body: bool


def _fleet_headers(clock: FakeClock, frame: bytes) -> Mapping[str, str]:
    return dict(sign(NodeKey.generate(), PULL, frame, clock.now(), link=LINK))


def _exec_headers(clock: FakeClock, body: bytes) -> Mapping[str, str]:
    return Signer(SECRET, clock, link=LINK).headers("POST", "/v1/exec/claims", body)


APIS = [
    Api(
        "fleet",
        lambda state, clock: NodeGate(state, clock, link=LINK),
        _fleet_headers,
        PULL,
        "",
        reads_body=True,
    ),
    Api(
        "exec",
        lambda state, clock: Verifier(SECRET, clock, link=LINK),
        _exec_headers,
        "POST",
        "/v1/exec/claims",
        reads_body=True,
    ),
    Api(
        "control",
        lambda state, clock: BearerToken(TOKEN),
        lambda clock, body: {"Authorization": f"Bearer {TOKEN}"},
        "GET",
        "/v1/runs",
        reads_body=False,
    ),
]


@pytest.fixture
async def state(fake_clock: FakeClock) -> InMemoryLinkState:
    async with InMemoryLinkState(fake_clock) as entered:
        return entered


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
async def test_a_request_with_its_credential_is_admitted_reading_its_body_once_at_most(
    api: Api, state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    body = Body(FRAME)
    arrival = Arrival(api.method, api.signed(fake_clock, FRAME), body, api.path)
    admitted = await admit(api.door(state, fake_clock), arrival)
    assert body.reads == (1 if api.reads_body else 0)
    if api.name == "fleet":
        frame, admission = admitted
        assert frame == FRAME
        assert isinstance(admission, Admission)
    elif api.name == "exec":
        assert admitted == FRAME


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-the-token", "X-Fedcore-Signature": "00"}],
    ids=["none", "malformed"],
)
async def test_a_request_without_its_credential_is_refused_before_its_body_is_read(
    api: Api, headers: Mapping[str, str], state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    body = Body(FRAME)
    with pytest.raises(AuthenticationError):
        await admit(api.door(state, fake_clock), Arrival(api.method, headers, body, api.path))
    assert body.reads == 0


@pytest.mark.parametrize("api", [api for api in APIS if api.reads_body], ids=lambda a: a.name)
async def test_a_body_other_than_the_one_signed_is_refused(
    api: Api, state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    headers = api.signed(fake_clock, FRAME)
    arrival = Arrival(api.method, headers, Body(FRAME + b"!"), api.path)
    with pytest.raises(AuthenticationError):
        await admit(api.door(state, fake_clock), arrival)


@pytest.mark.parametrize("api", [api for api in APIS if api.reads_body], ids=lambda a: a.name)
async def test_a_request_signed_for_another_link_is_refused_naming_this_one(
    api: Api, state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    door = api.door(state, fake_clock)
    other = "another-link"
    if api.name == "fleet":
        headers: Mapping[str, str] = dict(
            sign(NodeKey.generate(), PULL, FRAME, fake_clock.now(), link=other)
        )
    else:
        headers = Signer(SECRET, fake_clock, link=other).headers(api.method, api.path, FRAME)
    with pytest.raises(WrongLinkError) as refused:
        await admit(door, Arrival(api.method, headers, Body(FRAME), api.path))
    assert refused.value.link == LINK


def test_a_bearer_credential_is_read_from_authorization_only_with_its_scheme() -> None:
    assert bearer({"Authorization": "Bearer  abc "}) == "abc"
    assert bearer({"Authorization": "bearer abc"}) == "abc"
    assert bearer({"Authorization": "Basic abc"}) == ""
    assert bearer({"Authorization": b"Bearer abc"}) == ""
    assert bearer({}) == ""


def test_a_control_door_needs_a_token() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        BearerToken("")


async def test_a_wrong_control_token_is_refused_as_a_missing_one(fake_clock: FakeClock) -> None:
    arrival = Arrival("GET", {"Authorization": f"Bearer {TOKEN}x"}, Body(b""), "/v1/runs")
    with pytest.raises(AuthenticationError, match="a valid bearer token is required"):
        await admit(BearerToken(TOKEN), arrival)
