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

import importlib
import io
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

NDArray: TypeAlias = npt.NDArray[Any]
NDArrays: TypeAlias = list[NDArray]
"""A list of arrays, as Flower's ``flwr.common.NDArrays``."""
MetricValue: TypeAlias = int | float | list[int] | list[float] | list[int | float]
ConfigScalar: TypeAlias = bool | int | float | str | bytes
ConfigValue: TypeAlias = ConfigScalar | list[ConfigScalar]

# Flower's names for these value types, as ``flwr.app`` offers them to annotations.
MetricScalar: TypeAlias = int | float
MetricScalarList: TypeAlias = list[int] | list[float]
MetricRecordValues: TypeAlias = MetricValue
ConfigScalarList: TypeAlias = list[bool] | list[int] | list[float] | list[str] | list[bytes]
ConfigRecordValues: TypeAlias = ConfigValue

# dtype kinds that have a plain, portable byte representation: bool, signed and
# unsigned integers, floats and complex numbers. Object, string, void (structured)
# and datetime arrays are refused: they cannot travel without pickle.
ARRAY_KINDS = frozenset("biufc")
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

_T = TypeVar("_T")


def _check_key(record: str, key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"{record} keys must be str, got {type(key).__name__}: {key!r}")
    return key


def check_array(key: str, value: object, *, where: str | None = None) -> NDArray:
    """Return ``value`` as a plain ndarray if an :class:`ArrayRecord` can hold it, else raise.

    Subclasses (``np.memmap``, ``np.matrix``) are stored as plain-ndarray views of the
    same memory; masked arrays are refused, since their mask could not travel.
    Extended-precision floats are refused too: their bytes differ between platforms.
    Errors name ``ArrayRecord[key]``, or ``where`` when given.
    """
    where = where or f"ArrayRecord[{key!r}]"
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{where} must be a numpy.ndarray, got {type(value).__name__}")
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{where} is a masked array; send .filled() and the mask")
    dtype = value.dtype
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.char in "gG":
        raise TypeError(
            f"{where} has dtype {dtype}; only bool, integer, float (up to 64 bits) "
            "and complex (up to 128 bits) arrays can be sent"
        )
    if type(value) is np.ndarray:
        return value
    return value.numpy() if isinstance(value, Array) else value.view(np.ndarray)


def _is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor_to_array(key: str, tensor: Any, *, where: str | None = None) -> NDArray:
    """The tensor's data as a numpy array: detached, on the CPU, with the same dtype.

    A CPU tensor's memory is shared, not copied (as ``Tensor.numpy()`` does); a tensor
    on another device is copied to the CPU. Torch dtypes that numpy lacks (bfloat16,
    float8, complex32, quantized) are refused rather than converted, so an array
    always comes back with the dtype it was sent with.
    """
    where = where or f"ArrayRecord[{key!r}]"
    try:
        array: NDArray = tensor.numpy(force=True)
    except (TypeError, RuntimeError) as exc:
        raise TypeError(
            f"{where} is a torch tensor ({tensor.dtype}, {tensor.layout}, "
            f"on {tensor.device}) that numpy cannot hold: {exc}. Convert it first, "
            "e.g. tensor.float() for bfloat16 (exact) or tensor.to_dense() for sparse"
        ) from exc
    return array


def _array_to_tensor(torch: Any, arr: NDArray) -> Any:
    """A tensor of ``arr``'s dtype that shares its memory where torch allows that.

    Torch has no read-only tensors, no negative strides and only native byte order,
    so arrays that are read-only (those received in a message), reversed or
    byte-swapped are copied first. Every dtype an ArrayRecord holds has a torch
    equivalent from torch 2.3 on (which added uint16, uint32 and uint64).
    """
    shareable = arr.flags.writeable and arr.dtype.isnative and min(arr.strides, default=0) >= 0
    if not shareable:
        arr = arr.astype(arr.dtype.newbyteorder("="), order="C", copy=True)
    return torch.from_numpy(arr)


def _import_torch(needed_by: str = "ArrayRecord.to_torch_state_dict") -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs PyTorch: pip install 'fedcore[torch]'", name="torch"
        ) from exc


NUMPY_STYPE = "numpy.ndarray"
"""Flower's name for how an Array's data is serialised (``Array.stype``); the only one."""


class Array(np.ndarray[Any, np.dtype[Any]]):
    """An array in an :class:`ArrayRecord`: a numpy ndarray that also speaks Flower's ``Array``.

    Flower's ArrayRecord holds ``Array`` objects (serialised bytes, read back with
    ``.numpy()``); fedcore's holds ndarrays. So that code written either way runs,
    every item read from an ArrayRecord is an ``Array`` — a zero-copy view of the
    stored ndarray (same memory, same read-only flag) — that is an ``np.ndarray`` for
    numpy code and answers ``.numpy()``, ``.stype``, :meth:`from_numpy_ndarray` and
    :meth:`from_torch_tensor` for Flower code. Arithmetic on an Array gives plain
    ndarrays and numpy scalars, as it would on the array it views, and an Array
    stored in a record is stored as a plain ndarray: the wire, shared memory and
    aggregation never see the subclass.

    Built like Flower's: ``Array(ndarray)``, ``Array(torch_tensor)``, or
    ``Array(dtype, shape, stype, data)`` with ``data`` in ``numpy.save`` format
    (what Flower's ``Array.data`` holds). What differs on purpose: ``.dtype`` is a
    ``numpy.dtype`` (it compares equal to Flower's string, ``a.dtype == "float32"``),
    ``.data`` is numpy's buffer of the raw bytes, not ``numpy.save`` output, and ``==``
    compares element-wise, as for any ndarray.
    """

    _stored: NDArray
    """On an item read from a record: the array the record holds (see :meth:`numpy`)."""

    def __new__(
        cls,
        *args: Any,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
        stype: str | None = None,
        data: bytes | None = None,
        ndarray: NDArray | None = None,
        torch_tensor: Any = None,
    ) -> Array:
        given = {"dtype": dtype, "shape": shape, "stype": stype, "data": data}
        fields = {k: v for k, v in given.items() if v is not None}
        sources = [v for v in (ndarray, torch_tensor) if v is not None]
        if len(args) == 1 and not fields and not sources:
            sources = [args[0]]
        elif len(args) == 4 and not fields and not sources:
            fields = dict(zip(given, args, strict=True))
        elif args:
            raise TypeError(
                "Array takes one ndarray or torch tensor, or the four fields "
                "(dtype, shape, stype, data)"
            )
        if fields:
            if sources or len(fields) != len(given):
                raise TypeError(
                    "Array(dtype=, shape=, stype=, data=) needs all four, and only them"
                )
            return cls._from_fields(**fields)
        if len(sources) != 1:
            raise TypeError("Array takes one ndarray or torch tensor")
        value = sources[0]
        if _is_tensor(value):
            return cls.from_torch_tensor(value)
        return cls.from_numpy_ndarray(value)

    @classmethod
    def from_numpy_ndarray(cls, ndarray: NDArray) -> Array:
        """``ndarray`` as an Array: a view of the same memory, not a copy."""
        return check_array("", ndarray, where="Array").view(cls)

    @classmethod
    def from_torch_tensor(cls, tensor: Any) -> Array:
        """A CPU tensor's data as an Array sharing its memory (copied from other devices)."""
        if not _is_tensor(tensor):
            raise TypeError(
                f"Array.from_torch_tensor takes a torch.Tensor, got {type(tensor).__name__}"
            )
        array = _tensor_to_array("", tensor, where="Array")
        return check_array("", array, where="Array").view(cls)

    @classmethod
    def _from_fields(cls, dtype: object, shape: object, stype: object, data: object) -> Array:
        if stype != NUMPY_STYPE:
            raise TypeError(f"Array stype must be {NUMPY_STYPE!r}, got {stype!r}")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(
                f"Array data must be bytes in numpy.save format, got {type(data).__name__}"
            )
        try:
            loaded = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"Array data is not an array in numpy.save format: {exc}") from exc
        if not isinstance(loaded, np.ndarray) or str(loaded.dtype) != dtype:
            raise ValueError(
                f"Array data holds dtype {getattr(loaded, 'dtype', None)}, not {dtype!r}"
            )
        if not isinstance(shape, tuple | list) or tuple(shape) != loaded.shape:
            raise ValueError(f"Array data holds shape {loaded.shape}, not {shape!r}")
        return cls.from_numpy_ndarray(loaded)

    @property
    def stype(self) -> str:
        """How Flower would serialise the data: always ``"numpy.ndarray"``."""
        return NUMPY_STYPE

    def numpy(self) -> NDArray:
        """The array as a plain ``np.ndarray``: a view, not a copy (read-only if this is).

        For an item just read from a record it is the very array the record holds, so
        ``other[key] = record[key]`` stores that same object, as it did before items
        were Arrays.
        """
        stored: NDArray | None = getattr(self, "_stored", None)
        if (
            stored is not None
            and stored.shape == self.shape
            and stored.strides == self.strides
            and stored.dtype == self.dtype
        ):
            return stored
        return self.view(np.ndarray)

    @classmethod
    def _viewing(cls, stored: NDArray) -> Array:
        """An Array viewing ``stored`` that remembers it (see :meth:`numpy`)."""
        item = stored.view(cls)
        item._stored = stored
        return item

    def __array_wrap__(
        self, array: NDArray, context: Any = None, return_scalar: bool = False
    ) -> Any:
        # Results of ufuncs and reductions come out as a plain ndarray or numpy scalar,
        # so computing with record items gives what computing with ndarrays gave.
        if return_scalar:
            return array[()]
        return array if type(array) is np.ndarray else array.view(np.ndarray)


class _Record(MutableMapping[str, _T]):
    """A dict with a value check on every write."""

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
        return f"{type(self).__name__}({self._data!r})"


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
            raise TypeError(f"ArrayRecord takes one source of arrays, got {len(given)}")
        if not given:
            return
        name, source = given[0]
        if isinstance(source, ArrayRecord | Mapping):
            if name == "numpy_ndarrays":
                raise TypeError("ArrayRecord(numpy_ndarrays=...) takes a list, not a mapping")
            for key, value in source.items():
                self[key] = value
        elif name in ("array_dict", "torch_state_dict"):
            raise TypeError(f"ArrayRecord({name}=...) takes a dict, not {type(source).__name__}")
        elif isinstance(source, np.ndarray | str | bytes) or _is_tensor(source):
            raise TypeError(
                "ArrayRecord takes a mapping of names to arrays or a list of arrays, "
                f"not a single {type(source).__name__}"
            )
        else:
            for index, value in enumerate(source):
                self[str(index)] = value
        clear = getattr(source, "clear", None)
        if not keep_input and callable(clear):
            clear()

    @classmethod
    def from_array_dict(
        cls, array_dict: Mapping[str, NDArray], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of the arrays (:class:`Array` or any ndarray) in ``array_dict``, by name."""
        return cls(array_dict=array_dict, keep_input=keep_input)

    @classmethod
    def from_numpy_ndarrays(
        cls, ndarrays: Iterable[NDArray], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of ``ndarrays`` under the keys ``"0"``, ``"1"``, … in order."""
        return cls(numpy_ndarrays=ndarrays, keep_input=keep_input)

    @classmethod
    def from_torch_state_dict(
        cls, state_dict: Mapping[str, Any], *, keep_input: bool = True
    ) -> ArrayRecord:
        """A record of a torch ``state_dict``'s tensors (see the class docstring).

        Needs PyTorch (``pip install 'fedcore[torch]'``): raises ``ImportError`` without
        it, and ``TypeError`` for a value that is not a tensor.
        """
        torch = _import_torch("ArrayRecord.from_torch_state_dict")
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"a state_dict is a dict, not {type(state_dict).__name__}")
        for key, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"state_dict[{key!r}] is a {type(value).__name__}, not a tensor")
        return cls(torch_state_dict=state_dict, keep_input=keep_input)

    def __getitem__(self, key: str) -> Array:
        return Array._viewing(self._data[key])

    def _check(self, key: str, value: object) -> NDArray:
        if _is_tensor(value):
            value = _tensor_to_array(key, value)
        return check_array(key, value)

    def to_numpy_ndarrays(self, *, keep_input: bool = True) -> list[NDArray]:
        """The arrays, in insertion order, as plain ndarrays (those stored, not copies).

        ``keep_input=False`` (Flower's) empties the record as well.
        """
        arrays = list(self._data.values())
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
        torch = _import_torch()
        state = OrderedDict((key, _array_to_tensor(torch, arr)) for key, arr in self._data.items())
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
        """Exact equality: same keys in the same order, dtypes, shapes and bytes."""
        if not isinstance(other, ArrayRecord):
            return NotImplemented
        return list(self._data) == list(other._data) and all(
            a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            for a, b in zip(self._data.values(), other._data.values(), strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {a.dtype}{list(a.shape)}" for k, a in self._data.items())
        return f"ArrayRecord({{{inner}}})"


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
    """Named numbers to aggregate: ``int``, ``float``, or a list of them."""

    __slots__ = ()

    def __init__(self, metrics: Mapping[str, MetricValue] | None = None) -> None:
        super().__init__()
        for key, value in (metrics or {}).items():
            self[key] = value

    def _check(self, key: str, value: object) -> MetricValue:
        context = f"MetricRecord[{key!r}]"
        if isinstance(value, list | tuple):
            return [_number(f"an item of {context}", v) for v in value]
        return _number(context, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetricRecord):
            return NotImplemented
        return _same_values(self._data, other._data)

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


class ConfigRecord(_Record[ConfigValue]):
    """Named settings: ``bool | int | float | str | bytes`` or a list of one of those types."""

    __slots__ = ()

    def __init__(self, config: Mapping[str, ConfigValue] | None = None) -> None:
        super().__init__()
        for key, value in (config or {}).items():
            self[key] = value

    def _check(self, key: str, value: object) -> ConfigValue:
        context = f"ConfigRecord[{key!r}]"
        if not isinstance(value, list | tuple):
            return _config_scalar(context, value)
        items = [_config_scalar(f"an item of {context}", v) for v in value]
        kinds = {_config_kind(v) for v in items}
        if len(kinds) > 1:
            raise TypeError(f"{context} mixes {', '.join(sorted(kinds))}; a list holds one type")
        return items

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigRecord):
            return NotImplemented
        return _same_values(self._data, other._data)

    __hash__ = None  # type: ignore[assignment]


def _config_kind(value: ConfigScalar) -> str:
    # int and float mix freely in a list of numbers; bool, str and bytes do not.
    return "number" if type(value) in (int, float) else type(value).__name__


def _same_values(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equality that tells 1 from 1.0 and True from 1, and treats NaN as equal to NaN."""
    return list(a) == list(b) and all(_same(x, b[k]) for k, x in a.items())


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
    """Named records: what a Message carries and what ``Context.state`` keeps."""

    __slots__ = ()

    def __init__(self, records: Mapping[str, Record] | None = None) -> None:
        super().__init__()
        for key, value in (records or {}).items():
            self[key] = value

    def _check(self, key: str, value: object) -> Record:
        if not isinstance(value, ArrayRecord | MetricRecord | ConfigRecord):
            raise TypeError(
                f"RecordDict[{key!r}] must be an ArrayRecord, MetricRecord or ConfigRecord, "
                f"got {type(value).__name__}"
            )
        return value

    @property
    def array_records(self) -> dict[str, ArrayRecord]:
        """The ArrayRecords, by name."""
        return {k: v for k, v in self._data.items() if isinstance(v, ArrayRecord)}

    @property
    def metric_records(self) -> dict[str, MetricRecord]:
        """The MetricRecords, by name."""
        return {k: v for k, v in self._data.items() if isinstance(v, MetricRecord)}

    @property
    def config_records(self) -> dict[str, ConfigRecord]:
        """The ConfigRecords, by name."""
        return {k: v for k, v in self._data.items() if isinstance(v, ConfigRecord)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordDict):
            return NotImplemented
        return list(self._data) == list(other._data) and all(
            v == other._data[k] for k, v in self._data.items()
        )

    __hash__ = None  # type: ignore[assignment]
