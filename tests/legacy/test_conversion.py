"""fedcore.legacy.conversion: legacy Parameters in fedcore's records, and each shape of
content as the other (Flower's own round trips run in tests/flower_unit)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from fedcore.domain import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.domain.array import SerializedArray
from fedcore.legacy import conversion
from fedcore.legacy.types import (
    Code,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from fedcore.wire.records import pack_recorddict, unpack_recorddict

OK = Status(code=Code.OK, message="Success")


def test_numpy_tensors_are_plain_arrays_in_the_record_and_the_same_bytes_back() -> None:
    arrays = [np.arange(6, dtype=np.int16).reshape(2, 3), np.eye(2)]
    parameters = ndarrays_to_parameters(arrays)

    record = conversion.parameters_to_arrayrecord(parameters, keep_input=True)

    assert list(record) == ["0", "1"]
    assert record["0"].dtype == np.int16
    assert record["0"].shape == (2, 3)
    back = conversion.arrayrecord_to_parameters(record, keep_input=True)
    assert back == parameters


def test_legacy_content_travels_on_fedcores_wire() -> None:
    fitres = FitRes(OK, ndarrays_to_parameters([np.ones(3)]), 4, {"acc": 0.5, "tag": "x"})
    not_implemented = FitRes(
        Status(Code.FIT_NOT_IMPLEMENTED, "Client does not implement `fit`"),
        Parameters(tensors=[], tensor_type=""),
        0,
        {},
    )

    for res in (fitres, not_implemented):
        content = conversion.fitres_to_recorddict(res, keep_input=True)
        received = conversion.recorddict_to_fitres(
            unpack_recorddict(pack_recorddict(content)), True
        )
        assert (received.status, received.num_examples, received.metrics) == (
            res.status,
            res.num_examples,
            res.metrics,
        )
        sent = parameters_to_ndarrays(res.parameters)
        got = parameters_to_ndarrays(received.parameters)
        assert len(got) == len(sent)
        assert all(np.array_equal(a, b) for a, b in zip(got, sent, strict=True))
    empty = conversion.parameters_to_arrayrecord(not_implemented.parameters, keep_input=True)
    assert list(empty) == [conversion.EMPTY_TENSOR_KEY]


def test_tensors_of_another_serialisation_are_kept_as_given() -> None:
    parameters = Parameters(tensors=[b"\x01\x02", b"\x03"], tensor_type="my.format")

    record = conversion.parameters_to_arrayrecord(parameters, keep_input=True)

    assert isinstance(record["0"], SerializedArray)
    assert (record["0"].stype, record["0"].data) == ("my.format", b"\x01\x02")
    assert conversion.arrayrecord_to_parameters(record, keep_input=True) == parameters
    none = conversion.parameters_to_arrayrecord(Parameters([], "my.format"), keep_input=True)
    assert conversion.arrayrecord_to_parameters(none, keep_input=True) == Parameters(
        [], "my.format"
    )


def test_keep_input_false_empties_what_was_converted() -> None:
    parameters = ndarrays_to_parameters([np.ones(1), np.zeros(1)])

    record = conversion.parameters_to_arrayrecord(parameters, keep_input=False)
    back = conversion.arrayrecord_to_parameters(record, keep_input=False)

    assert parameters.tensors == []
    assert len(record) == 0
    assert len(back.tensors) == 2


def test_a_list_in_a_config_has_no_legacy_form() -> None:
    content = conversion.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters([]), {}), keep_input=True
    )
    content["fitins.config"] = ConfigRecord({"layers": [1, 2]})

    with pytest.raises(TypeError, match=r"fitins.config\['layers'\] is a list"):
        conversion.recorddict_to_fitins(content, keep_input=True)


def test_message_api_content_as_ins_and_the_answer_back_under_the_names_sent() -> None:
    content = RecordDict(
        {
            "weights": ArrayRecord({"w": np.ones(2), "b": np.zeros(1)}),
            "settings": ConfigRecord({"lr": 0.1}),
        }
    )

    parameters, config, names = conversion.message_api_ins(content)
    fitres = FitRes(OK, ndarrays_to_parameters(parameters_to_ndarrays(parameters)), 3, {"n": 1})
    reply = conversion.fitres_to_message_api(fitres, names)

    assert (config, names) == ({"lr": 0.1}, ["w", "b"])
    assert list(reply["arrays"]) == ["w", "b"]
    assert reply["metrics"] == MetricRecord({"n": 1, "num-examples": 3})
    other_count = conversion.fitres_to_message_api(fitres, ["only-one"])
    assert list(other_count["arrays"]) == ["0", "1"]


def test_message_api_content_with_two_array_records_is_refused() -> None:
    content = RecordDict({"a": ArrayRecord([np.ones(1)]), "b": ArrayRecord([np.ones(1)])})

    with pytest.raises(ValueError, match="one ArrayRecord of a message"):
        conversion.message_api_ins(content)


def test_an_evaluate_answer_in_the_message_api_shape() -> None:
    reply = conversion.evaluateres_to_message_api(
        EvaluateRes(OK, 0.5, 7, {"acc": 0.9, "split": "val", "best": False})
    )

    assert reply["metrics"] == MetricRecord({"acc": 0.9, "loss": 0.5, "num-examples": 7})
    assert reply["other-metrics"] == ConfigRecord({"split": "val", "best": False})


def test_legacy_instructions_in_the_message_api_shape_and_the_reply_back() -> None:
    fitins = FitIns(ndarrays_to_parameters([np.ones(2), np.zeros(3)]), {"epochs": 2})
    legacy = conversion.fitins_to_recorddict(fitins, keep_input=True)

    content = conversion.legacy_ins_to_message_api(legacy, "fitins")
    answer = RecordDict(
        {
            "arrays": content["arrays"],
            "metrics": MetricRecord({"num-examples": 6, "loss": 0.1}),
            "config": ConfigRecord({"note": "ok"}),
        }
    )
    fitres = conversion.recorddict_to_fitres(conversion.message_api_to_fitres(answer), True)

    assert list(content["arrays"]) == ["0", "1"]
    assert content["config"] == ConfigRecord({"epochs": 2})
    assert (fitres.num_examples, fitres.metrics) == (6, {"loss": 0.1, "note": "ok"})
    assert fitres.parameters == fitins.parameters


def test_a_reply_to_the_legacy_server_needs_an_int_num_examples() -> None:
    answer = RecordDict({"metrics": MetricRecord({"num-examples": 2.5, "loss": 1.0})})

    with pytest.raises(ValueError, match="needs an int metric 'num-examples'"):
        conversion.message_api_to_evaluateres(answer)


def test_numpy_tensors_of_strings_are_kept_as_given_and_travel() -> None:
    # e2e-pandas' strategy returns numpy.save bytes of a "<U…" array: a record holds no
    # such array, so the tensor is kept as Flower keeps every tensor, its bytes unread.
    strings = np.array(["sepal length (cm)", "petal width (cm)"])
    parameters = ndarrays_to_parameters([strings, np.ones(3, dtype=np.float32)])

    record = conversion.parameters_to_arrayrecord(parameters, keep_input=True)

    assert isinstance(record["0"], SerializedArray)
    assert (record["0"].dtype, record["0"].shape) == ("", ())
    assert (record["0"].stype, record["0"].data) == ("numpy.ndarray", parameters.tensors[0])
    assert not isinstance(record["1"], SerializedArray)
    sent = unpack_recorddict(pack_recorddict(RecordDict({"fitins.parameters": record})))
    back = conversion.arrayrecord_to_parameters(
        cast(ArrayRecord, sent["fitins.parameters"]), keep_input=True
    )
    assert back == parameters
    np.testing.assert_array_equal(parameters_to_ndarrays(back)[0], strings)
