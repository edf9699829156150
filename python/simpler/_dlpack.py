"""A DLPack producer (the ``dltensor`` capsule of the DLPack spec, ``dlpack.h``), in ctypes.

:meth:`simpler.DeviceTensor.__dlpack__` hands a consumer (PyTorch, CuPy, JAX, ...) a capsule
holding a ``DLManagedTensor`` that describes the tensor's device memory, without a copy. The
structures live in :data:`_LIVE` until whoever owns them lets go: the consumer calls the
``deleter`` after renaming the capsule ``used_dltensor``; a capsule never consumed is deleted by
its destructor. Either way the entry (and with it the tensor, so its buffer, and the export
that keeps the buffer from being freed meanwhile) is released once.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from . import _core

#: ``DLDeviceType``: CUDA device memory.
KDL_CUDA = 2

# ``DLDataTypeCode``: int, uint, float, bfloat, bool.
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}
_KDL_BFLOAT = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

#: Exported tensors by the address of their ``DLManagedTensor``: the structures, the shape and
#: strides arrays and the tensor they describe, kept alive until deleted.
_LIVE: dict[int, tuple[Any, ...]] = {}

_NAME = b"dltensor"
# A handle of our own on the interpreter's C API: `ctypes.pythonapi` hands every user the same
# function objects, whose `argtypes` anyone may change.
_api = ctypes.PyDLL(None)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@_Deleter
def _deleter(managed: Any) -> None:
    _LIVE.pop(ctypes.addressof(managed.contents), None)


#: The capsule destructor (native: see ``crates/ffi-driver/src/capsule.rs``). A capsule still
#: named "dltensor" when it dies was never consumed: the destructor calls its deleter, which
#: releases the entry; a consumer that refused the capsule keeps its own error intact.
_CAPSULE_DESTRUCTOR = _core.dlpack_destructor()


def dl_dtype(dtype: np.dtype) -> DLDataType:
    """The DLPack type of a numpy dtype; ``BufferError`` for kinds DLPack cannot describe."""
    if dtype.name == "bfloat16":
        return DLDataType(_KDL_BFLOAT, 16, 1)
    code = _CODES.get(dtype.kind)
    if code is None:
        raise BufferError(f"dtype {dtype.name} has no DLPack type")
    return DLDataType(code, dtype.itemsize * 8, 1)


def export(tensor: Any, data: int, device: tuple[int, int], dtype: np.dtype, guard: object) -> object:
    """A ``dltensor`` capsule for ``tensor`` (shape and element strides from it) whose first
    element is at device address ``data`` on ``device`` (0 when it has none); ``guard`` (the
    export) is kept until the capsule's tensor is deleted."""
    ndim = len(tensor.shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*tensor.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*tensor.strides)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(
        data,
        DLDevice(*device),
        ndim,
        dl_dtype(dtype),
        ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
        ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)),
        0,
    )
    managed.deleter = _deleter
    addr = ctypes.addressof(managed)
    _LIVE[addr] = (managed, shape, strides, tensor, guard)
    return _api.PyCapsule_New(addr, _NAME, _CAPSULE_DESTRUCTOR)
