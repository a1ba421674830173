"""Hostile bytes cost a bounded amount to refuse: field counts before parsing, list memory."""

from __future__ import annotations

import struct
import time

import pytest

from fedcore.domain import MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.wire import pack_recorddict, unpack_recorddict
from fedcore.wire import rpc as wire
from fedcore.wire.frame import EXPANSION_SLACK
from fedcore.wire.rpc import MAX_CONFIG_ENTRIES, MAX_HEARTBEAT_IDS


def test_a_registration_of_many_empty_entries_is_refused_before_parsing() -> None:
    frame = b"\x0a\x00" * (MAX_CONFIG_ENTRIES + 1)
    started = time.perf_counter()
    with pytest.raises(DecodeError, match=f"more than {MAX_CONFIG_ENTRIES} fields"):
        wire.decode_register_node_request(frame)
    assert time.perf_counter() - started < 0.5  # betterproto took ~0.1 s for these alone


def test_a_registration_at_the_entry_cap_is_read() -> None:
    config = {f"k{i}": i for i in range(MAX_CONFIG_ENTRIES - 1)}
    frame = wire.encode_register_node_request(config, 5.0)
    assert wire.decode_register_node_request(frame) == (config, 5.0)


def test_a_heartbeat_with_too_many_ids_is_refused() -> None:
    frame = wire.encode_heartbeat_request(1, 5.0, ["m"] * (MAX_HEARTBEAT_IDS + 1), 30.0)
    with pytest.raises(DecodeError, match="fields"):
        wire.decode_heartbeat_request(frame)
    ok = wire.encode_heartbeat_request(1, 5.0, ["m"] * MAX_HEARTBEAT_IDS, 30.0)
    assert len(wire.decode_heartbeat_request(ok)[2]) == MAX_HEARTBEAT_IDS


def test_a_nested_message_with_too_many_fields_is_refused() -> None:
    entry = b"\x0a\x00" * (MAX_CONFIG_ENTRIES + 1)  # one ConfigEntry, its key over and over
    length = len(entry)
    frame = b"\x0a" + bytes([length & 0x7F | 0x80, length >> 7]) + entry
    with pytest.raises(DecodeError, match="ConfigEntry of more than"):
        wire.decode_register_node_request(frame)


def test_small_requests_refuse_more_than_a_few_dozen_fields() -> None:
    with pytest.raises(DecodeError, match="fields"):
        wire.decode_get_run_request(b"\x08\x01" * 65)


def _empty_lists_header(count: int) -> bytes:
    header = b"\xdd" + struct.pack(">I", count) + b"\x90" * count
    return b"FCR\x01" + struct.pack(">I", len(header)) + header


def test_a_header_of_empty_lists_is_refused_before_it_is_all_built() -> None:
    data = _empty_lists_header(200_000)
    with pytest.raises(DecodeError, match="times the header's bytes"):
        unpack_recorddict(data)


def test_records_fedcore_writes_stay_within_the_expansion_cap() -> None:
    worst = RecordDict({"m": MetricRecord({chr(0x4E00 + i): 1 for i in range(20_000)})})
    tiny = RecordDict({"m": MetricRecord({f"{i}": i % 100 for i in range(50_000)})})
    for records in (worst, tiny):
        data = pack_recorddict(records)
        assert len(data) > EXPANSION_SLACK // 24
        assert unpack_recorddict(data) == records
