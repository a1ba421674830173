"""Hostile bytes cost a bounded amount to refuse: field counts before parsing, decoded objects."""

from __future__ import annotations

import gc
import struct
import threading
import time
import tracemalloc
from typing import Any

import anyio
import msgpack
import numpy as np
import pytest

from fedcore.domain import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.transport.off_loop import OFF_LOOP_BYTES, decoded
from fedcore.wire import DEFAULT_LIMITS, DecodeLimits, frame, pack_recorddict, unpack_recorddict
from fedcore.wire import rpc as wire
from fedcore.wire.frame import MAX_OBJECTS
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


MiB = 1024 * 1024


def _empty_lists_header(count: int, *, per_list: int = 60_000) -> bytes:
    """A RecordDict payload whose header is ``count`` empty lists, in lists of ``per_list``."""
    sizes = [per_list] * (count // per_list) + ([count % per_list] if count % per_list else [])
    header = b"\xdd" + struct.pack(">I", len(sizes))
    header += b"".join(b"\xdd" + struct.pack(">I", size) + b"\x90" * size for size in sizes)
    return b"FCR\x01" + struct.pack(">I", len(header)) + header


def test_a_header_of_empty_lists_is_refused_by_its_objects_not_its_bytes() -> None:
    hostile = _empty_lists_header(300_000)  # a little over the budget of objects
    with pytest.raises(DecodeError, match=f"decodes to more than {MAX_OBJECTS} objects"):
        unpack_recorddict(hostile)
    # A header 20 times as long, of a few long strings, is a few objects, and is read.
    records = RecordDict({"c": ConfigRecord({f"t{i}": "x" * 900_000 for i in range(8)})})
    honest = pack_recorddict(records)
    assert len(honest) > 20 * len(hostile)
    assert unpack_recorddict(honest) == records


def test_refusing_megabytes_of_empty_lists_costs_the_budget_at_most() -> None:
    data = _empty_lists_header(8 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="objects"):
            unpack_recorddict(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 64 bytes an object at most (an empty list and its pointer), however long the header:
    # the budget once was 24 times the header's bytes, 192 MiB for this one.
    assert peak < 64 * MAX_OBJECTS + MiB, peak


def test_each_list_counts_for_itself_and_each_of_its_items() -> None:
    data = _empty_lists_header(1000)  # [[[], [], ... 1,000 of them]]
    cost = 1000 + (1 + 1000) + (1 + 1)
    header, _ = frame.decode(data, frame.RECORDDICT, DecodeLimits(max_objects=cost))
    assert header == [[[]] * 1000]
    with pytest.raises(DecodeError, match=f"more than {cost - 1} objects"):
        frame.decode(data, frame.RECORDDICT, DecodeLimits(max_objects=cost - 1))


def test_records_fedcore_writes_stay_within_the_object_budget() -> None:
    metrics = RecordDict({"m": MetricRecord({f"{i}": i % 100 for i in range(30_000)})})
    arrays = RecordDict({"a": ArrayRecord({f"w{i}": np.zeros(2) for i in range(30_000)})})
    for records in (metrics, arrays):
        assert unpack_recorddict(pack_recorddict(records), DEFAULT_LIMITS) == records


def test_a_large_payload_is_decoded_in_a_worker_thread_and_a_small_one_on_the_loop() -> None:
    def where(data: bytes) -> int:
        return threading.get_ident()

    async def decode_both() -> tuple[int, int]:
        small = await decoded(where, b"x" * OFF_LOOP_BYTES)
        large = await decoded(where, b"x" * (OFF_LOOP_BYTES + 1))
        return small, large

    small, large = anyio.run(decode_both)
    assert small == threading.get_ident()
    assert large != threading.get_ident()


def test_the_garbage_collector_is_paused_while_a_header_is_built_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unpackb = msgpack.unpackb
    seen: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return unpackb(*args, **kwargs)

    monkeypatch.setattr(msgpack, "unpackb", spy)
    records = RecordDict({"m": MetricRecord({"loss": 0.5})})
    assert unpack_recorddict(pack_recorddict(records)) == records
    with pytest.raises(DecodeError, match="objects"):
        unpack_recorddict(_empty_lists_header(300_000))
    assert seen == [False, False]
    assert gc.isenabled()
    gc.disable()
    try:
        unpack_recorddict(pack_recorddict(records))
        assert not gc.isenabled(), "a collector paused by someone else stays paused"
    finally:
        gc.enable()
