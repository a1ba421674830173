"""TLS on the fleet API: nodes verify the link's certificate; plaintext exposure is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import FEDCORE, Deployment

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"

pytestmark = pytest.mark.timeout(120)


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for 127.0.0.1, and its key."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[Deployment, Path]]:
    cert, key = _certificate(tmp_path, "link")
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
        yield deployment, cert


def test_nodes_that_trust_the_link_run_an_app_over_tls(secured: tuple[Deployment, Path]) -> None:
    deployment, cert = secured
    for index in range(2):
        deployment.start_node(f"partition-id={index}", "--root-certificates", str(cert))
    done = deployment.fedcore(
        "run", str(CHAOS_APP), "--stream", "--json", "--run-config", "rounds=2 min-nodes=2"
    )
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout.splitlines()[-1])
    assert final["status"] == "finished:completed"


REGISTER = """
import sys, anyio
from pathlib import Path
from fedcore.runtime.tls import client_context
from fedcore.transport.grpc.client import GrpcFleetClient

async def main(host, port, ca):
    ssl = client_context(Path(ca), alpn=["h2"]) if ca else None
    async with GrpcFleetClient(host, int(port), ssl=ssl) as fleet:
        print(await fleet.register_node({}, 1.0))

anyio.run(main, *sys.argv[1:])
"""


def _register(address: str, ca: Path | None) -> subprocess.CompletedProcess[str]:
    """Register from a client process of its own, as a node would, trusting ``ca``."""
    host, port = address.rsplit(":", 1)
    return subprocess.run(
        [sys.executable, "-c", REGISTER, host, port, str(ca or "")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_client_with_another_ca_or_without_tls_is_refused_and_the_link_stays_up(
    secured: tuple[Deployment, Path], tmp_path: Path
) -> None:
    deployment, cert = secured
    assert deployment.link is not None
    fleet = deployment.link.address("fleet")
    stranger, _ = _certificate(tmp_path, "stranger")
    untrusted = _register(fleet, stranger)
    assert "LinkUnavailableError" in untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    plaintext = _register(fleet, None)
    assert "LinkUnavailableError" in plaintext.stderr
    trusted = _register(fleet, cert)
    assert trusted.returncode == 0, trusted.stderr
    assert int(trusted.stdout) > 0


def test_a_listener_other_machines_can_reach_needs_tls_or_insecure(tmp_path: Path) -> None:
    refused = subprocess.run(
        [str(FEDCORE), "serve", "--role", "link", "--fleet-address", "0.0.0.0:0",
         "--control-address", "127.0.0.1:0", "--database", ":memory:"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "reachable from other machines but has no TLS" in refused.stderr
    assert "--insecure" in refused.stderr


def test_a_link_asking_for_client_certificates_takes_nodes_that_present_one(
    tmp_path: Path,
) -> None:
    """Mutual TLS: the link's CA here is the node's own self-signed certificate."""
    cert, key = _certificate(tmp_path, "link")
    client_cert, client_key = _certificate(tmp_path, "node")
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link(
            "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(key),
            "--ssl-ca-certfile", str(client_cert),
        )  # fmt: skip
        deployment.start_node(
            "partition-id=0",
            "--root-certificates", str(cert),
            "--ssl-certfile", str(client_cert),
            "--ssl-keyfile", str(client_key),
        )  # fmt: skip
        listed = deployment.fedcore("ls", "--nodes", "--json")
        assert listed.returncode == 0, listed.stderr
        assert len(json.loads(listed.stdout)) == 1
        assert deployment.link is not None
        without = _register(deployment.link.address("fleet"), cert)
        assert "LinkUnavailableError" in without.stderr, "no client certificate: refused"


def test_the_control_api_over_tls_takes_commands_that_trust_it(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, "control")
    stranger, _ = _certificate(tmp_path, "stranger")
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link(
            "--control-ssl-certfile", str(cert), "--control-ssl-keyfile", str(key)
        )
        deployment.start_node("partition-id=0")
        trusted = deployment.fedcore("ls", "--nodes", "--json", "--root-certificates", str(cert))
        assert trusted.returncode == 0, trusted.stderr
        assert len(json.loads(trusted.stdout)) == 1
        untrusted = deployment.fedcore("ls", "--root-certificates", str(stranger))
        assert untrusted.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
        assert "Traceback" not in untrusted.stderr
        plaintext = deployment.fedcore("ls")  # http:// to an https:// listener
        assert plaintext.returncode != 0
        assert "Traceback" not in plaintext.stderr
        anonymous = deployment.fedcore("ls", "--root-certificates", str(cert), token=False)
        assert anonymous.returncode == 2
        assert "no token was sent" in anonymous.stderr


def test_a_control_address_other_machines_can_reach_needs_tls_or_insecure(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "link.ready"
    refused = subprocess.run(
        [str(FEDCORE), "serve", "--role", "link", "--fleet-address", "127.0.0.1:0",
         "--control-address", "0.0.0.0:0", "--database", ":memory:",
         "--ready-file", str(ready)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line == (
        "error: the control address 0.0.0.0:0 is reachable from other machines but has no "
        "TLS: give --control-ssl-certfile/--control-ssl-keyfile, listen on 127.0.0.1, or pass "
        "--insecure to accept plaintext"
    )
    assert not ready.exists(), "it never listened"
    assert not (tmp_path / ".fedcore-link").exists(), "it stopped before making anything"


def test_a_command_sends_no_token_in_plaintext_to_another_machine(tmp_path: Path) -> None:
    # Refused before any connection: 192.0.2.1 (TEST-NET-1) is never dialled.
    for command in (["ls"], ["log", "1"], ["stop", "1"]):
        refused = subprocess.run(
            [str(FEDCORE), *command, "--link", "192.0.2.1:9093"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
        )  # fmt: skip
        assert refused.returncode == 2
        (line,) = refused.stderr.splitlines()
        assert "is on another machine: give --root-certificates" in line
        assert "--insecure" in line
