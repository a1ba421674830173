"""Node identity by key, probed on real processes: a link, two nodes, and strangers on loopback.

Each probe is what someone who can reach the link's fleet port would try: knowing
node B's id (printed in logs, listed by ``fedcore ls --nodes``) but not B's key, or
holding node A's key, or a captured request of B's. None may act as B; B and a run
beside them carry on.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from fedcore.auth.keys import NodeKey
from fedcore.auth.secret_files import read_node_key
from fedcore.auth.signatures import sign
from fedcore.domain import Message, Metadata, RecordDict
from fedcore.domain.fleet import Digest
from fedcore.domain.message import assemble_message
from fedcore.errors import AuthenticationError, NodeNotFoundError
from fedcore.runtime.addresses import parse_address
from fedcore.testing.deployment import Deployment, Server
from fedcore.testing.stranger import link_name
from fedcore.testing.waiting import wait_until
from fedcore.transport.grpc import GrpcFleetClient
from fedcore.transport.grpc.frames import RawCodec
from fedcore.wire import rpc as wire
from fedcore.wire.rpc import FleetMethod

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def node_id_of(server: Server) -> int:
    found = re.search(r"registered with the link as node (\d+)", server.tail(200))
    assert found, server.tail()
    return int(found.group(1))


async def refused_as_b(client: GrpcFleetClient, b: int) -> None:
    """Every fleet call about node ``b`` that ``client`` (not B) may try; each must be refused."""
    sent = Metadata(run_id=1, message_id="f" * 32, dst_node_id=b, created_at=time.time(),
                    message_type="train")  # fmt: skip
    reply = Message(RecordDict(), reply_to=assemble_message(sent, content=RecordDict()))
    probes = {
        "heartbeat": lambda: client.heartbeat(b, 1.0),
        "pull": lambda: client.pull_messages(b, limit=10),
        "push": lambda: client.push_reply(b, reply),
        "run": lambda: client.get_run(b, 1),
        "unregister": lambda: client.unregister_node(b),
        "payload up": lambda: client.push_payload(b, "m", Digest.of([b"x"]), [b"x"]),
    }
    for name, probe in probes.items():
        try:
            await probe()
        except (AuthenticationError, NodeNotFoundError):
            continue
        pytest.fail(f"{name} about node B was not refused")
    for download in (client.get_bundle(b, 1), client.pull_payload(b, "p")):
        with pytest.raises((AuthenticationError, NodeNotFoundError)):
            async with download:
                pass


async def raw_call(port: int, method: FleetMethod, frame: bytes, metadata: object) -> bytes:
    async with Channel("127.0.0.1", port, codec=RawCodec()) as channel:
        stream = channel.request(
            method.value, Cardinality.UNARY_UNARY, bytes, bytes, metadata=metadata
        )
        async with stream:
            await stream.send_message(frame, end=True)
            answer = await stream.recv_message()
    assert answer is not None
    return answer


async def test_nobody_but_node_b_speaks_for_node_b(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as federation:
        link = federation.start_link()
        assert federation.fedcore("keygen", str(tmp_path / "b")).returncode == 0
        b_key_file = tmp_path / "b.key"
        node_b = federation.start_node(
            "partition-id=0 num-partitions=2", "--auth-key", str(b_key_file)
        )
        node_a = federation.start_node("partition-id=1 num-partitions=2")
        b, a = node_id_of(node_b), node_id_of(node_a)
        listed = json.loads(federation.fedcore("ls", "--nodes", "--json").stdout)
        assert {int(node["node_id"]) for node in listed} == {a, b}  # B's id is no secret
        fleet = parse_address(link.address("fleet"), what="fleet")
        port = fleet.port

        # A stranger with a key of its own, before and after it registers itself.
        async with GrpcFleetClient(fleet.host, port) as stranger:
            await refused_as_b(stranger, b)
            own = await stranger.register_node({}, 1.0)
            assert own not in (a, b)
            await refused_as_b(stranger, b)
            await stranger.unregister_node(own)

        # Node A's own key (from its work directory) cannot speak for B either.
        a_key = read_node_key(tmp_path / "node1" / "node.key")
        async with GrpcFleetClient(fleet.host, port, key=a_key) as as_a:
            assert await as_a.register_node({}, 1.0) == a, "A's key is A"
            await refused_as_b(as_a, b)

        # B's key registering again (a lost answer) is B, not a second node.
        b_key = NodeKey.from_pem(b_key_file.read_bytes())
        async with GrpcFleetClient(fleet.host, port, key=b_key) as again:
            assert await again.register_node({}, 1.0) == b

        # A request of B's, captured and sent again, or late, is refused.
        frame, name = wire.encode_heartbeat_request(b, 1.0, (), None), await link_name(port)
        beat, unregister = FleetMethod.HEARTBEAT.value, FleetMethod.UNREGISTER_NODE.value
        captured = sign(b_key, beat, frame, time.time(), link=name)
        await raw_call(port, FleetMethod.HEARTBEAT, frame, captured)
        for metadata, why in (
            (captured, "replayed"),
            (sign(b_key, beat, frame, time.time() - 60, link=name), "clock"),
            (sign(b_key, unregister, frame, time.time(), link=name), "does not match"),
        ):
            with pytest.raises(GRPCError) as refused:
                await raw_call(port, FleetMethod.HEARTBEAT, frame, metadata)
            assert refused.value.status is Status.UNAUTHENTICATED
            assert why in (refused.value.message or "")

        # B is still there, and a run over both nodes completes.
        listed = json.loads(federation.fedcore("ls", "--nodes", "--json").stdout)
        assert {int(node["node_id"]) for node in listed} == {a, b}
        config = "num-server-rounds=2 fraction-train=1.0 fraction-evaluate=1.0"
        done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", config)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"run \d+ finished:completed", done.stderr)
        assert "refused a request about node" in link.tail(400)


def test_with_an_authorized_list_only_its_nodes_join_and_sighup_rereads_it(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as federation:
        for name in ("listed", "later"):
            assert federation.fedcore("keygen", str(tmp_path / name)).returncode == 0
        authorized = tmp_path / "authorized_nodes"
        authorized.write_text(
            "# the nodes of this federation\n" + (tmp_path / "listed.pub").read_text()
        )
        link = federation.start_link("--authorized-nodes", str(authorized))
        federation.start_node("partition-id=0", "--auth-key", str(tmp_path / "listed.key"))
        with pytest.raises(RuntimeError, match="not among the link's authorized nodes") as refused:
            federation.start_node("partition-id=1", "--auth-key", str(tmp_path / "later.key"))
        assert "Traceback" not in str(refused.value)

        with authorized.open("a") as listing:
            listing.write((tmp_path / "later.pub").read_text())
        link.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "re-read from" in link.tail(200), 30, link.tail)
        later = federation.start_node("partition-id=1", "--auth-key", str(tmp_path / "later.key"))
        assert node_id_of(later) > 0
        listed = json.loads(federation.fedcore("ls", "--nodes", "--json").stdout)
        assert len(listed) == 2

        # A link with the list ends on SIGTERM as one without does (it spun at 100 % CPU).
        for node in [server for server in federation.servers if server.name.startswith("node")]:
            federation.stop(node)
        link.process.send_signal(signal.SIGTERM)
        assert link.process.wait(timeout=15) == 0, link.tail()


def test_a_bad_authorized_nodes_file_stops_the_link_naming_the_line(tmp_path: Path) -> None:
    authorized = tmp_path / "authorized_nodes"
    authorized.write_text("# fine\n\nssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ not-a-key\n")
    with (
        Deployment(tmp_path) as federation,
        pytest.raises(RuntimeError, match=r"authorized_nodes:3: not a public key"),
    ):
        federation.start_link("--authorized-nodes", str(authorized))


def test_fedcore_nodes_adds_and_removes_keys_while_the_link_runs(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as federation:
        for name in ("first", "second"):
            assert federation.fedcore("keygen", str(tmp_path / name)).returncode == 0
        authorized = tmp_path / "authorized_nodes"
        authorized.write_text((tmp_path / "first.pub").read_text())
        federation.start_link("--authorized-nodes", str(authorized))
        listed = federation.fedcore("nodes", "list")
        assert listed.returncode == 0, listed.stderr
        assert len(listed.stdout.splitlines()) == 1

        added = federation.fedcore("nodes", "add", str(tmp_path / "second.pub"))
        assert added.returncode == 0, added.stderr
        assert len(added.stdout.splitlines()) == 2
        assert "fedcore-node second" in authorized.read_text()  # the file says so too
        second = federation.start_node("partition-id=1", "--auth-key", str(tmp_path / "second.key"))
        assert node_id_of(second) > 0

        removed = federation.fedcore("nodes", "remove", str(tmp_path / "second.pub"))
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.splitlines() == listed.stdout.splitlines()
        # Its next request is refused: the node stops, saying why.
        wait_until(lambda: second.process.poll() is not None, 30, second.tail)
        assert "not among the link's authorized nodes" in second.tail()

        bad = federation.fedcore("nodes", "add", "ssh-ed25519 not-a-key")
        assert bad.returncode == 2
        assert "not a public key" in bad.stderr
        assert "Traceback" not in bad.stderr


def test_fedcore_nodes_on_a_link_that_trusts_any_key_says_so(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        listed = federation.fedcore("nodes", "list")
        assert listed.returncode == 2
        assert "--authorized-nodes" in listed.stderr
        assert "Traceback" not in listed.stderr
