"""The engine-worker pipe protocol: tasks, outcomes, pointers, releases, hellos, specs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    ErrorCode,
    Message,
    MetricRecord,
    RecordDict,
)
from fedcore.errors import DecodeError
from fedcore.wire import FORMAT_VERSION, frame, parts_size
from fedcore.wire.message import encode_message, encode_metadata
from fedcore.wire.records import encode_recorddict
from fedcore.wire.worker import (
    FAILED,
    HELLO,
    check_segment_name,
    failure_reason,
    pack_failure,
    pack_outcome,
    pack_outcomes,
    pack_pointer,
    pack_release,
    pack_spec,
    pack_task,
    pointer_target,
    release_target,
    unpack_outcome,
    unpack_outcomes,
    unpack_spec,
    unpack_task,
)

# ---------------------------------------------------------------- fixtures


def sample_content() -> RecordDict:
    return RecordDict(
        {
            "model": ArrayRecord(
                {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([-1, 2])}
            ),
            "config": ConfigRecord({"lr": 0.01, "epochs": 2, "tags": ["a", "b"]}),
            "metrics": MetricRecord({"loss": 0.5, "n": 10}),
        }
    )


def sample_message(content: RecordDict | None = None) -> Message:
    msg = Message(content or sample_content(), 7, "train.fast", group_id="round-3", ttl=90.0)
    meta = msg.metadata
    meta.run_id, meta.message_id, meta.src_node_id = 42, "msg-1", 1
    meta.created_at = 1_700_000_000.25
    return msg


def sample_state() -> RecordDict:
    return RecordDict(
        {
            "optimizer": ArrayRecord({"momentum": np.linspace(0, 1, 7)}),
            "seen": MetricRecord({"rounds": 3}),
        }
    )


NODE_CONFIG: dict[str, Any] = {"partition-id": 3, "num-partitions": 10}
RUN_CONFIG: dict[str, Any] = {
    "flag": True,
    "off": False,
    "count": -(2**63),
    "big": 2**64 - 1,
    "one": 1,
    "one-float": 1.0,
    "ratio": -0.0,
    "inf": math.inf,
    "name": "héllo",
    "empty": "",
    "blob": b"\x00\xff",
}


def sample_context(state: RecordDict | None = None) -> Context:
    return Context(
        run_id=42,
        node_id=7,
        node_config=dict(NODE_CONFIG),
        state=sample_state() if state is None else state,
        run_config=dict(RUN_CONFIG),
    )


def exactly(config: dict[str, Any]) -> str:
    """Keys, order, types and values of a config (True, 1 and 1.0 all differ here)."""
    return repr([(key, type(value).__name__, value) for key, value in config.items()])


def assert_same_context(decoded: Context, original: Context) -> None:
    assert (decoded.run_id, decoded.node_id) == (original.run_id, original.node_id)
    assert type(decoded.run_id) is int
    assert type(decoded.node_id) is int
    assert exactly(decoded.node_config) == exactly(original.node_config)
    assert exactly(decoded.run_config) == exactly(original.run_config)
    assert decoded.state == original.state


def no_segment(name: str) -> RecordDict:
    pytest.fail(f"read a segment ({name!r}) for a task that carries its content")


def task_bytes(message: Message, context: Context, segment: str | None = None) -> bytes:
    return b"".join(pack_task(message, context, content_segment=segment))


def reply_with_content(msg: Message) -> Message:
    reply = Message(RecordDict({"update": ArrayRecord({"w": np.full(5, 0.5)})}), reply_to=msg)
    reply.metadata.message_id, reply.metadata.created_at = "reply-1", 1_700_000_001.5
    return reply


def reply_with_error(msg: Message) -> Message:
    failure = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ValueError: boom")
    reply = Message(error=failure, reply_to=msg)
    reply.metadata.created_at = 1_700_000_002.0
    return reply


# ---------------------------------------------------------------- tasks


def test_task_round_trip_with_inline_content() -> None:
    msg, context = sample_message(), sample_context()
    decoded, decoded_context = unpack_task(task_bytes(msg, context), no_segment)
    assert decoded == msg
    assert decoded.metadata == msg.metadata
    assert decoded.content == msg.content
    assert_same_context(decoded_context, context)


def test_task_decodes_from_a_memoryview_and_arrays_are_read_only() -> None:
    payload = bytearray(task_bytes(sample_message(), sample_context()))
    decoded, context = unpack_task(memoryview(payload), no_segment)
    weights = decoded.content.array_records["model"]["w"]
    assert not weights.flags.writeable
    assert not context.state.array_records["optimizer"]["momentum"].flags.writeable
    assert decoded == sample_message()


def test_task_content_by_segment_is_read_from_the_segment() -> None:
    big = RecordDict({"model": ArrayRecord({"w": np.ones((512, 512), dtype=np.float64)})})
    msg, context = sample_message(big), sample_context()
    payload = task_bytes(msg, context, segment="fedcore-12-ab01-w2-7")
    assert len(payload) < 4096 < big.array_records["model"].nbytes
    supplied = RecordDict({"model": ArrayRecord({"w": np.zeros(3)})})
    asked: list[str] = []

    def read_segment(name: str) -> RecordDict:
        asked.append(name)
        return supplied

    decoded, decoded_context = unpack_task(payload, read_segment)
    assert asked == ["fedcore-12-ab01-w2-7"]
    assert decoded.content is supplied
    assert decoded.metadata == msg.metadata
    assert_same_context(decoded_context, context)


def test_a_task_refuses_a_bad_segment_name_when_packed() -> None:
    with pytest.raises(ValueError, match="segment name"):
        pack_task(sample_message(), sample_context(), content_segment="../etc/passwd")


def test_context_with_empty_configs_and_state_round_trips() -> None:
    context = Context(run_id=0, node_id=2**63 - 1)
    _, decoded = unpack_task(task_bytes(sample_message(), context), no_segment)
    assert_same_context(decoded, context)
    assert decoded.state == RecordDict()
    assert decoded.node_config == {} == decoded.run_config


config_scalars = (
    st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=6)
)
configs = st.dictionaries(st.text(max_size=6), config_scalars, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    run_id=st.integers(-(2**63), 2**63 - 1),
    node_id=st.integers(0, 2**64 - 1),
    node_config=configs,
    run_config=configs,
)
def test_context_configs_round_trip_exactly(
    run_id: int, node_id: int, node_config: dict[str, Any], run_config: dict[str, Any]
) -> None:
    context = Context(run_id, node_id, node_config, RecordDict(), run_config)
    _, decoded = unpack_task(task_bytes(sample_message(), context), no_segment)
    assert_same_context(decoded, context)


@pytest.mark.parametrize(
    ("node_config", "run_config"),
    [
        ({"ids": [1, 2]}, {}),
        ({}, {"nested": {"a": 1}}),
        ({}, {"nothing": None}),
        ({}, {"pair": (1, 2)}),
        ({}, {"array": np.zeros(2)}),
        ({1: "int key"}, {}),
    ],
)
def test_context_configs_with_non_scalar_values_are_refused_at_pack(
    node_config: dict[Any, Any], run_config: dict[str, Any]
) -> None:
    context = Context(1, 2, node_config, RecordDict(), run_config)
    with pytest.raises(TypeError, match="must be bool, int, float, str or bytes"):
        pack_task(sample_message(), context)


@pytest.mark.parametrize("bad_id", ["1", 1.0, True, None])
def test_context_ids_must_be_ints_at_pack(bad_id: Any) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        pack_task(sample_message(), Context(bad_id, 2))
    with pytest.raises(TypeError, match="must be an int"):
        pack_task(sample_message(), Context(1, bad_id))


# ---------------------------------------------------------------- crafted tasks


def crafted_task(*, content: bool = True, segment: object = None, context: object = None) -> bytes:
    """A task built with the frame encoder, so it may break rules pack_task keeps."""
    blobs: list[memoryview] = []
    msg = sample_message()
    header = [
        encode_metadata(msg.metadata),
        encode_recorddict(msg.content, blobs) if content else None,
        segment,
        [1, 2, [], [], []] if context is None else context,
    ]
    return frame.encode(frame.TASK, header, blobs)


def test_crafted_tasks_decode_when_well_formed() -> None:
    inline, _ = unpack_task(crafted_task(), no_segment)
    assert inline.content == sample_content()
    supplied = RecordDict()
    by_segment, context = unpack_task(
        crafted_task(content=False, segment="seg-1"), lambda name: supplied
    )
    assert by_segment.content is supplied
    assert_same_context(context, Context(1, 2))


def test_a_task_with_content_and_a_segment_is_refused() -> None:
    with pytest.raises(DecodeError, match="exactly one"):
        unpack_task(crafted_task(content=True, segment="seg-1"), no_segment)


def test_a_task_with_neither_content_nor_segment_is_refused() -> None:
    with pytest.raises(DecodeError, match="exactly one"):
        unpack_task(crafted_task(content=False, segment=None), no_segment)


@pytest.mark.parametrize("segment", ["../x", "a/b", "..", "", 7, b"seg", ["seg"]])
def test_a_task_naming_a_bad_segment_is_refused_before_reading(segment: object) -> None:
    with pytest.raises(DecodeError):
        unpack_task(crafted_task(content=False, segment=segment), no_segment)


def test_a_crafted_context_with_distinct_keys_decodes() -> None:
    context = [5, 6, [["k", 1], ["j", b"x"]], [["k", "same key, other config"]], []]
    _, decoded = unpack_task(crafted_task(context=context), no_segment)
    assert decoded.node_config == {"k": 1, "j": b"x"}
    assert decoded.run_config == {"k": "same key, other config"}


@pytest.mark.parametrize(
    "context",
    [
        [1, 2, [["k", 1], ["k", 2]], [], []],  # repeated node_config key
        [1, 2, [], [["k", 1], ["k", 1]], []],  # repeated run_config key, even same value
        [1, 2, [[3, "v"]], [], []],  # int key
        [1, 2, [], [[b"k", "v"]], []],  # bytes key
        [1, 2, [], [[None, "v"]], []],
        [1, 2, [], [["k", [1, 2]]], []],  # list value
        [1, 2, [], [["k", None]], []],
        [1, 2, [["k"]], [], []],  # not a pair
        [1, 2, [["k", 1, 2]], [], []],
        [1, 2, "k=1", [], []],
        [1, 2, [], None, []],
        [True, 2, [], [], []],  # a bool is not an id
        [1, 2.0, [], [], []],
        [1, 2, [], [], None],  # state must be a record dict
        [1, 2, [], [], [["r", "x", []]]],  # unknown record kind
        [1, 2, [], []],  # too few fields
        [1, 2, [], [], [], []],
        "context",
    ],
)
def test_malformed_contexts_are_refused(context: object) -> None:
    with pytest.raises(DecodeError):
        unpack_task(crafted_task(context=context), no_segment)


def test_a_task_header_of_the_wrong_shape_is_refused() -> None:
    msg = sample_message()
    with pytest.raises(DecodeError, match="4 fields"):
        unpack_task(frame.encode(frame.TASK, [encode_metadata(msg.metadata)], []), no_segment)
    with pytest.raises(DecodeError):
        unpack_task(frame.encode(frame.TASK, "task", []), no_segment)


def test_other_payload_kinds_are_not_tasks_or_outcomes() -> None:
    task = task_bytes(sample_message(), sample_context())
    outcome = b"".join(pack_outcome(reply_with_content(sample_message()), RecordDict()))
    with pytest.raises(DecodeError, match="worker task"):
        unpack_outcome(task)
    with pytest.raises(DecodeError, match="worker outcome"):
        unpack_task(outcome, no_segment)
    with pytest.raises(DecodeError):
        unpack_spec(task)


# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize("make_reply", [reply_with_content, reply_with_error])
def test_outcome_round_trip(make_reply: Callable[[Message], Message]) -> None:
    reply, state = make_reply(sample_message()), sample_state()
    decoded, decoded_state = unpack_outcome(b"".join(pack_outcome(reply, state)))
    assert decoded == reply
    assert decoded.metadata == reply.metadata
    assert decoded.has_error() == reply.has_error()
    if reply.has_error():
        assert decoded.error == reply.error
        assert decoded.error.reason == "ValueError: boom"
    else:
        assert decoded.content == reply.content
    assert decoded_state == state
    assert [type(record) for record in decoded_state.values()] == [ArrayRecord, MetricRecord]


def test_outcome_parts_carry_arrays_without_copying_them() -> None:
    big = np.arange(100_000, dtype=np.float64)
    state = RecordDict({"s": ArrayRecord({"big": big})})
    parts = pack_outcome(reply_with_error(sample_message()), state)
    assert parts_size(parts) > big.nbytes
    assert any(
        isinstance(part, memoryview) and np.shares_memory(np.frombuffer(part, np.uint8), big)
        for part in parts
    )
    _, decoded_state = unpack_outcome(memoryview(b"".join(parts)))
    np.testing.assert_array_equal(decoded_state.array_records["s"]["big"], big)


def test_an_outcome_header_of_the_wrong_shape_is_refused() -> None:
    reply = reply_with_content(sample_message())
    blobs: list[memoryview] = []
    header = [encode_message(reply, blobs)]
    with pytest.raises(DecodeError, match="2 fields"):
        unpack_outcome(frame.encode(frame.OUTCOME, header, blobs))


def test_outcomes_of_a_batch_round_trip_in_order_without_copies() -> None:
    """A batch's outcomes, each starting aligned in one buffer; each decodes from its view."""
    replies = [reply_with_content(sample_message()), reply_with_error(sample_message())]
    states = [sample_state(), RecordDict()]
    packed = pack_outcomes([pack_outcome(r, s) for r, s in zip(replies, states, strict=True)], 0.25)
    data = np.frombuffer(b"".join(packed), np.uint8)  # as the actor returns it
    views, seconds = unpack_outcomes(data.data)
    assert seconds == 0.25
    decoded = [unpack_outcome(view) for view in views]
    assert [reply for reply, _ in decoded] == replies
    assert [state for _, state in decoded] == states
    w = decoded[0][0].content.array_records["update"]["w"]
    assert np.shares_memory(w, data), "the reply's arrays are views of the batch's buffer"
    assert w.ctypes.data % 16 == 0


def test_an_empty_batch_of_outcomes_round_trips() -> None:
    assert unpack_outcomes(b"".join(pack_outcomes([], 0.0))) == ([], 0.0)


@pytest.mark.parametrize(
    "header",
    [[0.1], [0.1, [1], 3], ["0.1", [1]], [-1.0, []], [math.nan, []], [0.1, 5], [0.1, [-1]],
     [0.1, [True]]],
)  # fmt: skip
def test_outcomes_headers_of_the_wrong_shape_are_refused(header: object) -> None:
    with pytest.raises(DecodeError):
        unpack_outcomes(frame.encode(frame.OUTCOMES, header, []))


def test_outcomes_claiming_more_bytes_than_they_have_are_refused() -> None:
    with pytest.raises(DecodeError, match="past the end"):
        unpack_outcomes(frame.encode(frame.OUTCOMES, [0.1, [10]], []))


# ---------------------------------------------------------------- small messages


def test_pointer_and_release_round_trip() -> None:
    name = "fedcore-4242-0a1b2c3d-w3-17"
    assert pack_pointer(name) == b"@" + name.encode()
    assert pointer_target(pack_pointer(name)) == name
    assert release_target(pack_release(name)) == name
    assert pointer_target(memoryview(pack_pointer(name))) == name
    assert release_target(bytearray(pack_release(name))) == name


@pytest.mark.parametrize("reason", ["", "no module named 'app'", "héllo ✓ — 世界"])
def test_failure_round_trip(reason: str) -> None:
    assert pack_failure(reason)[:1] == FAILED
    assert failure_reason(pack_failure(reason)) == reason


def test_failure_with_unencodable_text_is_still_sent() -> None:
    assert failure_reason(pack_failure("bad \udc80 surrogate")) == "bad ? surrogate"
    assert failure_reason(FAILED + b"\xff\xfe") == "\ufffd\ufffd"


def test_spec_round_trip() -> None:
    spec: dict[str, str | int | list[str]] = {
        "client_app": "pkg.module:app",
        "segment_root": "/dev/shm",
        "segment_prefix": "fedcore-1-ab-w0-",
        "inline_limit": 65_536,
        "negative": -1,
        "sys_path": ["/work/app", "/work/other"],
        "empty": [],
        "": "empty key",
    }
    decoded = unpack_spec(pack_spec(spec))
    assert decoded == spec
    assert list(decoded) == list(spec)
    assert unpack_spec(pack_spec({})) == {}


@pytest.mark.parametrize("header", [[["k"]], [[1, "v"]], [[b"k", "v"]], ["k"], "k", None])
def test_malformed_specs_are_refused(header: object) -> None:
    with pytest.raises(DecodeError, match="spec"):
        unpack_spec(frame.encode(frame.SPEC, header, []))


def every_kind() -> dict[str, bytes]:
    msg = sample_message()
    return {
        "pointer": pack_pointer("seg-p"),
        "release": pack_release("seg-r"),
        "failure": pack_failure("why"),
        "hello": HELLO,
        "task": task_bytes(msg, sample_context()),
        "outcome": b"".join(pack_outcome(reply_with_content(msg), sample_state())),
        "spec": pack_spec({"client_app": "a:b"}),
        "empty": b"",
    }


def test_each_reader_answers_only_its_own_kind() -> None:
    readers: dict[str, Callable[[bytes], str | None]] = {
        "pointer": pointer_target,
        "release": release_target,
        "failure": failure_reason,
    }
    expected = {"pointer": "seg-p", "release": "seg-r", "failure": "why"}
    for kind, data in every_kind().items():
        for reader_kind, reader in readers.items():
            answer = reader(data)
            if kind == reader_kind:
                assert answer == expected[kind]
            else:
                assert answer is None, f"{reader_kind} reader took a {kind}"


@pytest.mark.parametrize("data", [b"@", b"-", b"@../x", b"-a/b", b"@a b", b"@\xff\xfe", b"-.."])
def test_pointers_and_releases_to_bad_names_are_refused(data: bytes) -> None:
    reader = pointer_target if data[:1] == b"@" else release_target
    with pytest.raises(DecodeError):
        reader(data)


# ---------------------------------------------------------------- segment names


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        ".",
        "../x",
        "x/..",
        "a..b",
        "a/b",
        "/abs",
        "a\\b",
        ".hidden",
        "-dash",
        "_under",
        "has space",
        "tab\there",
        "new\nline",
        "trailing\n",
        "nul\x00",
        "naïve",
        "ｆｕｌｌ",
        "٣",
        "a" * 202,
        None,
        7,
        b"bytes",
    ],
)
def test_check_segment_name_refuses(name: object) -> None:
    """A bad name received is a DecodeError; a bad name about to be sent, a ValueError."""
    with pytest.raises(DecodeError, match="not a segment name"):
        check_segment_name(name)
    if isinstance(name, str):
        for pack in (pack_pointer, pack_release):
            with pytest.raises(ValueError, match="not a segment name") as caught:
                pack(name)
            assert not isinstance(caught.value, DecodeError)


@pytest.mark.parametrize(
    "name", ["a", "7", "a" * 201, "fedcore-123-deadbeef-w4-99", "x.y_z-1", "A.b.C", "end."]
)
def test_check_segment_name_accepts(name: str) -> None:
    assert check_segment_name(name) == name
    assert pointer_target(pack_pointer(name)) == name


# ---------------------------------------------------------------- garbage

VALID_TASK = task_bytes(sample_message(), sample_context())
VALID_OUTCOME = b"".join(pack_outcome(reply_with_content(sample_message()), sample_state()))


def empty_segment(name: str) -> RecordDict:
    return RecordDict()


def refused_or_decoded(decode: Callable[[bytes], object], data: bytes) -> None:
    """Garbage may happen to decode; if it does not, the error is DecodeError."""
    with contextlib.suppress(DecodeError):
        decode(data)


def decode_task(data: bytes) -> object:
    return unpack_task(data, empty_segment)


def decode_outcomes(data: bytes) -> object:
    views, _ = unpack_outcomes(data)
    return [unpack_outcome(view) for view in views]


VALID_OUTCOMES = b"".join(
    pack_outcomes(
        [[VALID_OUTCOME], pack_outcome(reply_with_error(sample_message()), RecordDict())], 0.5
    )
)
DECODERS: list[Callable[[bytes], object]] = [
    decode_task,
    unpack_outcome,
    decode_outcomes,
    unpack_spec,
]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    for decode in DECODERS:
        refused_or_decoded(decode, data)
    for kind in (frame.TASK, frame.OUTCOME, frame.OUTCOMES, frame.SPEC):
        framed = frame.MAGIC + kind + bytes([FORMAT_VERSION]) + data
        for decode in DECODERS:
            refused_or_decoded(decode, framed)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(msgpack_values, min_size=2, max_size=5), st.binary(max_size=40))
def test_random_headers_only_raise_decode_error(header: list[Any], tail: bytes) -> None:
    for kind in (frame.TASK, frame.OUTCOME, frame.OUTCOMES, frame.SPEC):
        packed = msgpack.packb(header, use_bin_type=True)
        data = frame.MAGIC + kind + bytes([FORMAT_VERSION]) + len(packed).to_bytes(4, "big")
        for decode in DECODERS:
            refused_or_decoded(decode, data + packed + tail)


@pytest.mark.parametrize(
    ("payload", "decode"),
    [
        (VALID_TASK, decode_task),
        (VALID_OUTCOME, unpack_outcome),
        (VALID_OUTCOMES, decode_outcomes),
    ],
)
def test_every_truncation_is_refused(payload: bytes, decode: Callable[[bytes], object]) -> None:
    decode(payload)  # the whole payload is valid
    for end in range(len(payload)):
        with pytest.raises(DecodeError):
            decode(payload[:end])
    with pytest.raises(DecodeError, match="unexpected bytes"):
        decode(payload + b"\x00")


@pytest.mark.parametrize(
    ("payload", "decode"),
    [
        (VALID_TASK, decode_task),
        (VALID_OUTCOME, unpack_outcome),
        (VALID_OUTCOMES, decode_outcomes),
    ],
)
def test_every_flipped_byte_decodes_or_is_refused(
    payload: bytes, decode: Callable[[bytes], object]
) -> None:
    refused = 0
    for position in range(len(payload)):
        for mask in (0x01, 0x80, 0xFF):
            flipped = bytearray(payload)
            flipped[position] ^= mask
            try:
                decode(bytes(flipped))
            except DecodeError:
                refused += 1
    assert refused > 0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_corruptions_only_raise_decode_error(data: st.DataObject) -> None:
    payload, decode = data.draw(
        st.sampled_from(
            [
                (VALID_TASK, decode_task),
                (VALID_OUTCOME, unpack_outcome),
                (VALID_OUTCOMES, decode_outcomes),
            ]
        )
    )
    corrupted = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(corrupted) - 1))
        corrupted[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(corrupted)))
    refused_or_decoded(decode, bytes(corrupted[:cut]))
    refused_or_decoded(decode, bytes(corrupted))
