"""Arrays: the numpy arrays an ArrayRecord holds, and Flower's ``Array`` API over them.

:class:`Array` is an ndarray that also answers Flower's ``Array`` (``.numpy()``,
``from_numpy_ndarray``, ``from_torch_tensor``); :class:`SerializedArray` keeps the
four fields of an ``Array(dtype, shape, stype, data)`` built from bytes as given, so
only reading it refuses a serialisation fedcore cannot read, as Flower's does.
:func:`check_array` is the one rule for what an array may be: plain, portable bytes.

PyTorch is optional and never imported to recognise a tensor (:func:`is_tensor` looks
it up in ``sys.modules``: a program that never imported torch cannot hold one).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

NDArray: TypeAlias = npt.NDArray[Any]
NDArrays: TypeAlias = list[NDArray]
"""A list of arrays, as Flower's ``flwr.common.NDArrays``."""
# dtype kinds that have a plain, portable byte representation: bool, signed and
# unsigned integers, floats and complex numbers. Object, string, void (structured)
# and datetime arrays are refused: they cannot travel without pickle.
ARRAY_KINDS = frozenset("biufc")


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


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch.

    Another thread (a ClientApp's handler) may be importing torch right now: until its
    ``Tensor`` exists, no value can be one.
    """
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and isinstance(value, tensor)


def tensor_to_array(key: str, tensor: Any, *, where: str | None = None) -> NDArray:
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


def array_to_tensor(torch: Any, arr: NDArray) -> Any:
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


def import_torch(needed_by: str = "ArrayRecord.to_torch_state_dict") -> Any:
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
        if is_tensor(value):
            return cls.from_torch_tensor(value)
        return cls.from_numpy_ndarray(value)

    @classmethod
    def from_numpy_ndarray(cls, ndarray: NDArray) -> Array:
        """``ndarray`` as an Array: a view of the same memory, not a copy."""
        return check_array("", ndarray, where="Array").view(cls)

    @classmethod
    def from_torch_tensor(cls, tensor: Any) -> Array:
        """A CPU tensor's data as an Array sharing its memory (copied from other devices)."""
        if not is_tensor(tensor):
            raise TypeError(
                f"Array.from_torch_tensor takes a torch.Tensor, got {type(tensor).__name__}"
            )
        array = tensor_to_array("", tensor, where="Array")
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
    ``"numpy.ndarray"``. An ArrayRecord holds it as it is; what converts a record to
    arrays reads each array with :meth:`numpy`, so a record holding one fails there, as
    in Flower, while sending the record sends the four fields, unread, and they arrive
    as the same SerializedArray (:mod:`fedcore.wire.records`). As an ndarray it is its
    data's bytes (uint8).
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

    def __array_finalize__(self, obj: Any) -> None:
        # A view of all the same bytes (``.view()``, as the inline backend hands records
        # over read-only, or numpy's own printing) is the same fields; other views and
        # copies are not, and carry none.
        fields = getattr(obj, "_fields", None)
        if (
            fields is not None
            and self.nbytes == obj.nbytes
            and self.flags.c_contiguous
            and self.ctypes.data == obj.ctypes.data
        ):
            self._fields = fields

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

    __str__ = __repr__  # numpy's str() would print its shape-() fields as an array
