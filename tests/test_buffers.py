"""Foundations: buffers, counters, faults, geometry, the sim device's strictness."""

from __future__ import annotations

import numpy as np
import pytest

import simpler as sp


@pytest.fixture
def w():
    with sp.Worker("sim") as worker:
        yield worker


def test_round_trip_counts_exactly(w):
    buf = w.malloc(4096)
    src = np.arange(1024, dtype=np.float32)
    w.copy_to(buf, src)
    out = np.zeros(512, dtype=np.float32)
    w.copy_from(out, buf, offset=2048)
    np.testing.assert_array_equal(out, src[512:])
    w.free(buf)
    s = w.stats()
    assert {k: s[k] for k in ("allocs", "frees", "h2d_calls", "h2d_bytes", "d2h_calls", "d2h_bytes")} == {
        "allocs": 1,
        "frees": 1,
        "h2d_calls": 1,
        "h2d_bytes": 4096,
        "d2h_calls": 1,
        "d2h_bytes": 2048,
    }
    assert (s["live_allocations"], s["live_bytes"], s["peak_bytes"]) == (0, 0, 4096)
    assert [c[0] for c in w.call_log()] == ["alloc", "h2d", "d2h", "free"]


def test_fresh_device_memory_is_poisoned(w):
    buf = w.malloc(16)
    out = np.zeros(16, dtype=np.uint8)
    w.copy_from(out, buf)
    assert (out == 0xA5).all()


def test_sim_addresses_are_not_host_pointers(w):
    buf = w.malloc(64)
    assert buf.ptr >= 0x8D00_0000_0000_0000
    seen = {}

    def k(x):
        seen["addr"] = x.__array_interface__["data"][0]

    c = sp.Callable(lambda o, t: o.submit(sp.Kernel(k, [sp.IN]), t), [sp.IN])
    w.run(c, [buf.tensor((16,), "float32")])
    assert seen["addr"] != buf.ptr
    assert seen["addr"] < 0x8000_0000_0000


@pytest.mark.parametrize("op", ["alloc", "h2d", "d2h", "free"])
def test_each_injected_fault_names_op_and_code_and_worker_stays_usable(w, op):
    buf = w.malloc(64) if op != "alloc" else None
    w.inject_fault(op, nth=1, code=4242)
    with pytest.raises(sp.DeviceError) as ei:
        if op == "alloc":
            w.malloc(64)
        elif op == "h2d":
            w.copy_to(buf, np.zeros(16, np.float32))
        elif op == "d2h":
            w.copy_from(np.zeros(16, np.float32), buf)
        else:
            w.free(buf)
    e = ei.value
    assert (e.op, e.code, e.phase) == (op, 4242, "buffer")
    assert "4242" in str(e) and "injected fault" in str(e)
    # Usable afterwards: the same operation succeeds.
    b2 = w.malloc(64)
    w.copy_to(b2, np.ones(16, np.float32))
    out = np.zeros(16, np.float32)
    w.copy_from(out, b2)
    assert (out == 1).all()
    w.free(b2)
    if buf is not None:
        w.free(buf)
    assert w.stats()["live_allocations"] == 0


def test_map_and_unmap_faults_surface_on_first_access(w):
    buf = w.malloc(64)
    w.copy_to(buf, np.arange(16, dtype=np.int32))
    c = sp.Callable(lambda o, t: o.get_tensor_data(t, 3), [sp.IN])
    w.inject_fault("map", code=13)
    with pytest.raises(sp.DeviceError) as ei:
        w.run(c, [buf.tensor((16,), "int32")])
    assert (ei.value.op, ei.value.code, ei.value.phase) == ("map", 13, "orchestrate")
    w.run(c, [buf.tensor((16,), "int32")])
    assert w.host_view_info(buf) == "mapping"
    w.inject_fault("unmap")
    with pytest.raises(sp.DeviceError) as ei:
        w.free(buf)
    assert ei.value.op == "unmap"
    w.free(buf)  # the retry unmaps, then frees
    assert w.stats()["live_allocations"] == 0 and w.stats()["live_mappings"] == 0


def test_double_free_unknown_free_and_out_of_range_copies(w):
    buf = w.malloc(64)
    w.free(buf)
    with pytest.raises(sp.StateError, match="not a live allocation"):
        w.free(buf)
    # A handle comes only from the worker: an address cannot be made into a Buffer by hand.
    with pytest.raises(TypeError, match="cannot create"):
        sp.Buffer(w, buf.ptr + 4096, 8)
    b = w.malloc(64)
    with pytest.raises(sp.ArgumentError, match="run past buffer"):
        w.copy_to(b, np.zeros(17, np.float32))
    with pytest.raises(sp.ArgumentError, match="run past buffer"):
        w.copy_from(np.zeros(8, np.float32), b, offset=40)
    with pytest.raises(sp.ArgumentError, match="0 bytes"):
        w.malloc(0)


def test_huge_shape_is_a_geometry_error_not_a_wrap(w):
    buf = w.malloc(64)
    with pytest.raises(sp.GeometryError, match="overflows"):
        buf.tensor((2**40, 2**40), "float32")
    with pytest.raises(sp.GeometryError):
        buf.tensor((4,), "float32", offset=2**62)
    with pytest.raises(sp.GeometryError, match="negative"):
        buf.tensor((-1, 4), "float32")


def test_tensor_larger_than_its_buffer_is_rejected(w):
    buf = w.malloc(64)
    buf.tensor((16,), "float32")
    with pytest.raises(sp.ArgumentError, match="has only 64 bytes"):
        buf.tensor((17,), "float32")
    with pytest.raises(sp.ArgumentError, match="has only 64 bytes"):
        buf.tensor((4, 4), "float32", strides=(4, 1), offset=1)
    # A transposed view spans exactly the base's bytes.
    buf.tensor((4, 4), "float32", strides=(1, 4))


def test_non_contiguous_copies_and_unsupported_dtypes_are_refused(w):
    buf = w.malloc(256)
    with pytest.raises(sp.ArgumentError, match="C-contiguous"):
        w.copy_to(buf, np.zeros((4, 4), np.float32).T)
    with pytest.raises(sp.ArgumentTypeError, match="unsupported dtype"):
        buf.tensor((4,), "complex64")
    with pytest.raises(sp.ArgumentTypeError):
        w.copy_to(buf, [1, 2, 3])


def test_close_frees_live_buffers_with_a_warning_and_is_idempotent(caplog):
    w = sp.Worker("sim")
    w.malloc(10)
    w.malloc(20)
    with caplog.at_level("WARNING"):
        w.close()
    assert any("2 live buffer" in r.getMessage() for r in caplog.records)
    w.close()
    with pytest.raises(sp.StateError, match="closed"):
        w.malloc(8)


def test_unknown_platform_and_options():
    with pytest.raises(sp.ArgumentError, match="unknown platform"):
        sp.Worker("tpu")
    with pytest.raises(sp.ArgumentError, match="svm"):
        sp.Worker("sim", svm="sometimes")
    with pytest.raises(sp.ArgumentError, match="staging"):
        sp.Worker("sim", staging="pool")
    with pytest.raises(sp.ArgumentError):
        with sp.Worker("sim") as w:
            w.inject_fault("teleport")


def test_bfloat16_and_fp8_are_real_dtypes(w):
    import ml_dtypes

    buf = w.malloc(64)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"):
        t = buf.tensor((4,), name)
        assert t.np_dtype == np.dtype(getattr(ml_dtypes, name))


def test_copies_through_a_tensor_honour_its_offset_and_refuse_a_strided_layout(w):
    """``copy_to`` / ``copy_from`` given a DeviceTensor copy its elements (from its offset, within
    its bytes); a tensor whose elements are not contiguous is refused, never copied as if it
    were its buffer's first bytes."""
    buf = w.malloc(64)
    w.copy_to(buf, np.arange(16, dtype=np.float32))
    mid = buf.tensor((4,), "float32", offset=4)
    got = np.empty(4, np.float32)
    w.copy_from(got, mid)
    np.testing.assert_array_equal(got, [4, 5, 6, 7])
    w.copy_to(mid, np.full(3, -1, np.float32), offset=4)  # bytes 4.. of the tensor
    buf.copy_from(full := np.empty(16, np.float32))
    np.testing.assert_array_equal(full, [0, 1, 2, 3, 4, -1, -1, -1, 8, 9, 10, 11, 12, 13, 14, 15])
    with pytest.raises(sp.ArgumentError, match=r"run past the tensor \(16 bytes\)"):
        w.copy_from(np.empty(8, np.float32), mid)
    transposed = buf.tensor((4, 4), "float32", strides=(1, 4))
    with pytest.raises(sp.ArgumentError, match="not contiguous"):
        w.copy_from(np.empty((4, 4), np.float32), transposed)
    with pytest.raises(sp.ArgumentError, match="not contiguous"):
        w.copy_to(transposed, np.zeros((4, 4), np.float32))
    buf.copy_from(after := np.empty(16, np.float32))
    np.testing.assert_array_equal(after, full)  # the refusals wrote nothing


def test_leaving_a_buffer_block_does_not_hide_a_refused_free(w):
    """A buffer's block frees it unless it was freed already; a free that is refused (the buffer
    belongs to a resident set) raises at the exit, or warns when the block raised already."""
    res = sp.ResidentTaskArgs(w)
    t = res.add("kv", np.zeros(16, np.float32))
    with pytest.raises(sp.StateError, match="owned by a ResidentTaskArgs"):
        with t.buffer:
            pass
    with pytest.warns(RuntimeWarning, match="owned by a ResidentTaskArgs"):
        with pytest.raises(KeyError, match="the block's own"):
            with t.buffer:
                raise KeyError("the block's own")
    res.release()
    with t.buffer:  # released with its set: nothing to free
        pass


def test_a_reversed_single_row_and_empty_arrays_are_taken_as_they_are(w):
    """A dimension of one element never steps, whatever its stride: numpy's reversed one-row
    array (a negative stride, C-contiguous) is staged and copied byte for byte, in a copy and in a
    run. An empty array copies nothing, read-only or not, and an empty run tensor reads back as
    numpy's own empty array of its shape (C order)."""
    src = np.arange(8, dtype=np.float64).reshape(2, 4)[1:][::-1]
    assert src.strides[0] < 0 and src.flags.c_contiguous
    buf = w.malloc(32)
    w.copy_to(buf, src)
    back = np.zeros((1, 4))
    w.copy_from(back, buf)
    np.testing.assert_array_equal(back, src)
    empty = np.zeros((0, 3), np.float32)
    empty.flags.writeable = False
    w.copy_from(empty, buf)
    seen = {}

    def orch(o, x, e):
        seen["x"] = o.read_tensor(x).copy()
        a = o.read_tensor(e)
        seen["e"] = (a.shape, a.strides, a.dtype)

    w.run(sp.Callable(orch, [sp.IN, sp.IN]), [src, np.zeros((0, 3), np.float32)])
    np.testing.assert_array_equal(seen["x"], src)
    assert seen["e"] == ((0, 3), np.zeros((0, 3), np.float32).strides, np.dtype(np.float32))
