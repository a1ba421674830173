"""Requests captured at a link and replayed after it restarted, or at another link, on processes.

A link forgets the nonces it has seen when its process ends, and every signature names
the link it is meant for by a name new at each start (:mod:`fedcore.auth.stamps`).
So a signed PullMessages of a node's, and an exec's signed claim of runs, captured
before the link was killed (SIGKILL) and restarted on the same database, are refused
after the restart; a registration captured at one link is refused at another; and
the nodes, which learn the link's new name, carry a run to its end beside them.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import aiohttp
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from fedcore.auth.exec_signatures import LINK, Signer
from fedcore.auth.keys import NodeKey
from fedcore.auth.secret_files import read_node_key, read_secret
from fedcore.auth.signatures import sign
from fedcore.runtime.addresses import parse_address
from fedcore.testing import FakeClock
from fedcore.testing.deployment import Deployment, Server
from fedcore.testing.stranger import link_name
from fedcore.transport.grpc.frames import RawCodec
from fedcore.wire import rpc as wire
from fedcore.wire.rpc import FleetMethod

RECORD_APP = Path(__file__).resolve().parent / "record_app"
PULL, REGISTER = FleetMethod.PULL_MESSAGES, FleetMethod.REGISTER_NODE
CLAIMS, CLAIM = "/v1/exec/claims", b'{"limit": 1, "lease": 5.0, "wait_seconds": 0}'

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def fleet_port(link: Server) -> int:
    return parse_address(link.address("fleet"), what="fleet").port


def node_id_of(server: Server) -> int:
    found = re.search(r"registered with the link as node (\d+)", server.tail(200))
    assert found, server.tail()
    return int(found.group(1))


async def call(port: int, method: FleetMethod, frame: bytes, metadata: object) -> bytes:
    """``frame`` sent on a unary call with exactly ``metadata``: a captured call, again."""
    async with Channel("127.0.0.1", port, codec=RawCodec()) as channel:
        stream = channel.request(
            method.value, Cardinality.UNARY_UNARY, bytes, bytes, metadata=metadata
        )
        async with stream:
            await stream.send_message(frame, end=True)
            answer = await stream.recv_message()
    assert answer is not None
    return answer


async def exec_call(link: Server, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """A claim of runs on the link's exec API with exactly ``headers``: its status, headers."""
    url = f"http://{link.address('exec')}{CLAIMS}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=CLAIM, headers={**headers, "Content-Type": "application/json"}
        ) as response,
    ):
        await response.read()
        return response.status, dict(response.headers)


async def refusal(port: int, method: FleetMethod, frame: bytes, metadata: object) -> str:
    """Why the link refused the call, which it must."""
    with pytest.raises(GRPCError) as refused:
        await call(port, method, frame, metadata)
    assert refused.value.status is Status.UNAUTHENTICATED, refused.value
    return refused.value.message or ""


async def test_requests_replayed_after_a_link_restart_or_at_another_link_are_refused(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path / "other") as elsewhere, Deployment(tmp_path / "here") as here:
        link = here.start_link(
            "--exec-address", "127.0.0.1:0", "--exec-secret-file", str(here.exec_secret_file)
        )  # fmt: skip
        node = here.start_node("partition-id=0 num-partitions=2")
        here.start_node("partition-id=1 num-partitions=2")
        port, node_id = fleet_port(link), node_id_of(node)
        key = read_node_key(here.root / "node0" / "node.key")

        # A signed PullMessages of node 0's, as it crossed the network, answered once.
        # Stamped 20 s ahead (a node's clock may be): a slow restart stays in its window.
        pull = wire.encode_pull_messages_request(node_id, 10, None, 0.0)
        captured = sign(key, PULL.value, pull, time.time() + 20, link=await link_name(port))
        await call(port, PULL, pull, captured)
        # And an exec's claim of runs, whose answer carries their launch secrets.
        secret = read_secret(here.exec_secret_file, what="exec secret")
        now = FakeClock(time.time())
        told = await exec_call(link, Signer(secret, now).headers("POST", CLAIMS, CLAIM))
        name = told[1][LINK]  # as an exec learns it: from the refusal of its first request
        ahead = FakeClock(time.time() + 20)
        exec_captured = Signer(secret, ahead, link=name).headers("POST", CLAIMS, CLAIM)
        assert (await exec_call(link, exec_captured))[0] == 200

        here.kill(link)
        link = here.restart_link()
        assert "before the link restarted" in await refusal(port, PULL, pull, captured)
        status, answered = await exec_call(link, exec_captured)
        assert status == 401
        assert answered.get(LINK) not in (None, name)  # refused with the new link's name

        # A registration captured at another link registers no phantom node here.
        other = fleet_port(elsewhere.start_link())
        register = wire.encode_register_node_request({}, 1.0)
        named = await link_name(other)
        at_other = sign(NodeKey.generate(), REGISTER.value, register, time.time(), link=named)
        await call(other, REGISTER, register, at_other)
        assert "meant for another link" in await refusal(port, REGISTER, register, at_other)
        listed = json.loads(here.fedcore("ls", "--nodes", "--json").stdout)
        assert len(listed) == 2, listed

        # The nodes learned the restarted link's name: a run over both completes.
        done = here.fedcore("run", str(RECORD_APP), "--stream", "--run-config", "rounds=1")
        assert done.returncode == 0, done.stdout + done.stderr + link.tail()
        assert re.search(r"run \d+ finished:completed", done.stderr)
        assert "refused a PULL_MESSAGES call: the request is signed for the link" in link.tail(400)
