"""ArrayRecord <-> torch state_dict; torch stays optional.

Tests that need torch take the ``torch`` fixture and are skipped without it (CI has no
torch); the others check what happens, or does not happen, when torch is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedcore import ArrayRecord, RecordDict
from fedcore.wire.records import pack_recorddict, unpack_recorddict


@pytest.fixture
def torch() -> ModuleType:
    return pytest.importorskip("torch")


def test_importing_fedcore_does_not_import_torch(tmp_path: Path) -> None:
    """A ``torch`` that records being imported, first on the path, must stay unimported."""
    marker = tmp_path / "imported"
    (tmp_path / "torch.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    code = (
        "import fedcore, fedcore.data, fedcore.strategy, fedcore.wire, fedcore.simulation\n"
        "import numpy as np, sys\n"
        "fedcore.ArrayRecord({'w': np.zeros(2)})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": path})
    assert not marker.exists()


def test_to_torch_state_dict_without_torch_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    record = ArrayRecord({"w": np.ones(3, np.float32)})  # building one needs no torch
    with pytest.raises(ImportError, match=r"pip install 'fedcore\[torch\]'") as info:
        record.to_torch_state_dict()
    assert info.value.name == "torch"


def test_state_dict_round_trip_keeps_order_dtypes_shapes_and_values(torch: ModuleType) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    ).double()
    model[1].num_batches_tracked += 7  # an int64 buffer, 0-d
    state = model.state_dict()
    state["extra.half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    state["extra.mask"] = torch.tensor([True, False])
    state["extra.bytes"] = torch.tensor([0, 255], dtype=torch.uint8)
    state["extra.int32"] = torch.tensor([[-5, 2**31 - 1]], dtype=torch.int32)
    state["extra.complex"] = torch.tensor([1 + 2j], dtype=torch.complex64)

    record = ArrayRecord(state)
    expected_dtypes = {
        "0.weight": np.float64,
        "1.num_batches_tracked": np.int64,
        "extra.half": np.float16,
        "extra.mask": np.bool_,
        "extra.bytes": np.uint8,
        "extra.int32": np.int32,
        "extra.complex": np.complex64,
    }
    for key, dtype in expected_dtypes.items():
        assert record[key].dtype == dtype, key
    assert record["1.num_batches_tracked"].shape == ()
    assert int(record["1.num_batches_tracked"]) == 7
    np.testing.assert_array_equal(record["extra.half"], [[0, 1, 2], [3, 4, 5]])

    back = record.to_torch_state_dict()
    assert isinstance(back, OrderedDict)
    assert list(back) == list(state)
    for key, tensor in state.items():
        assert back[key].dtype == tensor.dtype, key
        assert back[key].device.type == "cpu"
        assert torch.equal(back[key], tensor), key
    fresh = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    ).double()
    fresh.load_state_dict({k: v for k, v in back.items() if not k.startswith("extra.")})
    assert int(fresh[1].num_batches_tracked) == 7


def test_tensors_requiring_grad_are_detached_and_share_memory(torch: ModuleType) -> None:
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    record = ArrayRecord({"w": weight})
    assert type(record.to_numpy_ndarrays()[0]) is np.ndarray
    assert record["w"].dtype == np.float32
    with torch.no_grad():
        weight.mul_(10)  # the array is a view of the tensor, as with Tensor.numpy()
    np.testing.assert_array_equal(record["w"], np.array([10.0, 20.0], np.float32))


def test_non_contiguous_tensors_keep_their_values(torch: ModuleType) -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    record = ArrayRecord({"t": base.t(), "every_other": base[:, ::2]})
    np.testing.assert_array_equal(record["t"], np.arange(12, dtype=np.float32).reshape(3, 4).T)
    np.testing.assert_array_equal(record["every_other"], [[0, 2], [4, 6], [8, 10]])
    back = record.to_torch_state_dict()
    assert torch.equal(back["t"], base.t())
    assert torch.equal(back["every_other"], base[:, ::2])


def test_single_tensors_and_lists_of_tensors(torch: ModuleType) -> None:
    assert list(ArrayRecord([torch.zeros(2), torch.ones(1)])) == ["0", "1"]
    record = ArrayRecord()
    record["b"] = torch.ones(2, dtype=torch.int16)
    assert record["b"].dtype == np.int16
    with pytest.raises(TypeError, match="single Tensor"):
        ArrayRecord(torch.zeros(3, 2))


@pytest.mark.parametrize("make", ["bfloat16", "float8_e4m3fn", "sparse", "meta"])
def test_tensors_numpy_cannot_hold_are_refused_with_the_key(torch: ModuleType, make: str) -> None:
    tensor = {
        "bfloat16": lambda: torch.ones(2, dtype=torch.bfloat16),
        "float8_e4m3fn": lambda: torch.ones(2).to(torch.float8_e4m3fn),
        "sparse": lambda: torch.eye(2).to_sparse(),
        "meta": lambda: torch.ones(2, device="meta"),
    }[make]()
    with pytest.raises(TypeError, match=r"ArrayRecord\['w'\] is a torch tensor"):
        ArrayRecord({"w": tensor})


def test_received_read_only_arrays_become_writable_copies(torch: ModuleType) -> None:
    sent = RecordDict({"arrays": ArrayRecord({"w": torch.arange(4, dtype=torch.float32)})})
    received = unpack_recorddict(pack_recorddict(sent))["arrays"]
    assert isinstance(received, ArrayRecord)
    assert not received["w"].flags.writeable
    tensor = received.to_torch_state_dict()["w"]
    tensor += 1  # must not write into the received (read-only) memory
    np.testing.assert_array_equal(received["w"], [0, 1, 2, 3])
    assert torch.equal(tensor, torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_writable_arrays_are_shared_and_unusual_layouts_copied(torch: ModuleType) -> None:
    plain = np.arange(3, dtype=np.int64)
    swapped = np.arange(3, dtype=">i4")
    reversed_ = np.arange(3, dtype=np.float64)[::-1]
    back = ArrayRecord({"plain": plain, "swapped": swapped, "reversed": reversed_})
    tensors = back.to_torch_state_dict()
    tensors["plain"][0] = 42
    assert plain[0] == 42
    assert tensors["swapped"].dtype == torch.int32
    assert tensors["swapped"].tolist() == [0, 1, 2]
    assert tensors["reversed"].tolist() == [2.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "dtype", ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]
)
def test_every_dtype_a_record_holds_reaches_torch_and_back(torch: ModuleType, dtype: str) -> None:
    arr = np.arange(6).astype(dtype).reshape(2, 3)
    tensor = ArrayRecord({"a": arr}).to_torch_state_dict()["a"]
    assert tuple(tensor.shape) == (2, 3)
    back = ArrayRecord({"a": tensor})["a"]
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, arr)


def test_records_take_arrays_while_another_thread_is_still_importing_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A ClientApp handler's `import torch` puts the module in sys.modules before it has
    # a Tensor; the engine building a record at that moment must not fail the run.
    monkeypatch.setitem(sys.modules, "torch", ModuleType("torch"))

    record = ArrayRecord({"w": np.zeros(2)})

    assert record["w"].numpy().tolist() == [0.0, 0.0]
