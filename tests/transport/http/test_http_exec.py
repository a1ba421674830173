"""The exec API over HTTP on loopback: every route, and every way a signature is refused."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest

from fedcore.auth.exec_signatures import LINK, NONCE, SIGNATURE, TIMESTAMP, Signer, Verifier
from fedcore.domain import Run, RunStatus
from fedcore.errors import (
    AuthenticationError,
    ClaimLostError,
    DecodeError,
    LinkUnavailableError,
    NotFoundError,
    RunNotFoundError,
    UsageError,
    WrongLinkError,
)
from fedcore.roles.link.exec import LinkExec
from fedcore.state.base import RunClaim
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.testing.network import closed_port
from fedcore.transport.http import serve_http
from fedcore.transport.http.exec import HttpExecClient, exec_app

pytestmark = pytest.mark.anyio

SECRET = "s3cret-shared-by-the-link-and-its-execs"
NAME = "the-link"
"""The name of the link :func:`served` serves (a client learns it from its first refusal)."""
RUNTIME = "127.0.0.1:4242"
REFUSAL = {"error": "", "message": "a valid exec signature is required"}


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


class Watched(LinkExec):
    """A LinkExec that says when a call starts waiting."""

    def __init__(self, state: InMemoryLinkState, clock: FakeClock) -> None:
        super().__init__(state, clock, runtime_address=RUNTIME)
        self.waiting = anyio.Event()

    async def claim_runs(
        self, *, limit: int, lease: float, wait_seconds: float = 0.0
    ) -> list[RunClaim]:
        if wait_seconds:
            self.waiting.set()
        return await super().claim_runs(limit=limit, lease=lease, wait_seconds=wait_seconds)

    async def wait_finished(self, run_id: int, *, wait_seconds: float) -> Run:
        self.waiting.set()
        return await super().wait_finished(run_id, wait_seconds=wait_seconds)

    async def started_waiting(self) -> None:
        """Once a call waits in the service (its events subscribed), and then not any more."""
        with anyio.fail_after(5):
            await self.waiting.wait()
        await anyio.wait_all_tasks_blocked()
        self.waiting = anyio.Event()


@asynccontextmanager
async def served(
    state: InMemoryLinkState, clock: FakeClock, service: LinkExec | None = None
) -> AsyncIterator[tuple[int, HttpExecClient]]:
    """The exec API over ``state`` on 127.0.0.1, and a client holding the secret."""
    service = service or LinkExec(state, clock, runtime_address=RUNTIME)
    app = exec_app(service, SECRET, clock=clock, link=NAME)
    async with (
        serve_http(app, "127.0.0.1", 0, name="exec") as port,
        HttpExecClient("127.0.0.1", port, secret=SECRET, clock=clock) as client,
    ):
        yield port, client


async def _run(state: InMemoryLinkState, bundle: bytes = b"bundle") -> Run:
    return await state.create_run({"rounds": 3}, bundle_hash=await state.put_bundle(bundle))


# ------------------------------------------------------------------- every route


async def test_claim_start_renew_log_and_fail_a_run(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    run = await _run(state, os.urandom(3 << 20))
    async with served(state, fake_clock) as (_, client):
        assert await client.runtime_address() == RUNTIME
        (claim,) = await client.claim_runs(limit=4, lease=6.0)
        assert claim.run == await state.get_run(run.run_id)
        assert (claim.attempt, claim.expires_at) == (1, fake_clock.now() + 6.0)
        assert await state.check_run_secret(run.run_id, claim.secret) == claim.run
        assert await client.get_bundle(run.bundle_hash) == await state.get_bundle(run.bundle_hash)
        started = await client.start_run(run.run_id, claim.token, heartbeat_interval=2.0)
        assert started.status is RunStatus.RUNNING
        fake_clock.advance(1)
        assert await client.renew_claim(run.run_id, claim.token, lease=6.0) == fake_clock.now() + 6
        await client.append_logs(run.run_id, ["[exec] one", "two ✓"])
        failed = await client.fail_run(run.run_id, claim.token, "the ServerApp process died")
        assert (failed.status, failed.reason) == (RunStatus.FAILED, "the ServerApp process died")
        assert await client.get_run(run.run_id) == failed
        assert await client.claim_runs(limit=4, lease=6.0) == []
    assert [line.text for line in await state.get_logs(run.run_id)] == ["[exec] one", "two ✓"]


async def test_a_waiting_claim_is_woken_by_a_new_run(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    claims: list[RunClaim] = []
    service = Watched(state, fake_clock)
    async with (
        served(state, fake_clock, service) as (_, client),
        anyio.create_task_group() as tasks,
    ):

        async def claim() -> None:
            claims.extend(await client.claim_runs(limit=1, lease=5.0, wait_seconds=60))

        tasks.start_soon(claim)
        await service.started_waiting()
        run = await _run(state)  # no time passes: the run's creation answers the claim
    assert [(c.run.run_id, c.run.status) for c in claims] == [(run.run_id, RunStatus.STARTING)]


async def test_a_wait_for_the_end_is_woken_by_a_stop_and_otherwise_ends_on_the_clock(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    run = await _run(state)
    service = Watched(state, fake_clock)
    async with served(state, fake_clock, service) as (_, client):
        (claim,) = await client.claim_runs(limit=1, lease=50.0)
        ended: list[Run] = []
        async with anyio.create_task_group() as tasks:

            async def wait() -> None:
                ended.append(await client.wait_finished(run.run_id, wait_seconds=30))

            tasks.start_soon(wait)
            await service.started_waiting()
            fake_clock.advance(30)
        assert [r.status for r in ended] == [RunStatus.STARTING]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait)
            await service.started_waiting()
            await state.update_run_status(run.run_id, RunStatus.STOPPED, "operator")
        assert [(r.status, r.reason) for r in ended[1:]] == [(RunStatus.STOPPED, "operator")]
        with pytest.raises(ClaimLostError):
            await client.renew_claim(run.run_id, claim.token, lease=5.0)


async def test_errors_cross_as_the_same_errors(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    run = await _run(state)
    async with served(state, fake_clock) as (_, client):
        (stale,) = await client.claim_runs(limit=1, lease=5.0)
        fake_clock.advance(5.1)
        (fresh,) = await client.claim_runs(limit=1, lease=5.0)
        with pytest.raises(ClaimLostError):
            await client.start_run(run.run_id, stale.token, heartbeat_interval=1.0)
        with pytest.raises(ClaimLostError):
            await client.fail_run(run.run_id, stale.token, "stale")
        assert (await client.get_run(run.run_id)).status is RunStatus.STARTING
        assert fresh.token > stale.token
        with pytest.raises(RunNotFoundError):
            await client.get_run(run.run_id + 1)
        with pytest.raises(RunNotFoundError):
            await client.append_logs(run.run_id + 1, ["x"])
        with pytest.raises(NotFoundError):
            await client.get_bundle("ab" * 32)
        with pytest.raises(DecodeError):
            await client.claim_runs(limit=1, lease=-1.0)
        with pytest.raises(ValueError, match="not a bundle hash"):
            await client.get_bundle("../../etc/passwd")


async def test_a_link_that_is_not_there_is_unavailable(fake_clock: FakeClock) -> None:
    port = closed_port()
    async with HttpExecClient("127.0.0.1", port, secret=SECRET, clock=fake_clock) as client:
        with pytest.raises(LinkUnavailableError):
            await client.runtime_address()


# ------------------------------------------------------------------- refusals


class Raw:
    """Requests sent by hand, signed (or not) as each test needs."""

    def __init__(self, session: aiohttp.ClientSession, port: int, clock: FakeClock) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"
        self.clock = clock

    def signed(
        self, method: str, path: str, body: bytes = b"", secret: str = SECRET
    ) -> dict[str, str]:
        return Signer(secret, self.clock, link=NAME).headers(method, path, body)

    async def send(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, Any]:
        status, document, _ = await self.answer(method, path, headers, body)
        return status, document

    async def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, Any, Mapping[str, str]]:
        """The status, the JSON document and the headers of the answer."""
        async with self.session.request(
            method, self.base + path, headers=headers, data=body or None
        ) as response:
            text = await response.read()
            document = json.loads(text) if text else None
            return response.status, document, dict(response.headers)


@pytest.fixture
async def raw(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> AsyncIterator[tuple[Raw, InMemoryLinkState]]:
    async with served(state, fake_clock) as (port, _), aiohttp.ClientSession() as session:
        yield Raw(session, port, fake_clock), state


CLAIM = b'{"limit":1,"lease":5.0,"wait_seconds":0}'


async def _refused(
    raw: Raw,
    state: InMemoryLinkState,
    headers: dict[str, str],
    *,
    path: str = "/v1/exec/claims",
    body: bytes = CLAIM,
) -> None:
    """The claim request is answered with the one refusal, and nothing was claimed."""
    assert await raw.send("POST", path, headers, body) == (401, REFUSAL)
    assert [run.status for run in await state.list_runs()] == [RunStatus.PENDING]


async def test_a_correctly_signed_request_is_answered(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    await _run(state)
    status, document = await client.send(
        "POST", "/v1/exec/claims", client.signed("POST", "/v1/exec/claims", CLAIM), CLAIM
    )
    assert status == 200
    assert len(document["claims"]) == 1


async def test_a_wrong_secret_is_refused(raw: tuple[Raw, InMemoryLinkState]) -> None:
    client, state = raw
    await _run(state)
    headers = client.signed("POST", "/v1/exec/claims", CLAIM, secret=SECRET + "x")
    await _refused(client, state, headers)


async def test_a_tampered_body_path_or_method_is_refused(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    await _run(state)
    headers = client.signed("POST", "/v1/exec/claims", CLAIM)
    await _refused(client, state, headers, body=CLAIM.replace(b'"limit":1', b'"limit":9'))
    headers = client.signed("POST", "/v1/exec/claims", CLAIM)
    await _refused(client, state, headers, path="/v1/exec/claims?more=1")
    headers = client.signed("PUT", "/v1/exec/claims", CLAIM)
    await _refused(client, state, headers)


async def test_a_stale_or_future_timestamp_is_refused(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    await _run(state)
    for offset in (-31, 32):
        elsewhere = FakeClock(client.clock.now() + offset)
        headers = Signer(SECRET, elsewhere, link=NAME).headers("POST", "/v1/exec/claims", CLAIM)
        await _refused(client, state, headers)
    within = FakeClock(client.clock.now() - 29)
    headers = Signer(SECRET, within, link=NAME).headers("POST", "/v1/exec/claims", CLAIM)
    status, _ = await client.send("POST", "/v1/exec/claims", headers, CLAIM)
    assert status == 200


async def test_a_replayed_request_is_refused_while_its_timestamp_is_fresh(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    run = await _run(state)
    path = f"/v1/exec/runs/{run.run_id}"
    headers = client.signed("GET", path)
    assert (await client.send("GET", path, headers))[0] == 200
    assert await client.send("GET", path, headers) == (401, REFUSAL)
    client.clock.advance(31)
    assert await client.send("GET", path, headers) == (401, REFUSAL)  # stale by now


async def test_a_missing_or_malformed_header_is_refused(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    await _run(state)
    for name in (TIMESTAMP, NONCE, LINK, SIGNATURE):
        headers = client.signed("POST", "/v1/exec/claims", CLAIM)
        del headers[name]
        await _refused(client, state, headers)
    await _refused(client, state, {})
    malformed = [(TIMESTAMP, "1e9"), (NONCE, "short"), (LINK, "a name?"), (SIGNATURE, "Z" * 64)]
    for name, value in malformed:
        headers = client.signed("POST", "/v1/exec/claims", CLAIM)
        headers[name] = value
        await _refused(client, state, headers)


async def test_every_route_requires_a_signature(raw: tuple[Raw, InMemoryLinkState]) -> None:
    client, state = raw
    run = await _run(state)
    base = f"/v1/exec/runs/{run.run_id}"
    routes = [("GET", "/v1/exec/link"), ("POST", "/v1/exec/claims"), ("GET", base)]
    routes += [("POST", f"{base}/{verb}") for verb in ("renew", "start", "fail", "wait", "logs")]
    routes += [("GET", f"/v1/exec/bundles/{run.bundle_hash}")]
    for method, path in routes:
        assert await client.send(method, path, {}, b"{}" if method == "POST" else b"") == (
            401,
            REFUSAL,
        ), path
    assert (await state.get_run(run.run_id)).status is RunStatus.PENDING
    assert await state.get_logs(run.run_id) == []


async def test_a_client_with_the_wrong_secret_is_told_it_was_refused(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    async with (
        served(state, fake_clock) as (port, _),
        HttpExecClient("127.0.0.1", port, secret="not it", clock=fake_clock) as client,
    ):
        with pytest.raises(UsageError, match="refused the request"):
            await client.runtime_address()


async def test_a_request_signed_for_another_link_is_refused_with_this_links_name(
    raw: tuple[Raw, InMemoryLinkState],
) -> None:
    client, state = raw
    await _run(state)
    for named in ("another-link", "-"):  # one captured elsewhere, or an exec's first
        headers = Signer(SECRET, client.clock, link=named).headers("POST", "/v1/exec/claims", CLAIM)
        status, document, answered = await client.answer("POST", "/v1/exec/claims", headers, CLAIM)
        assert (status, document, answered[LINK]) == (401, REFUSAL, NAME)
    assert [run.status for run in await state.list_runs()] == [RunStatus.PENDING]


def test_a_request_captured_before_a_restart_is_refused_after_it() -> None:
    clock, path = FakeClock(), "/v1/exec/claims"
    before, after = Verifier(SECRET, clock), Verifier(SECRET, clock)  # a name each start
    assert before.link != after.link
    captured = Signer(SECRET, clock, link=before.link).headers("POST", path, CLAIM)
    before.verify(before.parse(captured), "POST", path, CLAIM)
    with pytest.raises(WrongLinkError, match="before the link restarted") as refused:
        after.verify(after.parse(captured), "POST", path, CLAIM)
    assert refused.value.link == after.link
    older = {name: value for name, value in captured.items() if name != LINK}
    with pytest.raises(AuthenticationError, match=r"names no link.*upgrade the exec"):
        after.parse(older)  # an exec from before links had names


async def test_a_client_learns_the_links_name_and_again_after_a_restart(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    service = LinkExec(state, fake_clock, runtime_address=RUNTIME)
    first, second = (exec_app(service, SECRET, clock=fake_clock) for _ in range(2))
    async with serve_http(first, "127.0.0.1", 0, name="exec") as port:
        client = HttpExecClient("127.0.0.1", port, secret=SECRET, clock=fake_clock)
        async with client:
            assert await client.runtime_address() == RUNTIME  # refused once, then told
            assert await client.runtime_address() == RUNTIME
    async with serve_http(second, "127.0.0.1", port, name="exec"), client:
        assert await client.runtime_address() == RUNTIME


# ------------------------------------------------------------------- the nonce memory


def test_nonces_are_remembered_for_their_window_only() -> None:
    clock = FakeClock()
    verifier = Verifier(SECRET, clock, max_skew=30, max_nonces=3, link=NAME)
    signer = Signer(SECRET, clock, link=NAME)

    def accept() -> None:
        headers = signer.headers("GET", "/v1/exec/link", b"")
        verifier.verify(verifier.parse(headers), "GET", "/v1/exec/link", b"")

    for _ in range(3):
        accept()
    assert verifier.remembered == 3
    with pytest.raises(AuthenticationError, match="over 3 requests"):
        accept()
    clock.advance(31)  # every nonce so far is too old to be replayed: forgotten
    accept()
    assert verifier.remembered == 1


def test_a_verifier_refuses_unsound_settings() -> None:
    with pytest.raises(ValueError, match="max_skew"):
        Verifier(SECRET, FakeClock(), max_skew=0)
    with pytest.raises(ValueError, match="empty"):
        Verifier("", FakeClock())
