"""The ascend platform end to end against the fake CANN runtime + HAL (crates/fake-ascend).

`make test` builds the fake library and links it under target/fake-ascend-libs; the tests skip
(with the reason) when it is not there, e.g. when pytest runs before `cargo build`.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT


@pytest.fixture
def ascend(fake_vendor):
    with fake_vendor.worker("ascend") as w:
        yield w


def _double(x, y):
    y[...] = x * 2


DOUBLE = sp.Kernel(_double, [IN, OUT])


def test_kernels_run_on_host_copies_and_outputs_reach_the_device(ascend):
    w = ascend

    def orch(o, x, acc, out):
        o.submit(DOUBLE, x, out)
        o.submit(sp.Kernel(lambda a: a.__iadd__(1), [INOUT]), acc)

    buf = w.malloc(16)
    w.copy_to(buf, np.zeros(4, np.int32))
    acc = buf.tensor((4,), "int32")
    x = np.arange(8, dtype=np.float32)
    out = np.zeros(8, np.float32)
    for _ in range(3):
        r = w.run(sp.Callable(orch, [IN, INOUT, OUT]), [x, acc, out])
    np.testing.assert_array_equal(out, x * 2)
    got = np.zeros(4, np.int32)
    w.copy_from(got, buf)
    np.testing.assert_array_equal(got, 3)
    assert r.counters["device_mallocs"] == 0


def test_small_mirrored_large_mapped_and_unregister_before_free(ascend):
    w = ascend

    def orch(o, small, large):
        assert o.get_tensor_data(small, 3) == 3
        assert o.get_tensor_data(large, 40_000) == 40_000

    sb = w.malloc(64)
    w.copy_to(sb, np.arange(16, dtype=np.int32))
    lb = w.malloc(1 << 18)
    w.copy_to(lb, np.arange(1 << 16, dtype=np.int32))
    r = w.run(sp.Callable(orch, [IN, IN]), [sb.tensor((16,), "int32"), lb.tensor((1 << 16,), "int32")])
    assert (r.counters["views_mirrored"], r.counters["views_mapped"]) == (1, 1)
    assert (w.host_view_info(sb), w.host_view_info(lb)) == ("mirror", "mapping")
    w.free(lb)
    log = w.call_log()
    unmap = next(i for i, c in enumerate(log) if c[0] == "unmap" and c[1] == lb.ptr)
    free = next(i for i, c in enumerate(log) if c[0] == "free" and c[1] == lb.ptr)
    assert unmap < free


@pytest.mark.parametrize("op", ["h2d", "d2h"])
def test_a_failed_copy_during_execute_names_the_call_the_tensor_and_the_code(ascend, op):
    w = ascend
    x = np.arange(8, dtype=np.float32)
    out = np.zeros(8, np.float32)
    call = sp.Callable(lambda o, a, b: o.submit(DOUBLE, a, b), [IN, OUT])
    w.run(call, [x, out])  # warm: the arena exists
    # bind uploads x (1 h2d); execute copies x and out in (2 d2h) and out back (1 h2d).
    w.inject_fault(op, nth=2)
    with pytest.raises(sp.DeviceError) as ei:
        w.run(call, [x, out])
    e = ei.value
    assert (e.op, e.phase, e.call, e.code) == (op, "execute", "aclrtMemcpy", 507000)
    assert e.tensor in ("arg0", "arg1")
    assert "ACL_ERROR_RT_INTERNAL_ERROR" in str(e)
    assert w.stats()["live_allocations"] == 1  # the arena only
    w.run(call, [x, out])
    np.testing.assert_array_equal(out, x * 2)


def test_platform_unavailable_names_the_library_and_paths(monkeypatch):
    monkeypatch.setenv("SIMPLER_ASCEND_LIB_DIR", "/nonexistent-simpler")
    with pytest.raises(
        sp.PlatformUnavailableError, match=r"libascend_hal\.so.*nonexistent-simpler.*SIMPLER_ASCEND_LIB_DIR"
    ):
        sp.Worker("ascend")
    assert os.environ["SIMPLER_ASCEND_LIB_DIR"] == "/nonexistent-simpler"


def test_two_write_views_of_one_argument_in_one_task_keep_both_writes(ascend):
    k = sp.Kernel(lambda a, b: (a.__setitem__(Ellipsis, 1), b.__setitem__(Ellipsis, 2)), [OUT, OUT])

    def orch(o, t):
        o.submit(k, t.view([4, 1], [0, 0]), t.view([4, 1], [0, 1]))  # interleaved columns

    out = np.zeros((4, 2), np.float32)
    ascend.run(sp.Callable(orch, [OUT]), [out])
    np.testing.assert_array_equal(out, [[1, 2]] * 4)
