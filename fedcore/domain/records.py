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

import contextlib
import importlib
import io
import sys
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Self, TypeAlias, TypeVar, cast

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
    if isinstance(value, Array):  # what it reads as, as Flower stores an Array's .numpy()
        value = value.numpy()
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
    return value if type(value) is np.ndarray else value.view(np.ndarray)


def _is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor_to_array(key: str, tensor: Any, *, where: str | None = None) -> NDArray:
    """The tensor's data as a numpy array: detached, on the CPU, with the same dtype.

    Converted as Flower converts one (``tensor.detach().cpu().numpy()``): a CPU
    tensor's memory is shared, not copied; a tensor on another device is copied to the
    CPU. Torch dtypes that numpy lacks (bfloat16,
    float8, complex32, quantized) are refused rather than converted, so an array
    always comes back with the dtype it was sent with.
    """
    where = where or f"ArrayRecord[{key!r}]"
    try:
        array: NDArray = tensor.detach().cpu().numpy()
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
    (what Flower's ``Array.data`` holds). Fields that do not hold such an array — an
    ``stype`` of another serialisation, data that is not ``numpy.save`` output of the
    dtype and shape given — are kept as given, in a :class:`SerializedArray`: as in
    Flower, only :meth:`numpy` refuses them. What differs on purpose: ``.dtype`` is a
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
        """The four fields' array, or the fields kept as given (see the class docstring)."""
        if not (
            isinstance(dtype, str)
            and isinstance(shape, tuple)
            and all(isinstance(n, int) for n in shape)
            and isinstance(stype, str)
            and isinstance(data, bytes)
        ):
            raise TypeError(
                "Array(dtype, shape, stype, data) takes a str, a tuple of ints, a str "
                f"and bytes, got {', '.join(type(f).__name__ for f in (dtype, shape, stype, data))}"
            )
        if stype == NUMPY_STYPE:
            loaded = _load(data)
            if isinstance(loaded, np.ndarray) and (str(loaded.dtype), loaded.shape) == (
                dtype,
                shape,
            ):
                with contextlib.suppress(TypeError):  # a dtype a record cannot hold
                    return cls.from_numpy_ndarray(loaded)
        return SerializedArray._kept(dtype, shape, stype, data)

    @property
    def stype(self) -> str:
        """How Flower would serialise the data: ``"numpy.ndarray"``."""
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


def _load(data: bytes) -> NDArray | None:
    """The array ``data`` holds in ``numpy.save`` format, or None if it holds none."""
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None
    return loaded if isinstance(loaded, np.ndarray) else None


class SerializedArray(Array):
    """An :class:`Array` whose four fields fedcore keeps as given, unread.

    Flower's ``Array(dtype, shape, stype, data)`` accepts any serialisation (``stype``)
    and any bytes, and only its ``.numpy()`` refuses what it cannot read; this is that
    Array here. ``dtype``, ``shape``, ``stype`` and ``data`` are the fields given
    (``data`` is the bytes, not numpy's buffer), and :meth:`numpy` reads the data as
    Flower's does: ``TypeError`` for another stype, ``numpy.load`` of the data for
    ``"numpy.ndarray"``. An ArrayRecord holds it as it is, and what sends a record
    or converts it to arrays reads each array with :meth:`numpy`, so a record holding
    one fails there, as in Flower. As an ndarray it is its data's bytes (uint8).
    """

    _fields: tuple[str, tuple[int, ...], str, bytes]

    @classmethod
    def _kept(cls, dtype: str, shape: tuple[int, ...], stype: str, data: bytes) -> SerializedArray:
        kept = np.frombuffer(data, dtype=np.uint8).view(cls)
        kept._fields = (dtype, shape, stype, data)
        return kept

    @property
    def dtype(self) -> str:  # type: ignore[override]
        """The dtype given, as Flower's string."""
        return self._fields[0]

    @property  # type: ignore[misc]
    def shape(self) -> tuple[int, ...]:
        """The shape given."""
        return self._fields[1]

    @property
    def stype(self) -> str:
        """The serialisation given."""
        return self._fields[2]

    @property
    def data(self) -> bytes:  # type: ignore[override]
        """The bytes given."""
        return self._fields[3]

    def __reduce__(self) -> tuple[Any, ...]:
        return (SerializedArray._kept, self._fields)

    def __copy__(self) -> SerializedArray:
        return SerializedArray._kept(*self._fields)

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> SerializedArray:
        return SerializedArray._kept(*self._fields)

    def numpy(self) -> NDArray:
        """The data read as Flower reads it (see the class docstring)."""
        if self.stype != NUMPY_STYPE:
            raise TypeError(
                f"Array of stype {self.stype!r} cannot be read as a numpy array; "
                f"only {NUMPY_STYPE!r} can"
            )
        loaded: NDArray = np.load(io.BytesIO(self.data), allow_pickle=False)
        return loaded

    def __repr__(self) -> str:
        dtype, shape, stype, data = self._fields
        return f"Array(dtype={dtype!r}, shape={shape!r}, stype={stype!r}, data=<{len(data)} bytes>)"


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
            name == "arrays" and source and all(map(_is_tensor, source.values()))
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
            or _is_tensor(ndarrays)
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
        torch = _import_torch("ArrayRecord.from_torch_state_dict")
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
        if _is_tensor(value):
            value = _tensor_to_array(key, value)
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
        torch = _import_torch()
        state = OrderedDict((key, _array_to_tensor(torch, self[key].numpy())) for key in self._data)
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

    @property
    def parameters_records(self) -> dict[str, ArrayRecord]:
        """Flower's deprecated name of :attr:`array_records`."""
        _deprecated("RecordDict.parameters_records", "array_records")
        return self.array_records

    @property
    def metrics_records(self) -> dict[str, MetricRecord]:
        """Flower's deprecated name of :attr:`metric_records`."""
        _deprecated("RecordDict.metrics_records", "metric_records")
        return self.metric_records

    @property
    def configs_records(self) -> dict[str, ConfigRecord]:
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
