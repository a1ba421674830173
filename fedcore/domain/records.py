"""Records: the typed payloads a Message carries.

Three record kinds, each a mutable mapping from ``str`` keys to checked values:

- :class:`ArrayRecord` — numpy arrays (model parameters, gradients), read back as
  :class:`Array`, an ndarray that also answers Flower's ``Array`` API (``.numpy()``);
- :class:`MetricRecord` — numbers to aggregate: ``int | float | list[int | float]``;
- :class:`ConfigRecord` — settings: ``bool | int | float | str | bytes`` or a list of one of them;

and :class:`RecordDict`, which maps names to records. Values are checked when they are
stored, so a wrong type raises ``TypeError`` where the mistake is made rather than as
a decoding error on some other machine. Numpy scalars are accepted and stored as the
Python value they hold, which keeps the wire format free of numpy types.

PyTorch is optional. An :class:`ArrayRecord` accepts torch tensors (so
``ArrayRecord(model.state_dict())`` works) and gives them back with
:meth:`ArrayRecord.to_torch_state_dict`, yet this module never imports torch to
recognise one: it looks torch up in ``sys.modules``, because a program that never
imported torch cannot hold a tensor. ``import fedcore`` therefore stays free of torch.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Self, TypeAlias, TypeVar, cast

import numpy as np

from fedcore.domain.array import (
    Array,
    NDArray,
    SerializedArray,
    array_to_tensor,
    check_array,
    import_torch,
    is_tensor,
    tensor_to_array,
)

MetricValue: TypeAlias = int | float | list[int] | list[float] | list[int | float]
ConfigScalar: TypeAlias = bool | int | float | str | bytes
ConfigValue: TypeAlias = ConfigScalar | list[ConfigScalar]

# Flower's names for these value types, as ``flwr.app`` offers them to annotations.
MetricScalar: TypeAlias = int | float
MetricScalarList: TypeAlias = list[int] | list[float]
MetricRecordValues: TypeAlias = MetricValue
ConfigScalarList: TypeAlias = list[bool] | list[int] | list[float] | list[str] | list[bytes]
ConfigRecordValues: TypeAlias = ConfigValue

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

_T = TypeVar("_T")


def _check_key(record: str, key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"{record} keys must be str, got {type(key).__name__}: {key!r}")
    return key


class _Record(MutableMapping[str, _T]):
    """A dict with a value check on every write.

    As Flower's records, a record equals a plain dict of the same items
    (``MetricRecord({"a": 1}) == {"a": 1}``), and :meth:`copy` is a shallow copy.
    """

    __slots__ = ("__weakref__", "_data")

    def __init__(self) -> None:
        self._data: dict[str, _T] = {}

    def _check(self, key: str, value: object) -> _T:
        raise NotImplementedError

    def __setitem__(self, key: str, value: _T) -> None:
        self._data[_check_key(type(self).__name__, key)] = self._check(key, value)

    def __getitem__(self, key: str) -> _T:
        return self._data[key]

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items_repr()})"

    def _items_repr(self) -> str:
        """The items as a dict's repr shows them (a RecordDict's repr shows records so)."""
        return repr(self._data)

    def copy(self) -> Self:
        """A record of the same kind with the same items (the values are not copied)."""
        copied = type(self).__new__(type(self))
        copied._data = self._data.copy()
        return copied

    def _items_of(self, other: object) -> Mapping[str, Any] | None:
        """What ``==`` compares this record's items with: another record's of the same
        kind, or a dict's; None for anything else."""
        if isinstance(other, type(self)):
            return other._data
        return other if isinstance(other, dict) else None


def _deprecated(name: str, instead: str = "records") -> None:
    warnings.warn(
        f"{name} is Flower's deprecated spelling; use {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


def _release(source: object, keep: bool) -> None:
    """Flower's ``keep_input=False``: empty the list or dict the arrays came from."""
    clear = getattr(source, "clear", None)
    if not keep and callable(clear):
        clear()


def _fill(record: MutableMapping[str, Any], items: Mapping[str, Any] | None, keep: bool) -> None:
    """Put ``items`` in ``record``; with ``keep=False`` (Flower's ``keep_input``), take
    each item out of ``items`` once stored."""
    if items is None:
        return
    for key in list(items):
        record[key] = items[key]
        if not keep:
            del items[key]  # type: ignore[attr-defined]


class ArrayRecord(_Record[NDArray]):
    """Named numpy arrays.

    Built from a mapping (``{"w": w, "b": b}``) or from a list of arrays, whose keys
    become ``"0"``, ``"1"``, … in order. Arrays are stored as given, not copied.
    Arrays that arrive in a message are read-only views (of shared or received
    memory): copy one (``arr.copy()``) before updating it in place.

    Reading an item gives an :class:`Array`: a zero-copy view of the stored array that
    is an ``np.ndarray`` and also answers Flower's ``.numpy()``. Flower's constructor
    forms work too — ``ArrayRecord(array_dict=...)``, ``ArrayRecord(numpy_ndarrays=...)``,
    ``ArrayRecord(torch_state_dict=...)``, the ``from_*`` class methods, and
    ``keep_input=False``, which empties the list or dict given once its arrays are
    in the record (the arrays themselves are never copied either way).

    Torch tensors are accepted wherever an array is, so ``ArrayRecord(model.state_dict())``
    works: each tensor is stored as a numpy array of the same dtype, detached and on
    the CPU. Like ``Tensor.numpy()``, that array shares a CPU tensor's memory, so
    build the record after training, not before more of it. Dtypes numpy lacks
    (bfloat16, float8, quantized) raise ``TypeError``: convert them first (for
    bfloat16, ``.float()`` is exact). :meth:`to_torch_state_dict` goes back.
    """

    __slots__ = ()

    def __init__(
        self,
        arrays: Mapping[str, NDArray] | Iterable[NDArray] | None = None,
        *,
        array_dict: Mapping[str, NDArray] | None = None,
        numpy_ndarrays: Iterable[NDArray] | None = None,
        torch_state_dict: Mapping[str, Any] | None = None,
        keep_input: bool = True,
    ) -> None:
        super().__init__()
        given = [
            (name, value)
            for name, value in (
                ("arrays", arrays),
                ("array_dict", array_dict),
                ("numpy_ndarrays", numpy_ndarrays),
                ("torch_state_dict", torch_state_dict),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise TypeError(
                f"Invalid arguments for ArrayRecord: one source of arrays, got {len(given)}"
            )
        if not given:
            return
        name, source = given[0][0], cast(Any, given[0][1])
        # As Flower's: the constructor hands each form to its from_* class method.
        if name == "numpy_ndarrays" or (name == "arrays" and not isinstance(source, Mapping)):
            built = type(self).from_numpy_ndarrays(source, keep_input=keep_input)
        elif name == "torch_state_dict" or (
            name == "arrays" and source and all(map(is_tensor, source.values()))
        ):
            built = type(self).from_torch_state_dict(source, keep_input=keep_input)
        else:
            built = type(self).from_array_dict(source, keep_input=keep_input)
        self._data = built._data

    @classmethod
    def from_array_dict(
        cls, array_dict: Mapping[str, NDArray], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of the arrays (:class:`Array` or any ndarray) in ``array_dict``, by name."""
        if not isinstance(array_dict, Mapping):
            raise TypeError(
                "Invalid arguments for ArrayRecord: array_dict= takes a dict, "
                f"not {type(array_dict).__name__}"
            )
        record = cls()
        for key, value in array_dict.items():
            record[key] = value
        _release(array_dict, keep_input)
        return record

    @classmethod
    def from_numpy_ndarrays(
        cls, ndarrays: Iterable[NDArray], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of ``ndarrays`` under the keys ``"0"``, ``"1"``, … in order."""
        if isinstance(ndarrays, Mapping):
            raise TypeError(
                "Invalid arguments for ArrayRecord: numpy_ndarrays= takes a list, not a mapping"
            )
        if (
            isinstance(ndarrays, np.ndarray | str | bytes)
            or is_tensor(ndarrays)
            or not isinstance(ndarrays, Iterable)
        ):
            raise TypeError(
                "Invalid arguments for ArrayRecord: a mapping of names to arrays or a list "
                f"of arrays, not a single {type(ndarrays).__name__}"
            )
        record = cls()
        for index, value in enumerate(ndarrays):
            record[str(index)] = value
        _release(ndarrays, keep_input)
        return record

    @classmethod
    def from_torch_state_dict(
        cls, state_dict: Mapping[str, Any], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of a torch ``state_dict``'s tensors (see the class docstring).

        Needs PyTorch (``pip install 'fedcore[torch]'``): raises ``ImportError`` without
        it, and ``TypeError`` for a value that is not a tensor.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                "Invalid arguments for ArrayRecord: torch_state_dict= takes a dict, "
                f"not {type(state_dict).__name__}"
            )
        torch = import_torch("ArrayRecord.from_torch_state_dict")
        for key, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"state_dict[{key!r}] is a {type(value).__name__}, not a tensor")
        return cls.from_array_dict(state_dict, keep_input=keep_input)

    def __getitem__(self, key: str) -> Array:
        stored = self._data[key]
        return stored if isinstance(stored, SerializedArray) else Array._viewing(stored)

    def _check(self, key: str, value: object) -> NDArray:
        if isinstance(value, SerializedArray):
            return value
        if is_tensor(value):
            value = tensor_to_array(key, value)
        return check_array(key, value)

    def to_numpy_ndarrays(self, *, keep_input: bool = True) -> list[NDArray]:
        """The arrays, in insertion order, as plain ndarrays (those stored, not copies).

        ``keep_input=False`` (Flower's) empties the record as well. A
        :class:`SerializedArray` is read with its ``numpy()``, which may refuse it.
        """
        arrays = [self[key].numpy() for key in self._data]
        if not keep_input:
            self._data.clear()
        return arrays

    def to_torch_state_dict(self, *, keep_input: bool = True) -> OrderedDict[str, Any]:
        """The arrays as CPU torch tensors, in insertion order, for ``model.load_state_dict``.

        Dtypes are kept exactly. A tensor shares its array's memory where torch allows
        it; read-only arrays — every array received in a message — are copied, since
        torch cannot protect them from writes. Imports torch, which must be installed
        (``pip install 'fedcore[torch]'``); otherwise raises ``ImportError``.
        ``keep_input=False`` (Flower's) empties the record as well.
        """
        torch = import_torch()
        state = OrderedDict((key, array_to_tensor(torch, self[key].numpy())) for key in self._data)
        if not keep_input:
            self._data.clear()
        return state

    def count_bytes(self) -> int:
        """Bytes this record holds: its arrays' data plus its keys in UTF-8 (as Flower counts,
        less the ``numpy.save`` headers Flower's serialised arrays carry)."""
        return self.nbytes + sum(len(key.encode()) for key in self._data)

    @property
    def nbytes(self) -> int:
        """Total size of the array data in bytes."""
        return sum(a.nbytes for a in self._data.values())

    def __eq__(self, other: object) -> bool:
        """Exact equality: same keys (in the same order, for two records), dtypes, shapes
        and bytes."""
        items = self._items_of(other)
        if items is None:
            return NotImplemented
        return _same_keys(self._data, items) and all(
            isinstance(b, np.ndarray) and _same_array(a, b) for a, b in _pairs(self._data, items)
        )

    __hash__ = None  # type: ignore[assignment]

    def _items_repr(self) -> str:
        return (
            "{" + ", ".join(f"{k!r}: {a.dtype}{list(a.shape)}" for k, a in self._data.items()) + "}"
        )


def _same_array(a: NDArray, b: NDArray) -> bool:
    return bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())


def _same_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two records' keys in the same order; a record's and a dict's in any order."""
    return list(a) == list(b) if isinstance(b, _Record) else a.keys() == b.keys()


def _pairs(a: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    return ((value, b[key]) for key, value in a.items())


def _number(context: str, value: object) -> int | float:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{context} must be int or float, got bool")
    if isinstance(value, int | np.integer):
        return _check_int(context, int(value))
    if isinstance(value, float | np.floating):
        return float(value)
    raise TypeError(f"{context} must be int or float, got {type(value).__name__}")


def _check_int(context: str, value: int) -> int:
    if not _INT_MIN <= value <= _INT_MAX:
        raise TypeError(f"{context} = {value} does not fit in 64 bits")
    return value


class MetricRecord(_Record[MetricValue]):
    """Named numbers to aggregate: ``int``, ``float``, or a list of either (not both).

    Flower's signature: ``MetricRecord(metric_dict=None, keep_input=True)``;
    ``keep_input=False`` takes each item out of the dict given once stored.
    """

    __slots__ = ()

    def __init__(
        self, metric_dict: Mapping[str, MetricValue] | None = None, keep_input: bool = True
    ) -> None:
        super().__init__()
        _fill(self, metric_dict, keep_input)

    def _check(self, key: str, value: object) -> MetricValue:
        context = f"MetricRecord[{key!r}]"
        if isinstance(value, list | tuple):
            return _one_type(context, [_number(f"an item of {context}", v) for v in value])
        return _number(context, value)

    def count_bytes(self) -> int:
        """Bytes this record holds, as Flower counts them: 8 a number, plus the keys' bytes."""
        return sum(
            8 * (len(value) if isinstance(value, list) else 1) + len(key.encode())
            for key, value in self._data.items()
        )

    def __eq__(self, other: object) -> bool:
        items = self._items_of(other)
        if items is None:
            return NotImplemented
        return _same_values(self._data, items)

    __hash__ = None  # type: ignore[assignment]


def _config_scalar(context: str, value: object) -> ConfigScalar:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return _check_int(context, int(value))
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise TypeError(f"{context} must be bool, int, float, str or bytes, got {type(value).__name__}")


def _one_type(context: str, items: list[_T]) -> list[_T]:
    """``items``, if they are all of one type (as Flower requires of a record's list)."""
    kinds = {type(item).__name__ for item in items}
    if len(kinds) > 1:
        raise TypeError(f"{context} mixes {' and '.join(sorted(kinds))}; a list holds one type")
    return items


def _config_bytes(value: ConfigScalar) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, str):
        return len(value.encode())
    return len(value) if isinstance(value, bytes) else 8


class ConfigRecord(_Record[ConfigValue]):
    """Named settings: ``bool | int | float | str | bytes`` or a list of one of those types.

    Flower's signature: ``ConfigRecord(config_dict=None, keep_input=True)``;
    ``keep_input=False`` takes each item out of the dict given once stored.
    """

    __slots__ = ()

    def __init__(
        self, config_dict: Mapping[str, ConfigValue] | None = None, keep_input: bool = True
    ) -> None:
        super().__init__()
        _fill(self, config_dict, keep_input)

    def _check(self, key: str, value: object) -> ConfigValue:
        context = f"ConfigRecord[{key!r}]"
        if not isinstance(value, list | tuple):
            return _config_scalar(context, value)
        return _one_type(context, [_config_scalar(f"an item of {context}", v) for v in value])

    def count_bytes(self) -> int:
        """Bytes this record holds, as Flower counts them: 1 a bool, 8 a number, a str's
        or bytes' length, plus the keys' bytes."""
        return sum(
            sum(map(_config_bytes, value if isinstance(value, list) else [value]))
            + len(key.encode())
            for key, value in self._data.items()
        )

    def __eq__(self, other: object) -> bool:
        items = self._items_of(other)
        if items is None:
            return NotImplemented
        return _same_values(self._data, items)

    __hash__ = None  # type: ignore[assignment]


def _same_values(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equality that tells 1 from 1.0 and True from 1, and treats NaN as equal to NaN."""
    return _same_keys(a, b) and all(_same(x, y) for x, y in _pairs(a, b))


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, list):
        return isinstance(y, list) and len(x) == len(y) and all(map(_same, x, y))
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        return x == y or (x != x and y != y)
    return bool(x == y)


Record: TypeAlias = ArrayRecord | MetricRecord | ConfigRecord


class RecordDict(_Record[Record]):
    """Named records: what a Message carries and what ``Context.state`` keeps.

    Flower's deprecated spellings work and warn (``DeprecationWarning``):
    ``RecordDict(parameters_records=..., metrics_records=..., configs_records=...)``
    and the properties of those names.
    """

    __slots__ = ()

    def __init__(
        self,
        records: Mapping[str, Record] | None = None,
        *,
        parameters_records: Mapping[str, ArrayRecord] | None = None,
        metrics_records: Mapping[str, MetricRecord] | None = None,
        configs_records: Mapping[str, ConfigRecord] | None = None,
    ) -> None:
        super().__init__()
        deprecated = (parameters_records, metrics_records, configs_records)
        if any(given is not None for given in deprecated):
            _deprecated("RecordDict(parameters_records=, metrics_records=, configs_records=)")
        for given in (records, *deprecated):
            for key, value in (given or {}).items():
                self[key] = value

    def _check(self, key: str, value: object) -> Record:
        if not isinstance(value, ArrayRecord | MetricRecord | ConfigRecord):
            raise TypeError(
                f"RecordDict[{key!r}] must be an ArrayRecord, MetricRecord or ConfigRecord, "
                f"got {type(value).__name__}"
            )
        return value

    @property
    def array_records(self) -> RecordsOfKind[ArrayRecord]:
        """The ArrayRecords, by name; setting or deleting one changes this RecordDict."""
        return RecordsOfKind(self, ArrayRecord)

    @property
    def metric_records(self) -> RecordsOfKind[MetricRecord]:
        """The MetricRecords, by name; setting or deleting one changes this RecordDict."""
        return RecordsOfKind(self, MetricRecord)

    @property
    def config_records(self) -> RecordsOfKind[ConfigRecord]:
        """The ConfigRecords, by name; setting or deleting one changes this RecordDict."""
        return RecordsOfKind(self, ConfigRecord)

    @property
    def parameters_records(self) -> RecordsOfKind[ArrayRecord]:
        """Flower's deprecated name of :attr:`array_records`."""
        _deprecated("RecordDict.parameters_records", "array_records")
        return self.array_records

    @property
    def metrics_records(self) -> RecordsOfKind[MetricRecord]:
        """Flower's deprecated name of :attr:`metric_records`."""
        _deprecated("RecordDict.metrics_records", "metric_records")
        return self.metric_records

    @property
    def configs_records(self) -> RecordsOfKind[ConfigRecord]:
        """Flower's deprecated name of :attr:`config_records`."""
        _deprecated("RecordDict.configs_records", "config_records")
        return self.config_records

    def __eq__(self, other: object) -> bool:
        items = self._items_of(other)
        if items is None:
            return NotImplemented
        return _same_keys(self._data, items) and all(a == b for a, b in _pairs(self._data, items))

    def __repr__(self) -> str:
        """Flower's layout: the records by kind, each shown as the dict it is."""
        kinds: dict[str, Mapping[str, Record]] = {
            "array_records": self.array_records,
            "metric_records": self.metric_records,
            "config_records": self.config_records,
        }
        lines = ",\n".join(
            f"  {kind}={{{', '.join(f'{k!r}: {r._items_repr()}' for k, r in records.items())}}}"
            for kind, records in kinds.items()
        )
        return f"RecordDict(\n{lines}\n)"

    __hash__ = None  # type: ignore[assignment]


_Kind = TypeVar("_Kind", ArrayRecord, MetricRecord, ConfigRecord)


class RecordsOfKind(MutableMapping[str, _Kind]):
    """The records of one kind in a :class:`RecordDict`, as a live view of it.

    Flower apps write through it (``content.config_records["state"] = ConfigRecord()``)
    and expect the RecordDict to hold the record afterwards, so it is a view, not a copy.
    """

    __slots__ = ("_kind", "_owner")

    def __init__(self, owner: RecordDict, kind: type[_Kind]) -> None:
        self._owner = owner
        self._kind: type[_Kind] = kind

    def __getitem__(self, key: str) -> _Kind:
        value: object = self._owner._data[key]
        if isinstance(value, self._kind):
            return value
        raise KeyError(key)

    def __setitem__(self, key: str, value: _Kind) -> None:
        if not isinstance(value, self._kind):
            raise TypeError(
                f"RecordDict.{_VIEW_NAMES[self._kind]}[{key!r}] must be a "
                f"{self._kind.__name__}, got {type(value).__name__}"
            )
        self._owner[key] = value

    def __delitem__(self, key: str) -> None:
        if not isinstance(self._owner._data.get(key), self._kind):
            raise KeyError(key)  # a record of another kind is not this view's to delete
        del self._owner[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k, v in self._owner._data.items() if isinstance(v, self._kind))

    def __len__(self) -> int:
        return sum(1 for v in self._owner._data.values() if isinstance(v, self._kind))

    def __repr__(self) -> str:
        return repr(dict(self))


_VIEW_NAMES = {
    ArrayRecord: "array_records",
    MetricRecord: "metric_records",
    ConfigRecord: "config_records",
}
