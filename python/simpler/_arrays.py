"""Numpy plumbing shared by the worker and the argument specs (private).

Staged arrays travel to the native core as the bytes of their *extent* (what a strided view
touches), so a transposed or sliced view is staged intact. Arrays the core cannot take byte for
byte (negative strides, strides that are not a multiple of the item size, non-native byte order)
are staged through a contiguous copy that is written back after the run for outputs.
"""

from __future__ import annotations

import functools

import numpy as np

try:  # ml_dtypes supplies bfloat16 and the fp8/fp4 kinds (the dtypes JAX uses).
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    ml_dtypes = None

from . import _core
from .errors import ArgumentError, ArgumentTypeError

SUPPORTED_DTYPES: tuple[str, ...] = tuple(_core.DTYPES)


@functools.cache
def np_dtype(name: str) -> np.dtype:
    """The numpy dtype for a simpler dtype name (``"bfloat16"`` via ml_dtypes); cached, since every
    kernel argument and ``read_tensor`` looks one up."""
    if ml_dtypes is not None and hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype_name(dtype: object, what: str) -> str:
    """The simpler name of ``dtype``; raises ``ArgumentTypeError`` when unsupported."""
    try:
        dt = np.dtype(dtype) if not isinstance(dtype, str) else np_dtype(dtype)
    except TypeError as e:
        raise ArgumentTypeError(f"{what}: unsupported dtype {dtype!r}") from e
    if dt.name not in SUPPORTED_DTYPES:
        raise ArgumentTypeError(
            f"{what}: unsupported dtype '{dt.name}' (supported: {', '.join(SUPPORTED_DTYPES)})"
        )
    return dt.name


def stageable(arr: np.ndarray) -> bool:
    """Whether ``arr`` can be staged byte for byte (otherwise a contiguous copy is staged)."""
    if not arr.dtype.isnative:
        return False
    item = arr.dtype.itemsize
    return all(s >= 0 and s % item == 0 for s in arr.strides)


def element_strides(arr: np.ndarray) -> list[int]:
    """Strides of ``arr`` in elements (``stageable(arr)`` must hold)."""
    return [s // arr.dtype.itemsize for s in arr.strides]


def extent_bytes(arr: np.ndarray) -> np.ndarray:
    """A 1-D uint8 view of the bytes ``arr`` spans, starting at its first element."""
    if arr.size == 0:
        return np.empty(0, dtype=np.uint8)
    item = arr.dtype.itemsize
    n = 1 + sum((dim - 1) * (st // item) for dim, st in zip(arr.shape, arr.strides))
    flat = np.lib.stride_tricks.as_strided(arr, shape=(n,), strides=(item,), writeable=arr.flags.writeable)
    return flat.view(np.uint8)


def window_array(win: _core.HostWindow) -> np.ndarray:
    """A numpy array over a native host window (no copy)."""
    name, shape, strides = win.layout
    dt = np_dtype(name)
    raw = np.asarray(win)
    if raw.size == 0:
        out = np.zeros(shape, dtype=dt)
        out.flags.writeable = raw.flags.writeable
        return out
    return np.ndarray(tuple(shape), dtype=dt, buffer=raw, strides=tuple(strides))


def require_array(value: object, what: str) -> np.ndarray:
    """``value`` as a numpy array, refusing anything that is not one."""
    if not isinstance(value, np.ndarray):
        raise ArgumentTypeError(f"{what}: expected a numpy array, got {type(value).__name__}")
    return value


def require_contiguous(arr: np.ndarray, what: str) -> None:
    """Refuses arrays that are not C-contiguous in native byte order."""
    if not arr.flags.c_contiguous or not arr.dtype.isnative:
        raise ArgumentError(
            f"{what}: array must be C-contiguous in native byte order "
            f"(shape {arr.shape}, strides {arr.strides}); use np.ascontiguousarray"
        )
