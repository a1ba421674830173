"""Listener addresses: parsing, loopback detection, and the TLS rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcore.errors import DecodeError, UsageError
from fedcore.runtime.addresses import Address, check_exposure, parse_address
from fedcore.runtime.ready import read_ready_file, write_ready_file


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:9092", "127.0.0.1", 9092),
        ("[::1]:0", "::1", 0),
        ("localhost:65535", "localhost", 65535),
        ("link.example.org:9092", "link.example.org", 9092),
        (" 0.0.0.0:80 ", "0.0.0.0", 80),
    ],
)
def test_parses(text: str, host: str, port: int) -> None:
    assert parse_address(text) == Address(host, port)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("9092", "must be HOST:PORT"),
        (":9092", "must be HOST:PORT"),
        ("127.0.0.1:", "port must be a number"),
        ("127.0.0.1:65536", "port must be a number"),
        ("127.0.0.1:-1", "port must be a number"),
        ("::1:9092", "put an IPv6 host in brackets"),
        ("[127.0.0.1]:9092", "not an IPv6 address"),
        ("[nope]:1", "not an IPv6 address"),
        ("300.1.1.1:9092", "not an IPv4 address"),
        ("bad_host:1", "not a valid host name"),
        ("-bad.example:1", "not a valid host name"),
    ],
)
def test_refuses_with_a_reason(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        parse_address(text, what="--fleet-address")


@given(st.text(max_size=40))
def test_anything_else_is_a_usage_error_or_an_address(text: str) -> None:
    try:
        address = parse_address(text)
    except UsageError:
        return
    assert parse_address(str(address)) == address


def test_str_round_trips_and_brackets_ipv6() -> None:
    assert str(Address("::1", 5)) == "[::1]:5"
    assert str(Address("127.0.0.1", 5)) == "127.0.0.1:5"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("link.example.org", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert Address(host, 1).is_loopback is loopback


def test_an_exposed_listener_needs_tls_or_insecure() -> None:
    exposed, local = Address("0.0.0.0", 9092), Address("127.0.0.1", 9092)
    with pytest.raises(UsageError, match="--insecure"):
        check_exposure(exposed, tls=False, insecure=False, what="fleet listener")
    check_exposure(exposed, tls=True, insecure=False, what="fleet listener")
    check_exposure(exposed, tls=False, insecure=True, what="fleet listener")
    check_exposure(local, tls=False, insecure=False, what="fleet listener")


def test_ready_file_round_trip_and_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ready.json"
    listeners = {"fleet": Address("127.0.0.1", 40001), "control": Address("::1", 40002)}
    write_ready_file(path, listeners)
    pid, read = read_ready_file(path)
    assert pid > 0
    assert read == listeners
    assert sorted(p.name for p in path.parent.iterdir()) == ["ready.json"]


@pytest.mark.parametrize(
    "content", ["", "[]", '{"pid": "1", "listeners": {}}', '{"pid": 1, "listeners": {"a": "x"}}']
)
def test_a_broken_ready_file_is_a_decode_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "ready.json"
    path.write_text(content)
    with pytest.raises(DecodeError, match="not a fedcore ready file"):
        read_ready_file(path)
