"""Device tensors among the array libraries: no silent numpy conversion, the CUDA Array Interface
and DLPack on cuda (checked field by field through ctypes, without CuPy or PyTorch), buffers as
context managers, pickling refused, unclosed workers warned about."""

from __future__ import annotations

import ctypes
import gc
import pickle
import weakref

import numpy as np
import pytest

import simpler as sp


@pytest.fixture
def cuda(fake_vendor):
    with fake_vendor.worker("cuda") as w:
        yield w


def test_numpy_conversion_of_a_device_tensor_is_a_type_error():
    with sp.Worker("sim") as w:
        t = w.malloc(64).tensor((16,), "float32")
        for convert in (np.asarray, np.array):
            with pytest.raises(TypeError, match="lives in device memory"):
                convert(t)
        assert not hasattr(t, "__cuda_array_interface__")
        with pytest.raises(BufferError, match="on sim, not cuda"):
            t.__dlpack__()


def test_device_handles_refuse_pickling_clearly():
    with sp.Worker("sim") as w:
        buf = w.malloc(64)
        for obj, what in ((w, "Worker"), (buf, "Buffer"), (buf.tensor((16,), "float32"), "DeviceTensor")):
            with pytest.raises(TypeError, match=f"a {what} .* cannot be pickled"):
                pickle.dumps(obj)


def test_a_buffer_is_a_context_manager():
    with sp.Worker("sim") as w:
        with w.malloc(64) as buf:
            w.copy_to(buf, np.zeros(16, np.float32))
            assert w.stats()["live_allocations"] == 1
        assert w.stats()["live_allocations"] == 0
        with w.malloc(64) as buf:
            w.free(buf)  # freed by hand first: leaving the block is fine
        assert w.stats()["frees"] == 2


def test_a_worker_dropped_unclosed_warns_and_closes():
    w = sp.Worker("sim")
    w.malloc(64)
    with pytest.warns(ResourceWarning, match="unclosed Worker"):
        del w
        gc.collect()


def test_handles_hold_the_device_not_the_worker_object():
    """Buffers, tensors and resident sets hold the worker's native cell, not the Python worker:
    a worker dropped while they live is still collected (with a ``ResourceWarning``), without a
    reference cycle, and the device stays open for them (memory a consumer was handed is not
    freed under it) until the last of them goes."""
    w = sp.Worker("sim")
    buf = w.malloc(64)
    res = sp.ResidentTaskArgs(w)
    t = res.add("x", np.arange(16, dtype=np.float32))
    dev = weakref.ref(w)
    with pytest.warns(ResourceWarning, match="unclosed Worker"):
        del w
        gc.collect()
    assert dev() is None
    buf.copy_to(np.ones(16, np.float32))
    t.buffer.copy_from(got := np.empty(16, np.float32))
    np.testing.assert_array_equal(got, np.arange(16))
    res.release()
    buf.free()


def test_cuda_array_interface_fields(cuda):
    buf = cuda.malloc(4096)
    t = buf.tensor((8, 16), "float32")
    cai = t.__cuda_array_interface__
    stream = cai.pop("stream")
    assert cai == {
        "shape": (8, 16),
        "typestr": "<f4",
        "data": (buf.ptr, False),
        "strides": None,
        "version": 3,
    }
    # The worker's own stream (a CUstream handle; never None, 0, or a default stream's 1 / 2).
    assert isinstance(stream, int) and stream > 2
    col = buf.tensor((8, 4), "int16", strides=(32, 2), offset=3)
    cai = col.__cuda_array_interface__
    assert (cai["shape"], cai["typestr"], cai["strides"]) == ((8, 4), "<i2", (64, 4))
    assert cai["data"] == (buf.ptr + 3 * 2, False)
    assert col.__cuda_array_interface__["stream"] == stream
    # A tensor without elements exports a null pointer.
    assert buf.tensor((0, 16), "float32").__cuda_array_interface__["data"] == (0, False)
    # bfloat16 has no typestr a consumer reads as bfloat16: refused, pointing at DLPack.
    with pytest.raises(TypeError, match=r"bfloat16 has no typestr .* use DLPack"):
        _ = buf.tensor((16,), "bfloat16").__cuda_array_interface__
    del t, col
    gc.collect()
    buf.free()


def test_an_interface_read_keeps_the_memory_until_the_tensor_goes(cuda):
    """Reading ``__cuda_array_interface__`` exports the memory for the tensor's life (a consumer
    array holds the tensor): free, resident release and close are refused meanwhile."""
    buf = cuda.malloc(4096)
    t = buf.tensor((16,), "float32")
    _ = t.__cuda_array_interface__
    with pytest.raises(sp.StateError, match=r"free: allocation 0x[0-9a-f]+ has 1 live export"):
        buf.free()
    with pytest.raises(sp.StateError, match=r"close: .* live export"):
        cuda.close()
    assert not cuda.closed
    res = sp.ResidentTaskArgs(cuda)
    r = res.add("x", np.arange(8, dtype=np.float32))
    _ = r.__cuda_array_interface__
    with pytest.raises(sp.StateError, match=r"release of resident tensor 'x': .* live export"):
        res.release()
    del t, r
    gc.collect()
    buf.free()
    res.release()
    assert cuda.stats()["live_allocations"] == 0
    # A freed buffer, or a closed worker, cannot be exported.
    t = cuda.malloc(64).tensor((16,), "float32")
    t.buffer.free()
    with pytest.raises(sp.StateError, match=r"export: .* freed|not a live allocation"):
        _ = t.__cuda_array_interface__
    with pytest.raises(sp.StateError, match=r"export: .* freed|not a live allocation"):
        t.__dlpack__()


_API = ctypes.PyDLL(None)  # the C API, as a consumer's extension module would call it


# The consumer's view of a capsule: the structures of DLPack's dlpack.h (unversioned kind).
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))),
]


def _managed(capsule):
    get = _API.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return _Managed.from_address(get(capsule, b"dltensor"))


def test_dlpack_fields_and_both_ways_the_export_ends(cuda):
    """An export keeps its tensor (so its buffer) alive until the consumer's deleter runs, or,
    for a capsule nobody consumed, until the capsule dies; exactly once either way."""
    buf = cuda.malloc(4096)
    t = buf.tensor((4, 8), "float32", strides=(16, 2), offset=5)
    assert t.__dlpack_device__() == (2, 0)
    capsule = t.__dlpack__(stream=None)
    exported = weakref.ref(t)
    del t
    m = _managed(capsule)
    d = m.dl_tensor
    assert (d.data, d.byte_offset) == (buf.ptr + 5 * 4, 0)
    with pytest.raises(sp.StateError, match=r"free: .* 1 live export"):
        buf.free()
    assert (d.device.device_type, d.device.device_id, d.ndim) == (2, 0, 2)
    assert (d.dtype.code, d.dtype.bits, d.dtype.lanes) == (2, 32, 1)
    assert (d.shape[0], d.shape[1], d.strides[0], d.strides[1]) == (4, 8, 16, 2)
    gc.collect()
    assert exported() is not None, "the export holds its tensor"
    # A consumer renames the capsule and calls the deleter when it is done.
    rename = _API.PyCapsule_SetName
    rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
    assert rename(capsule, b"used_dltensor") == 0
    m.deleter(ctypes.pointer(m))
    gc.collect()
    assert exported() is None, "the deleter let the tensor go"
    buf.free()  # the export ended with the deleter
    buf = cuda.malloc(4096)
    del capsule, m, d
    gc.collect()  # a consumed capsule does not delete twice (a second delete would crash here)
    # A capsule nobody consumed is deleted with it.
    t = buf.tensor((16,), "bfloat16")
    capsule = t.__dlpack__()
    exported = weakref.ref(t)
    del t
    m = _managed(capsule)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits) == (4, 16)
    gc.collect()
    assert exported() is not None
    del capsule, m
    gc.collect()
    assert exported() is None


def test_dlpack_refusals(cuda):
    t = cuda.malloc(64).tensor((16,), "float32")
    with pytest.raises(BufferError, match="cannot copy"):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not \\(1, 0\\)"):
        t.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="float8_e4m3fn has no DLPack type"):
        cuda.malloc(64).tensor((16,), "float8_e4m3fn").__dlpack__()


def test_dlpack_streams_and_keywords(cuda, fake_vendor):
    """``stream`` makes the consumer's stream wait for the worker's (an event, no host wait):
    ``None`` means the legacy default stream; -1 asks for nothing; 0 is refused as ambiguous.
    ``max_version`` is accepted (the capsule stays the unversioned kind every consumer reads)."""
    t = cuda.malloc(64).tensor((16,), "float32")
    log = fake_vendor.cuda_log()
    for stream in (None, 1, 2, -1):
        capsule = t.__dlpack__(stream=stream, max_version=(1, 0))
        del capsule
    calls = [line for line in fake_vendor.cuda_log()[len(log) :] if "Event" in line]
    waits = [line for line in calls if line.startswith("cuStreamWaitEvent")]
    assert [w.split()[1] for w in waits] == ["0x1", "0x1", "0x2"], calls
    with pytest.raises(BufferError, match="stream 0 is not a CUDA stream"):
        t.__dlpack__(stream=0)
    gc.collect()
    t.buffer.free()  # every capsule above is gone, so is its export


def test_numpy_refuses_a_cuda_capsule_clearly_and_nothing_leaks(cuda):
    buf = cuda.malloc(64)
    t = buf.tensor((16,), "float32")
    with pytest.raises((BufferError, RuntimeError, TypeError)) as e:
        np.from_dlpack(t)
    assert "device" in str(e.value).lower() or "cuda" in str(e.value).lower(), e.value
    del t, e
    gc.collect()
    buf.free()  # no export was left behind
