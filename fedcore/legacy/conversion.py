"""A Message's content as the legacy API's ``*Ins``/``*Res``, and back.

Two shapes of content meet here: the **legacy shape**, Flower's own
(``flwr.common.recorddict_compat``: ``fitins.parameters``, ``fitres.num_examples``, …),
and the **Message-API shape** that Message-API strategies send and read (``arrays``
and ``config`` out; ``arrays`` and ``metrics`` with ``num-examples`` back). So that a
legacy client answers a Message-API strategy and a Message-API handler answers the
legacy server, each is translated to the other here, and only here; the mapping, key
by key, is in docs/from-flower.md ("The legacy API: the client side"). Tensors of
``tensor_type`` ``"numpy.ndarray"`` become plain arrays; any other serialisation is
kept as given, as Flower does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, TypeVar, cast

import numpy as np

from fedcore.domain.array import Array, NDArray, SerializedArray, check_array
from fedcore.domain.records import (
    ArrayRecord,
    ConfigRecord,
    ConfigValue,
    MetricRecord,
    MetricValue,
    RecordDict,
)
from fedcore.legacy.types import (
    NUMPY_TENSOR_TYPE,
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    Scalar,
    Status,
    bytes_to_ndarray,
    ndarray_to_bytes,
)

EMPTY_TENSOR_KEY = "_empty"
"""The one key of the ArrayRecord of Parameters without tensors (it keeps their type)."""

NUM_EXAMPLES_KEY = "num-examples"
"""The metric a Message-API strategy weighs a reply by (FedAvg's ``weighted_by_key``)."""
ARRAYS_KEY, CONFIG_KEY, METRICS_KEY = "arrays", "config", "metrics"
OTHER_METRICS_KEY = "other-metrics"
"""The ConfigRecord of a legacy client's metrics that a MetricRecord cannot hold."""
LOSS_KEYS = ("loss", "eval_loss")
"""Where a Message-API evaluate reply's loss is read from, first found first."""

Value: TypeAlias = (
    bool
    | bytes
    | float
    | int
    | str
    | list[bool]
    | list[bytes]
    | list[float]
    | list[int]
    | list[str]
)
"""Flower's ``flwr.common.typing.Value``: a Scalar, or a list of one kind of them."""


class MessageTypeLegacy:
    """The message types of the legacy calls that have no Message-API category."""

    GET_PROPERTIES = "get_properties"
    GET_PARAMETERS = "get_parameters"

    def __new__(cls) -> MessageTypeLegacy:
        raise TypeError("MessageTypeLegacy is a namespace of constants")


# ---- Parameters <-> ArrayRecord


def parameters_to_arrayrecord(parameters: Parameters, keep_input: bool) -> ArrayRecord:
    """``parameters`` as an ArrayRecord under ``"0"``, ``"1"``, …; ``_empty`` if none.

    ``keep_input=False`` takes each tensor out of ``parameters.tensors`` once stored.
    """
    arrays: dict[str, NDArray] = {}
    count = len(parameters.tensors)
    for index in range(count):
        tensor = parameters.tensors[index] if keep_input else parameters.tensors.pop(0)
        arrays[str(index)] = _tensor_array(tensor, parameters.tensor_type)
    if count == 0:
        arrays[EMPTY_TENSOR_KEY] = _no_tensors(parameters.tensor_type)
    return ArrayRecord(arrays)


def arrayrecord_to_parameters(record: ArrayRecord, keep_input: bool) -> Parameters:
    """``record``'s arrays, in order, as Parameters of the first array's serialisation.

    ``keep_input=False`` empties ``record`` as it goes.
    """
    parameters = Parameters(tensors=[], tensor_type="")
    for key in list(record):
        array = record[key]
        if key != EMPTY_TENSOR_KEY:
            parameters.tensors.append(_tensor_bytes(array))
        if not parameters.tensor_type:
            parameters.tensor_type = array.stype
        if not keep_input:
            del record[key]
    return parameters


def _tensor_array(tensor: bytes, tensor_type: str) -> NDArray:
    """A tensor as a record holds it: the array, if it is ``numpy.save`` output of a
    dtype a record holds as an array; else its bytes kept as given, unread, as Flower
    keeps every tensor (a ``<U7`` array of strings, say, travels as those bytes)."""
    if tensor_type == NUMPY_TENSOR_TYPE:
        try:
            return check_array("", bytes_to_ndarray(tensor))
        except (ValueError, OSError, EOFError, TypeError):
            pass  # not numpy.save output of a numeric array: kept as given
    return Array(dtype="", shape=(), stype=tensor_type, data=tensor)


def _no_tensors(tensor_type: str) -> NDArray:
    """The ``_empty`` entry: an empty array for numpy tensors or none named (so the
    record can travel; it reads back as ``"numpy.ndarray"``), else the type kept in an
    Array of no data."""
    if tensor_type in ("", NUMPY_TENSOR_TYPE):
        return np.empty(0, dtype=np.float32)
    return Array(dtype="", shape=(), stype=tensor_type, data=b"")


def _tensor_bytes(array: Array) -> bytes:
    if isinstance(array, SerializedArray):
        return array.data
    return ndarray_to_bytes(array.numpy())


# ---- record values <-> legacy dicts


def _scalars(record: Mapping[str, ConfigValue | MetricValue], what: str) -> dict[str, Scalar]:
    """``record`` as the legacy API's ``dict[str, Scalar]``; ``TypeError`` for a list."""
    for key, value in record.items():
        if not isinstance(value, bool | bytes | float | int | str):
            raise TypeError(
                f"{what}[{key!r}] is a {type(value).__name__}: the legacy API's values are "
                "Scalars (bool, bytes, float, int, str); a list has no legacy form"
            )
    return cast(dict[str, Scalar], dict(record))


def _status_record(status: Status) -> ConfigRecord:
    return ConfigRecord({"code": int(status.code.value), "message": status.message})


def _status(content: RecordDict, res: str) -> Status:
    record = _config(content, f"{res}.status")
    return Status(code=Code(cast(int, record["code"])), message=str(record["message"]))


def _arrays(content: RecordDict, key: str) -> ArrayRecord:
    return cast(ArrayRecord, _record(content, key, ArrayRecord))


def _config(content: RecordDict, key: str) -> ConfigRecord:
    return cast(ConfigRecord, _record(content, key, ConfigRecord))


def _metrics(content: RecordDict, key: str) -> MetricRecord:
    return cast(MetricRecord, _record(content, key, MetricRecord))


def _record(
    content: RecordDict, key: str, kind: type[ArrayRecord | ConfigRecord | MetricRecord]
) -> object:
    record = content.get(key)
    if not isinstance(record, kind):
        raise KeyError(f"the content has no {kind.__name__} {key!r} (it has {sorted(content)})")
    return record


# ---- Flower's recorddict_compat: the legacy shape


def _ins_to_recorddict(ins: FitIns | EvaluateIns, keep_input: bool) -> RecordDict:
    name = "fitins" if isinstance(ins, FitIns) else "evaluateins"
    return RecordDict(
        {
            f"{name}.parameters": parameters_to_arrayrecord(ins.parameters, keep_input),
            f"{name}.config": ConfigRecord(ins.config),
        }
    )


def _ins_parts(
    content: RecordDict, name: str, keep_input: bool
) -> tuple[Parameters, dict[str, Scalar]]:
    parameters = arrayrecord_to_parameters(_arrays(content, f"{name}.parameters"), keep_input)
    return parameters, _scalars(_config(content, f"{name}.config"), f"{name}.config")


def recorddict_to_fitins(recorddict: RecordDict, keep_input: bool) -> FitIns:
    parameters, config = _ins_parts(recorddict, "fitins", keep_input)
    return FitIns(parameters=parameters, config=config)


def fitins_to_recorddict(fitins: FitIns, keep_input: bool) -> RecordDict:
    return _ins_to_recorddict(fitins, keep_input)


def recorddict_to_evaluateins(recorddict: RecordDict, keep_input: bool) -> EvaluateIns:
    parameters, config = _ins_parts(recorddict, "evaluateins", keep_input)
    return EvaluateIns(parameters=parameters, config=config)


def evaluateins_to_recorddict(evaluateins: EvaluateIns, keep_input: bool) -> RecordDict:
    return _ins_to_recorddict(evaluateins, keep_input)


def recorddict_to_fitres(recorddict: RecordDict, keep_input: bool) -> FitRes:
    parameters = arrayrecord_to_parameters(_arrays(recorddict, "fitres.parameters"), keep_input)
    num_examples = _metrics(recorddict, "fitres.num_examples")["num_examples"]
    return FitRes(
        status=_status(recorddict, "fitres"),
        parameters=parameters,
        num_examples=cast(int, num_examples),
        metrics=_scalars(_config(recorddict, "fitres.metrics"), "fitres.metrics"),
    )


def fitres_to_recorddict(fitres: FitRes, keep_input: bool) -> RecordDict:
    return RecordDict(
        {
            "fitres.metrics": ConfigRecord(fitres.metrics),
            "fitres.num_examples": MetricRecord({"num_examples": fitres.num_examples}),
            "fitres.parameters": parameters_to_arrayrecord(fitres.parameters, keep_input),
            "fitres.status": _status_record(fitres.status),
        }
    )


def recorddict_to_evaluateres(recorddict: RecordDict) -> EvaluateRes:
    loss = _metrics(recorddict, "evaluateres.loss")["loss"]
    num_examples = _metrics(recorddict, "evaluateres.num_examples")["num_examples"]
    return EvaluateRes(
        status=_status(recorddict, "evaluateres"),
        loss=cast(float, loss),
        num_examples=cast(int, num_examples),
        metrics=_scalars(_config(recorddict, "evaluateres.metrics"), "evaluateres.metrics"),
    )


def evaluateres_to_recorddict(evaluateres: EvaluateRes) -> RecordDict:
    return RecordDict(
        {
            "evaluateres.loss": MetricRecord({"loss": evaluateres.loss}),
            "evaluateres.num_examples": MetricRecord({"num_examples": evaluateres.num_examples}),
            "evaluateres.metrics": ConfigRecord(evaluateres.metrics),
            "evaluateres.status": _status_record(evaluateres.status),
        }
    )


def recorddict_to_getparametersins(recorddict: RecordDict) -> GetParametersIns:
    record = _config(recorddict, "getparametersins.config")
    return GetParametersIns(config=_scalars(record, "getparametersins.config"))


def getparametersins_to_recorddict(getparameters_ins: GetParametersIns) -> RecordDict:
    return RecordDict({"getparametersins.config": ConfigRecord(getparameters_ins.config)})


def getparametersres_to_recorddict(
    getparametersres: GetParametersRes, keep_input: bool
) -> RecordDict:
    return RecordDict(
        {
            "getparametersres.parameters": parameters_to_arrayrecord(
                getparametersres.parameters, keep_input
            ),
            "getparametersres.status": _status_record(getparametersres.status),
        }
    )


def recorddict_to_getparametersres(recorddict: RecordDict, keep_input: bool) -> GetParametersRes:
    record = _arrays(recorddict, "getparametersres.parameters")
    return GetParametersRes(
        status=_status(recorddict, "getparametersres"),
        parameters=arrayrecord_to_parameters(record, keep_input),
    )


def recorddict_to_getpropertiesins(recorddict: RecordDict) -> GetPropertiesIns:
    record = _config(recorddict, "getpropertiesins.config")
    return GetPropertiesIns(config=_scalars(record, "getpropertiesins.config"))


def getpropertiesins_to_recorddict(getpropertiesins: GetPropertiesIns) -> RecordDict:
    return RecordDict({"getpropertiesins.config": ConfigRecord(getpropertiesins.config)})


def recorddict_to_getpropertiesres(recorddict: RecordDict) -> GetPropertiesRes:
    record = _config(recorddict, "getpropertiesres.properties")
    return GetPropertiesRes(
        status=_status(recorddict, "getpropertiesres"),
        properties=_scalars(record, "getpropertiesres.properties"),
    )


def getpropertiesres_to_recorddict(getpropertiesres: GetPropertiesRes) -> RecordDict:
    return RecordDict(
        {
            "getpropertiesres.properties": ConfigRecord(getpropertiesres.properties),
            "getpropertiesres.status": _status_record(getpropertiesres.status),
        }
    )


# ---- the Message-API shape


def is_legacy_content(content: RecordDict, ins: str) -> bool:
    """Whether ``content`` holds a legacy ``ins`` (``"fitins"``, ``"evaluateins"``)."""
    return f"{ins}.parameters" in content or f"{ins}.config" in content


def message_api_ins(content: RecordDict) -> tuple[Parameters, dict[str, Scalar], list[str]]:
    """A Message-API train/evaluate content's parameters, config and array names.

    The content holds at most one ArrayRecord (the model; none: no parameters) and at
    most one ConfigRecord (none: an empty config), under any names.
    """
    arrays = _single(content.array_records, "ArrayRecord")
    configs = _single(content.config_records, "ConfigRecord")
    record = ArrayRecord() if arrays is None else arrays
    parameters = Parameters(
        tensors=[_tensor_bytes(record[key]) for key in record], tensor_type=NUMPY_TENSOR_TYPE
    )
    config = {} if configs is None else _scalars(configs, "the config")
    return parameters, config, list(record)


_R = TypeVar("_R", ArrayRecord, ConfigRecord)


def _single(records: Mapping[str, _R], kind: str) -> _R | None:
    if len(records) > 1:
        raise ValueError(
            f"a legacy client takes one {kind} of a message, this one has {sorted(records)}"
        )
    return next(iter(records.values()), None)


def fitres_to_message_api(fitres: FitRes, names: Sequence[str]) -> RecordDict:
    """``fitres`` as a Message-API train reply: the arrays under ``names`` (those they
    were sent with; ``"0"``, ``"1"``, … when the client returned another count)."""
    _check_ok(fitres.status)
    tensors = fitres.parameters.tensors
    keys = list(names) if len(names) == len(tensors) else [str(i) for i in range(len(tensors))]
    arrays = ArrayRecord(
        {
            key: _tensor_array(t, fitres.parameters.tensor_type)
            for key, t in zip(keys, tensors, strict=True)
        }
    )
    return RecordDict({ARRAYS_KEY: arrays, **_metric_records(fitres.num_examples, fitres.metrics)})


def evaluateres_to_message_api(evaluateres: EvaluateRes) -> RecordDict:
    """``evaluateres`` as a Message-API evaluate reply: its loss a metric ``loss``."""
    _check_ok(evaluateres.status)
    metrics = {**evaluateres.metrics, "loss": evaluateres.loss}
    return RecordDict(_metric_records(evaluateres.num_examples, metrics))


def _check_ok(status: Status) -> None:
    """A Message-API reply has no status: a legacy answer that is not OK is an error."""
    if status.code != Code.OK:
        raise RuntimeError(f"{status.code.name}: {status.message}")


def _metric_records(
    num_examples: int, metrics: Mapping[str, Scalar]
) -> dict[str, MetricRecord | ConfigRecord]:
    numbers = {
        key: value
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    others = {key: value for key, value in metrics.items() if key not in numbers}
    records: dict[str, MetricRecord | ConfigRecord] = {
        METRICS_KEY: MetricRecord({**numbers, NUM_EXAMPLES_KEY: num_examples})
    }
    if others:
        records[OTHER_METRICS_KEY] = ConfigRecord(others)
    return records


def legacy_ins_to_message_api(content: RecordDict, ins: str) -> RecordDict:
    """A legacy FitIns/EvaluateIns content (``ins``: ``"fitins"``, ``"evaluateins"``) as
    Message-API content: ``arrays`` keyed ``"0"``, ``"1"``, …, and ``config``."""
    parameters, config = _ins_parts(content, ins, keep_input=True)
    arrays = ArrayRecord(
        {
            str(index): _tensor_array(tensor, parameters.tensor_type)
            for index, tensor in enumerate(parameters.tensors)
        }
    )
    return RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: ConfigRecord(config)})


def message_api_to_fitres(content: RecordDict) -> RecordDict:
    """A Message-API train reply as legacy FitRes content: its one ArrayRecord's arrays,
    its ``num-examples`` and its other metrics (and config records' values)."""
    arrays = _single(content.array_records, "ArrayRecord")
    parameters = arrayrecord_to_parameters(
        ArrayRecord() if arrays is None else arrays, keep_input=True
    )
    if not parameters.tensor_type:
        parameters.tensor_type = NUMPY_TENSOR_TYPE
    num_examples, metrics = _reply_metrics(content)
    ok = Status(code=Code.OK, message="Success")
    fitres = FitRes(status=ok, parameters=parameters, num_examples=num_examples, metrics=metrics)
    return fitres_to_recorddict(fitres, keep_input=False)


def message_api_to_evaluateres(content: RecordDict) -> RecordDict:
    """A Message-API evaluate reply as legacy EvaluateRes content: the loss is its metric
    ``loss`` (else ``eval_loss``), taken out of the metrics."""
    num_examples, metrics = _reply_metrics(content)
    found = next((key for key in LOSS_KEYS if key in metrics), None)
    if found is None:
        raise ValueError(
            f"an evaluate reply to the legacy server needs a loss: a metric {LOSS_KEYS[0]!r} "
            f"or {LOSS_KEYS[1]!r} (it has {sorted(metrics)})"
        )
    loss = metrics.pop(found)
    ok = Status(code=Code.OK, message="Success")
    evaluateres = EvaluateRes(
        status=ok, loss=float(loss), num_examples=num_examples, metrics=metrics
    )
    return evaluateres_to_recorddict(evaluateres)


def _reply_metrics(content: RecordDict) -> tuple[int, dict[str, Scalar]]:
    """A Message-API reply's ``num-examples`` and its other metric and config values."""
    metrics: dict[str, Scalar] = {}
    for metric_record in content.metric_records.values():
        metrics.update(_scalars(metric_record, "the reply's metrics"))
    for config_record in content.config_records.values():
        metrics.update(_scalars(config_record, "the reply's metrics"))
    num_examples = metrics.pop(NUM_EXAMPLES_KEY, None)
    if not isinstance(num_examples, int) or isinstance(num_examples, bool):
        raise ValueError(
            f"a reply to the legacy server needs an int metric {NUM_EXAMPLES_KEY!r}, "
            f"got {num_examples!r}"
        )
    return num_examples, metrics
