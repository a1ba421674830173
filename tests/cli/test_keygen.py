"""``fedcore keygen`` as a user runs it: the files it writes, their modes, and what it refuses."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from fedcore.auth.keys import KEY_KINDS, NodeKey, PublicKey
from fedcore.cli.keygen import KINDS
from fedcore.testing.deployment import FEDCORE


def keygen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "keygen", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("kind", KINDS)
def test_keygen_writes_a_private_key_only_its_owner_reads_and_its_public_key(
    tmp_path: Path, kind: str
) -> None:
    done = keygen(str(tmp_path / "site-a"), "--kind", kind)
    assert done.returncode == 0, done.stderr
    private, public = tmp_path / "site-a.key", tmp_path / "site-a.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = NodeKey.from_pem(private.read_bytes())
    assert key.public.kind == kind
    line = public.read_text()
    assert line.count("\n") == 1
    assert line.rstrip().endswith("fedcore-node site-a")
    assert PublicKey.parse(line) == key.public
    assert key.public.fingerprint in done.stdout


def test_keygen_never_replaces_a_key(tmp_path: Path) -> None:
    assert keygen(str(tmp_path / "n")).returncode == 0
    before = (tmp_path / "n.key").read_bytes()
    again = keygen(str(tmp_path / "n"))
    assert again.returncode != 0
    assert "exists" in again.stderr
    assert "Traceback" not in again.stderr
    assert (tmp_path / "n.key").read_bytes() == before


def test_an_unknown_kind_is_a_usage_error(tmp_path: Path) -> None:
    done = keygen(str(tmp_path / "n"), "--kind", "rsa")
    assert done.returncode == 2
    assert not (tmp_path / "n.key").exists()


def test_the_kinds_written_out_for_help_are_the_library_s() -> None:
    assert KINDS == KEY_KINDS
