from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, MetricRecord, RecordDict


def test_array_record_from_mapping_keeps_arrays_without_copy() -> None:
    w = np.ones((2, 3), dtype=np.float32)
    record = ArrayRecord({"w": w})
    # What is stored is the array given; an item read is an Array viewing it.
    assert record.to_numpy_ndarrays()[0] is w
    assert record["w"].numpy() is w
    assert np.shares_memory(record["w"], w)
    w[0, 0] = 5
    assert record["w"][0, 0] == 5


def test_array_record_from_list_gets_numbered_keys() -> None:
    arrays = [np.zeros(2), np.ones(3), np.arange(4)]
    record = ArrayRecord(arrays)
    assert list(record) == ["0", "1", "2"]
    assert all(a is b for a, b in zip(record.to_numpy_ndarrays(), arrays, strict=True))


def test_array_record_nbytes() -> None:
    assert ArrayRecord({"a": np.zeros(10, np.float32), "b": np.zeros(2)}).nbytes == 56


@pytest.mark.parametrize("value", [[1.0, 2.0], 3.0, "w", None, np.array(["a"]), np.array([None])])
def test_array_record_rejects_non_arrays(value: object) -> None:
    with pytest.raises(TypeError, match="ArrayRecord"):
        ArrayRecord({"w": value})  # type: ignore[dict-item]


def test_array_record_rejects_structured_and_bad_keys() -> None:
    with pytest.raises(TypeError, match="dtype"):
        ArrayRecord({"w": np.zeros(2, dtype=[("a", "i4")])})
    with pytest.raises(TypeError, match="keys must be str"):
        ArrayRecord({1: np.zeros(1)})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="single ndarray"):
        ArrayRecord(np.zeros(3))
    record = ArrayRecord()
    with pytest.raises(TypeError):
        record["x"] = [1, 2]  # type: ignore[assignment]


def test_array_record_equality_is_exact() -> None:
    a = ArrayRecord({"w": np.array([1.0, np.nan])})
    assert a == ArrayRecord({"w": np.array([1.0, np.nan])})
    assert a != ArrayRecord({"w": np.array([1.0, np.nan], dtype=np.float32)})
    assert a != ArrayRecord({"v": np.array([1.0, np.nan])})
    assert ArrayRecord({"w": np.array([0.0])}) != ArrayRecord({"w": np.array([-0.0])})


def test_metric_record_types() -> None:
    record = MetricRecord({"n": 3, "loss": 0.5, "hist": [1.0, 2.5], "np": np.float32(0.25)})
    assert record["np"] == 0.25
    assert type(record["np"]) is float
    assert type(MetricRecord({"i": np.int64(4)})["i"]) is int
    assert MetricRecord({"np": [np.float32(1), 2.5]})["np"] == [1.0, 2.5]
    # A list holds numbers of one type, as in Flower: [1, 2.5] is refused.
    for bad in (True, "x", None, [1, "a"], [1, 2.5], {"a": 1}, 2**64):
        with pytest.raises(TypeError):
            MetricRecord({"m": bad})  # type: ignore[dict-item]


def test_config_record_types() -> None:
    record = ConfigRecord({"lr": 0.1, "name": "x", "on": True, "raw": b"\x00", "ids": [1, 2]})
    assert record["on"] is True
    assert ConfigRecord({"flags": (True, np.bool_(False))})["flags"] == [True, False]
    for bad in (None, {"a": 1}, [1, "a"], [True, 1], [1, 2.5], object(), -(2**63) - 1):
        with pytest.raises(TypeError):
            ConfigRecord({"c": bad})  # type: ignore[dict-item]


def test_records_tell_int_from_float_and_bool() -> None:
    assert ConfigRecord({"x": 1}) != ConfigRecord({"x": 1.0})
    assert ConfigRecord({"x": True}) != ConfigRecord({"x": 1})
    assert MetricRecord({"x": float("nan")}) == MetricRecord({"x": float("nan")})


def test_records_equal_dicts_of_the_same_items_and_copy_shallowly() -> None:
    # As Flower's records (Mappings equal to dicts); values compare as between records.
    assert MetricRecord({"a": 1, "b": [0.5]}) == {"b": [0.5], "a": 1}
    assert MetricRecord({"a": 1}) != {"a": 1.0}
    assert ConfigRecord({"s": "x"}) == {"s": "x"}
    w = np.arange(3.0)
    assert ArrayRecord({"w": w}) == {"w": w.copy()}
    assert ArrayRecord({"w": w}) != {"w": w.astype(np.float32)}
    content = RecordDict({"m": MetricRecord({"a": 1})})
    assert content == {"m": {"a": 1}}
    for record in (
        MetricRecord({"a": 1}),
        ConfigRecord({"a": "b"}),
        ArrayRecord({"w": w}),
        content,
    ):
        copied = record.copy()
        assert type(copied) is type(record)
        assert copied == record
        record.clear()
        assert len(copied) == 1
    assert ArrayRecord({"w": w}).copy()["w"].numpy() is w


def test_metric_and_config_records_count_bytes_as_flower() -> None:
    assert MetricRecord({"a": 1, "bb": [1.0, 2.0]}).count_bytes() == 8 + 1 + 16 + 2
    config = ConfigRecord({"f": True, "n": 2, "s": "abc", "b": b"xy", "l": ["a", "bc"], "e": []})
    assert config.count_bytes() == 1 + 8 + 3 + 2 + 3 + 0 + 6


def test_keep_input_false_takes_the_items_out_of_the_dict_given() -> None:
    given = {"a": 1, "b": 2.0}
    assert MetricRecord(given, keep_input=False) == {"a": 1, "b": 2.0}
    assert given == {}
    config = {"c": "x"}
    assert ConfigRecord(config, keep_input=False) == {"c": "x"}
    assert config == {}


def test_flowers_deprecated_record_dict_spellings_warn() -> None:
    metrics = MetricRecord({"a": 1})
    with pytest.warns(DeprecationWarning, match="deprecated"):
        content = RecordDict(metrics_records={"m": metrics})
    with pytest.warns(DeprecationWarning, match="metric_records"):
        assert content.metrics_records == {"m": metrics}
    with pytest.warns(DeprecationWarning, match="array_records"):
        assert content.parameters_records == {}
    with pytest.warns(DeprecationWarning, match="config_records"):
        assert content.configs_records == {}


def test_a_record_dicts_repr_is_flowers() -> None:
    content = RecordDict({"a": ArrayRecord(), "m": MetricRecord({"x": 1})})
    assert repr(content) == (
        "RecordDict(\n  array_records={'a': {}},\n  metric_records={'m': {'x': 1}},\n"
        "  config_records={}\n)"
    )


def test_record_dict_holds_records_only() -> None:
    arrays, metrics, config = ArrayRecord(), MetricRecord({"a": 1}), ConfigRecord({"b": "c"})
    content = RecordDict({"arrays": arrays, "metrics": metrics, "config": config})
    assert content.array_records == {"arrays": arrays}
    assert content.metric_records == {"metrics": metrics}
    assert content.config_records == {"config": config}
    with pytest.raises(TypeError, match="RecordDict"):
        RecordDict({"x": {"a": 1}})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        content["x"] = np.zeros(1)  # type: ignore[assignment]


def test_a_record_dicts_views_of_one_kind_write_through() -> None:
    # Flower's e2e apps keep state as `context.state.config_records[K] = ConfigRecord(...)`.
    content = RecordDict({"arrays": ArrayRecord()})
    content.config_records["state"] = ConfigRecord({"t": "1"})
    assert content["state"] == {"t": "1"}
    content.metric_records.update({"m": MetricRecord({"x": 1})})
    assert list(content) == ["arrays", "state", "m"]
    assert list(content.config_records) == ["state"]
    assert len(content.metric_records) == 1
    with pytest.raises(TypeError, match=r"config_records\['x'\] must be a ConfigRecord"):
        content.config_records["x"] = MetricRecord()  # type: ignore[assignment]
    with pytest.raises(KeyError):
        del content.config_records["arrays"]  # an ArrayRecord is not a config record
    with pytest.raises(KeyError):
        content.metric_records["arrays"]
    del content.config_records["state"]
    assert "state" not in content
    assert repr(content.config_records) == "{}"


def test_records_are_unhashable_mappings() -> None:
    with pytest.raises(TypeError):
        hash(MetricRecord())
    record = ConfigRecord({"a": 1})
    record.update({"b": 2})
    del record["a"]
    assert dict(record) == {"b": 2}
    assert "ConfigRecord" in repr(record)
    assert (
        repr(ArrayRecord({"w": np.zeros((2, 3), np.float32)}))
        == "ArrayRecord({'w': float32[2, 3]})"
    )


def test_array_subclasses_are_stored_as_plain_views(tmp_path: Path) -> None:
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="w+", shape=(3,))
    stored = ArrayRecord({"m": mapped}).to_numpy_ndarrays()[0]
    assert type(stored) is np.ndarray
    assert np.shares_memory(stored, mapped)
    del stored, mapped
    with pytest.raises(TypeError, match="masked"):
        ArrayRecord({"m": np.ma.masked_array([1, 2], mask=[0, 1])})
    with pytest.raises(TypeError, match="dtype"):
        ArrayRecord({"x": np.zeros(2, dtype=np.longdouble)})


def test_config_strings_are_stored_as_exact_str_and_bytes() -> None:
    class Name(str):
        pass

    class Raw(bytes):
        pass

    record = ConfigRecord({"n": Name("x"), "b": Raw(b"y")})
    assert type(record["n"]) is str
    assert type(record["b"]) is bytes
