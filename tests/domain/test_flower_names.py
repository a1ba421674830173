"""Flower's names for the domain: Array, the ArrayRecord constructors, MessageType,
UserConfig, NDArrays and Metadata.delivered_at — each importable from fedcore's own path."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import (
    Array,
    ArrayRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    NDArrays,
    RecordDict,
    UserConfig,
    UserConfigValue,
)
from fedcore.domain.array import SerializedArray
from fedcore.domain.message import mark_delivered
from fedcore.wire.records import pack_recorddict, unpack_recorddict


def npy(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=False)
    return out.getvalue()


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` is ``b``'s data, not a copy of it: the same first byte and the same bytes."""
    return bool(
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.nbytes == b.nbytes
        and np.shares_memory(a, b)
    )


# ------------------------------------------------------------------ Array


def test_record_items_are_arrays_that_view_the_stored_memory() -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    record = ArrayRecord({"w": w})
    item = record["w"]
    assert isinstance(item, Array)
    assert isinstance(item, np.ndarray)
    assert same_memory(item, w)
    plain = item.numpy()
    assert type(plain) is np.ndarray
    assert same_memory(plain, w)
    assert item.stype == "numpy.ndarray"
    assert item.dtype == "float32"
    assert item.shape == (2, 3)
    assert all(isinstance(v, Array) for v in record.values())
    assert [type(a) for a in record.to_numpy_ndarrays()] == [np.ndarray]


def test_an_item_moved_to_another_record_is_the_same_array() -> None:
    w = np.ones(3)
    record = ArrayRecord({"w": w})
    assert ArrayRecord({"v": record["w"]}).to_numpy_ndarrays()[0] is w
    part = ArrayRecord({"v": record["w"][1:]}).to_numpy_ndarrays()[0]
    assert type(part) is np.ndarray
    assert same_memory(part, w[1:])
    reshaped = record["w"]
    reshaped.shape = (3, 1)
    assert reshaped.numpy().shape == (3, 1)


def test_a_read_only_item_stays_read_only() -> None:
    w = np.zeros(3)
    w.flags.writeable = False
    item = ArrayRecord({"w": w})["w"]
    assert not item.flags.writeable
    assert not item.numpy().flags.writeable


def test_computing_with_items_gives_plain_ndarrays_and_numpy_scalars() -> None:
    item = ArrayRecord({"w": np.array([1.0, 2.0, 3.0])})["w"]
    assert type(item * 2) is np.ndarray
    assert type(item + np.ones(3)) is np.ndarray
    assert type(item.sum()) is np.float64
    assert type(np.linalg.norm(item)) is np.float64
    # so they go where numbers go, as they did when items were plain ndarrays
    assert MetricRecord({"mean": item.mean()})["mean"] == 2.0


@pytest.mark.parametrize(
    "make",
    [
        lambda a: Array(a),
        lambda a: Array(ndarray=a),
        lambda a: Array.from_numpy_ndarray(a),
        lambda a: Array(str(a.dtype), a.shape, "numpy.ndarray", npy(a)),
        lambda a: Array(dtype=str(a.dtype), shape=a.shape, stype="numpy.ndarray", data=npy(a)),
    ],
    ids=["positional", "ndarray=", "from_numpy_ndarray", "fields", "field keywords"],
)
def test_flowers_array_constructors(make: object) -> None:
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    made = make(arr)  # type: ignore[operator]
    assert isinstance(made, Array)
    assert made.dtype == arr.dtype
    assert made.shape == arr.shape
    assert made.tobytes() == arr.tobytes()


def test_an_array_from_an_ndarray_is_a_view_not_a_copy() -> None:
    arr = np.ones(4)
    assert same_memory(Array(arr), arr)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: Array(), TypeError, "one ndarray"),
        (lambda: Array(np.ones(1), np.ones(1)), TypeError, "four fields"),
        (lambda: Array(np.array(["text"])), TypeError, "Array has dtype <U4"),
        (lambda: Array([1.0, 2.0]), TypeError, "Array must be a numpy.ndarray, got list"),
        (lambda: Array(dtype="float32", shape=(1,)), TypeError, "needs all four"),
        (lambda: Array("float32", [1], "numpy.ndarray", b""), TypeError, "tuple of ints"),
        (lambda: Array("float32", (2, 2), "dense", 213), TypeError, "bytes"),
        (lambda: Array.from_torch_tensor(np.ones(1)), TypeError, "takes a torch.Tensor"),
    ],
)
def test_bad_arrays_are_refused_clearly(call: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (("float32", (1,), "torch.Tensor", b"\x00" * 4), TypeError),
        (("float32", (1,), "numpy.ndarray", b"junk"), ValueError),
    ],
)
def test_an_array_in_another_serialisation_is_kept_and_refused_when_read(
    fields: tuple[str, tuple[int, ...], str, bytes], error: type[Exception]
) -> None:
    # As Flower's: any stype and bytes build an Array; only .numpy() (and so converting
    # a record that holds one) refuses what it cannot read. Sending it sends the fields.
    array = Array(*fields)
    assert isinstance(array, Array)
    assert (array.dtype, array.shape, array.stype, array.data) == fields
    record = ArrayRecord({"w": array})
    assert record["w"] is array
    assert record == ArrayRecord({"w": array})
    for kept in (pickle.loads(pickle.dumps(array)), copy.copy(array), copy.deepcopy(array)):
        assert (kept.dtype, kept.shape, kept.stype, kept.data) == fields
    with pytest.raises(error):
        array.numpy()
    with pytest.raises(error):
        record.to_numpy_ndarrays()
    sent = unpack_recorddict(pack_recorddict(RecordDict({"arrays": record})))["arrays"]
    assert isinstance(sent, ArrayRecord)
    assert (sent["w"].dtype, sent["w"].shape, sent["w"].stype, sent["w"].data) == fields


def test_a_view_of_a_kept_array_keeps_its_fields() -> None:
    # The inline backend hands a record over as read-only views of its arrays.
    fields = ("", (), "numpy.ndarray", npy(np.array(["a", "bc"])))
    view = Array(*fields).view()
    view.flags.writeable = False
    assert isinstance(view, SerializedArray)
    assert (view.dtype, view.shape, view.stype, view.data) == fields
    np.testing.assert_array_equal(view.numpy(), np.array(["a", "bc"]))
    assert (
        str(view)
        == repr(view)
        == f"Array(dtype='', shape=(), stype='numpy.ndarray', data=<{len(fields[3])} bytes>)"
    )


def test_numpy_fields_that_disagree_are_read_as_flower_reads_them() -> None:
    array = Array("int8", (2,), "numpy.ndarray", npy(np.ones(1)))
    assert (array.dtype, array.shape) == ("int8", (2,))
    np.testing.assert_array_equal(array.numpy(), np.ones(1))


def test_an_array_pickles_as_itself() -> None:
    item = ArrayRecord({"w": np.arange(3.0)})["w"]
    back = pickle.loads(pickle.dumps(item))
    assert type(back) is Array
    assert back.tobytes() == item.tobytes()


def test_an_array_is_stored_as_a_plain_ndarray() -> None:
    arr = np.arange(3.0)
    record = ArrayRecord({"w": Array(arr)})
    (stored,) = record.to_numpy_ndarrays()
    assert type(stored) is np.ndarray
    assert same_memory(stored, arr)


# ------------------------------------------------------------------ ArrayRecord


def test_flowers_array_record_constructors() -> None:
    a, b = np.zeros(2), np.ones(3)
    by_list = ArrayRecord.from_numpy_ndarrays([a, b])
    assert list(by_list) == ["0", "1"]
    assert by_list.to_numpy_ndarrays()[1] is b
    assert ArrayRecord(numpy_ndarrays=[a, b]) == by_list
    by_dict = ArrayRecord.from_array_dict({"a": Array(a), "b": Array(b)})
    assert list(by_dict) == ["a", "b"]
    assert same_memory(by_dict.to_numpy_ndarrays()[0], a)
    assert ArrayRecord(array_dict={"a": Array(a), "b": Array(b)}) == by_dict
    assert ArrayRecord({"a": a, "b": b}) == by_dict  # fedcore's forms keep working
    assert ArrayRecord([a, b]) == by_list


def test_keep_input_false_empties_the_input_and_to_methods_empty_the_record() -> None:
    a = np.zeros(2)
    arrays = [a]
    record = ArrayRecord(arrays, keep_input=False)
    assert arrays == []
    assert record.to_numpy_ndarrays()[0] is a
    named = {"w": Array(a)}
    ArrayRecord.from_array_dict(named, keep_input=False)
    assert named == {}
    assert record.to_numpy_ndarrays(keep_input=False)[0] is a
    assert len(record) == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ArrayRecord([np.ones(1)], numpy_ndarrays=[np.ones(1)]), "one source"),
        (lambda: ArrayRecord(array_dict=[np.ones(1)]), "array_dict= takes a dict"),
        (lambda: ArrayRecord(42), "Invalid arguments for ArrayRecord"),
        (lambda: ArrayRecord(torch_state_dict=[np.ones(1)]), "takes a dict"),
        (lambda: ArrayRecord(numpy_ndarrays={"w": np.ones(1)}), "takes a list"),
        (lambda: ArrayRecord.from_array_dict({"w": [1.0]}), r"ArrayRecord\['w'\]"),
    ],
)
def test_bad_array_record_sources_are_refused(call: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        call()  # type: ignore[operator]


def test_count_bytes_counts_array_data_and_keys() -> None:
    record = ArrayRecord({"w": np.zeros(10, np.float32), "bé": np.zeros(2, np.int8)})
    assert record.count_bytes() == 40 + 2 + 1 + 3


def test_torch_state_dict_methods_say_torch_is_needed() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from fedcore import ArrayRecord\n"
        "for call in (lambda: ArrayRecord.from_torch_state_dict({}),\n"
        "             lambda: ArrayRecord().to_torch_state_dict()):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == [
        "ArrayRecord.from_torch_state_dict needs PyTorch: pip install 'fedcore[torch]'",
        "ArrayRecord.to_torch_state_dict needs PyTorch: pip install 'fedcore[torch]'",
    ]


def test_from_torch_state_dict_and_tensors(torch_module: object) -> None:
    torch = torch_module
    state = {"w": torch.arange(4, dtype=torch.float32), "n": torch.tensor(3)}  # type: ignore[attr-defined]
    record = ArrayRecord.from_torch_state_dict(state)
    assert record["w"].dtype == np.float32
    assert int(record["n"]) == 3
    assert isinstance(Array(state["w"]), Array)
    assert Array.from_torch_tensor(state["w"]).shape == (4,)
    with pytest.raises(TypeError, match=r"state_dict\['x'\] is a ndarray"):
        ArrayRecord.from_torch_state_dict({"x": np.ones(1)})
    back = record.to_torch_state_dict(keep_input=False)
    assert torch.equal(back["w"], state["w"])
    assert len(record) == 0


@pytest.fixture
def torch_module() -> object:
    return pytest.importorskip("torch")


# ------------------------------------------------------------------ message types, aliases


def test_message_type_constants_are_the_strings_fedcore_uses() -> None:
    assert (MessageType.TRAIN, MessageType.EVALUATE, MessageType.QUERY) == (
        "train",
        "evaluate",
        "query",
    )
    message = Message(RecordDict(), 4, message_type=MessageType.TRAIN)
    assert message.metadata.message_type == "train"
    assert Message(RecordDict(), 4, f"{MessageType.QUERY}.stats").metadata.message_type == (
        "query.stats"
    )
    with pytest.raises(TypeError, match="namespace"):
        MessageType()


def test_client_app_decorators_answer_message_type_constants() -> None:
    client = fc.ClientApp()
    client.train()(lambda msg, context: msg)
    client.evaluate("fast")(lambda msg, context: msg)
    assert client.message_types == [MessageType.TRAIN, f"{MessageType.EVALUATE}.fast"]


def test_type_aliases_are_flowers() -> None:
    config: UserConfig = {"lr": 0.1, "name": "x", "on": True, "rounds": 3}
    assert UserConfig == dict[str, UserConfigValue]
    assert set(UserConfigValue.__args__) == {bool, float, int, str}  # type: ignore[attr-defined]
    arrays: NDArrays = [np.zeros(1)]
    assert NDArrays == list[fc.NDArray]
    assert config
    assert arrays


def test_each_name_is_also_at_the_top_level() -> None:
    for name in ("Array", "MessageType", "NDArray", "NDArrays", "UserConfig", "UserConfigValue"):
        assert getattr(fc, name) is getattr(sys.modules["fedcore.domain"], name), name


# ------------------------------------------------------------------ delivered_at


def test_delivered_at_is_empty_until_stamped_then_iso_utc() -> None:
    message = Message(RecordDict(), 4, "train")
    assert message.metadata.delivered_at == ""
    mark_delivered(message, 1_700_000_000.5)
    assert message.metadata.delivered_at == "2023-11-14T22:13:20.500000+00:00"
    assert datetime.fromisoformat(message.metadata.delivered_at).timestamp() == 1_700_000_000.5


def test_delivered_at_takes_no_part_in_equality() -> None:
    first, second = Metadata(run_id=1), Metadata(run_id=1, delivered_at="2024-01-01T00:00:00+00:00")
    assert first == second
