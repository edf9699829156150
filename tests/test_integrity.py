"""Test integrity: what a scene test trusts to say "golden passed".

Never-written memory shows (a kernel that writes nothing cannot pass with an earlier run's
bytes); a kernel cannot write its IN tensors; two outputs of one task cannot overlap; a host view
survives a failed unregister; and the error contract for out-of-range integers. Each runs on sim
(through a mapping and through a mirror) and on the ascend platform over the fake vendor library.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
POISON = 0xA5
PLATFORMS = ["sim-mapping", "sim-mirror", "ascend"]


def _worker(kind, fake_vendor, **opts):
    if kind == "ascend":
        return fake_vendor.worker("ascend", **opts)
    return sp.Worker("sim", svm="always" if kind == "sim-mapping" else "never", **opts)


def _fake(fake_vendor):
    """The fake vendor library (the same copy the driver loaded)."""
    lib = ctypes.CDLL(str(fake_vendor.ascend_libs / "libascend_hal.so"))
    lib.fake_ascend_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    return lib


# -- 1. never-written memory shows ------------------------------------------------------------


def _doubling(x, out):
    out[...] = x * 2


def _lazy(x, out):
    out = x * 2  # rebinds the name: writes nothing  # noqa: F841


@pytest.mark.parametrize("staging", ["arena", "fresh"])
@pytest.mark.parametrize("kind", PLATFORMS)
def test_a_kernel_that_writes_nothing_cannot_pass_with_an_earlier_runs_bytes(kind, staging, fake_vendor):
    x = np.arange(256, dtype=np.float32)
    with _worker(kind, fake_vendor, staging=staging) as w:
        good = sp.Callable(lambda o, x, y: o.submit(sp.Kernel(_doubling, [IN, OUT]), x, y), [IN, OUT])
        lazy = sp.Callable(lambda o, x, y: o.submit(sp.Kernel(_lazy, [IN, OUT]), x, y), [IN, OUT])
        y = np.zeros_like(x)
        w.run(good, [x, y])
        np.testing.assert_array_equal(y, x * 2)  # the arena slice now holds the right answer
        y = np.zeros_like(x)
        r = w.run(lazy, [x, y])
        assert (y.view(np.uint8) == POISON).all()  # not the previous run's bytes
        assert r.counters["poisoned_bytes"] == y.nbytes


@pytest.mark.parametrize("kind", PLATFORMS)
def test_a_scratch_tensor_holds_poison_until_written_in_every_run(kind, fake_vendor):
    seen = []

    def orch(o, x, out):
        tmp = o.scratch([64], "int32", name="tmp")
        seen.append(int(o.get_tensor_data(tmp, 63)))  # read before any task writes it
        o.submit(sp.Kernel(lambda x, t: t.__setitem__(..., x), [IN, OUT]), x, tmp)
        o.submit(sp.Kernel(lambda t, y: y.__setitem__(..., t), [IN, OUT]), tmp, out)

    with _worker(kind, fake_vendor) as w:
        for k in range(3):
            x = np.full(64, k + 1, np.int32)
            y = np.zeros(64, np.int32)
            r = w.run(sp.Callable(orch, [IN, OUT]), [x, y])
            np.testing.assert_array_equal(y, k + 1)
            assert r.counters["poisoned_bytes"] == 64 * 4 + 64 * 4  # the staged out and the scratch
    assert seen == [int(np.frombuffer(bytes([POISON] * 4), np.int32)[0])] * 3


def test_poison_false_skips_the_fill(fake_vendor):
    with _worker("sim-mapping", fake_vendor, poison=False) as w:
        y = np.zeros(16, np.float32)
        r = w.run(sp.Callable(lambda o, y: None, [OUT]), [y])
        assert r.counters["poisoned_bytes"] == 0 and w.stats()["memset_calls"] == 0


# -- 2. IN arrays are read-only -----------------------------------------------------------------


@pytest.mark.parametrize("kind", PLATFORMS)
def test_a_kernel_writing_its_in_tensor_fails_naming_the_kernel_and_the_tensor(kind, fake_vendor):
    def meddle(x, y):
        x[0] = 42.0
        y[...] = x

    k = sp.Kernel(meddle, [IN, OUT], name="meddle")
    with _worker(kind, fake_vendor) as w:
        buf = w.malloc(64)
        w.copy_to(buf, np.arange(16, dtype=np.float32))
        x = buf.tensor((16,), "float32")
        call = sp.Callable(lambda o, x, y: o.submit(k, x, y), [IN, OUT])
        with pytest.raises(sp.ArgumentError, match=r"kernel meddle \(task 0\) wrote its IN tensor arg0"):
            w.run(call, [x, np.zeros(16, np.float32)])
        got = np.zeros(16, np.float32)
        w.copy_from(got, buf)
        np.testing.assert_array_equal(got, np.arange(16))  # the device never saw the write
        # The same answer for every platform, and the worker is usable afterwards.
        y = np.zeros(16, np.float32)
        w.run(sp.Callable(lambda o, x, y: o.submit(sp.Kernel(_doubling, [IN, OUT]), x, y), [IN, OUT]), [x, y])
        np.testing.assert_array_equal(y, np.arange(16) * 2)


# -- 3. two outputs of one task never overlap ---------------------------------------------------


@pytest.mark.parametrize("kind", PLATFORMS)
def test_overlapping_writable_views_of_one_task_are_refused(kind, fake_vendor):
    bump = sp.Kernel(lambda a, b: (a.__iadd__(1), b.__iadd__(10)), [INOUT, INOUT], name="bump")
    errors = []

    def orch(o, t):
        a, b = t.view([4], [0]), t.view([4], [2])  # elements 2 and 3 in both
        with pytest.raises(sp.HazardError) as ei:
            o.submit(bump, a, b)
        errors.append(str(ei.value))
        rows = np.array([[0], [8]])
        with pytest.raises(sp.HazardError) as ei:
            o.submit_many(bump, t.views([4], rows), t.views([4], rows + 3))
        errors.append(str(ei.value))
        o.submit(bump, t.view([4], [0]), t.view([4], [4]))  # adjacent, not overlapping: fine

    with _worker(kind, fake_vendor) as w:
        buf = w.malloc(64)
        w.copy_to(buf, np.zeros(16, np.int32))
        w.run(sp.Callable(orch, [INOUT]), [buf.tensor((16,), "int32")])
        got = np.zeros(16, np.int32)
        w.copy_from(got, buf)
    np.testing.assert_array_equal(got, [1] * 4 + [10] * 4 + [0] * 8)
    assert (
        "task 0 writes two views that share bytes: tensor 0 (arg0 shape [4] at element 0) and "
        "tensor 1 (arg0 shape [4] at element 2)" in errors[0]
    ), errors[0]
    assert "submit_many bump: task 0 writes two views" in errors[1], errors[1]


@pytest.mark.parametrize("kind", PLATFORMS)
def test_a_task_whose_input_overlaps_its_output_is_refused(kind, fake_vendor):
    """An IN view that shares bytes with an OUT view of the same task would read the old bytes
    through host copies and possibly the new ones in place: refused on every platform (single
    and batched), and the run's result is the same everywhere."""
    shift = sp.Kernel(lambda x, y: y.__setitem__(Ellipsis, x + 1), [IN, OUT], name="shift")
    errors = []

    def orch(o, t):
        with pytest.raises(sp.HazardError) as ei:
            o.submit(shift, t.view([4], [0]), t.view([4], [2]))
        errors.append(str(ei.value))
        rows = np.array([[0], [8]])
        with pytest.raises(sp.HazardError) as ei:
            o.submit_many(shift, t.views([4], rows), t.views([4], rows + 1))
        errors.append(str(ei.value))
        o.submit(shift, t.view([4], [0]), t.view([4], [4]))  # adjacent: fine

    with _worker(kind, fake_vendor) as w:
        buf = w.malloc(64)
        w.copy_to(buf, np.arange(16, dtype=np.int32))
        w.run(sp.Callable(orch, [INOUT]), [buf.tensor((16,), "int32")])
        got = np.zeros(16, np.int32)
        w.copy_from(got, buf)
    np.testing.assert_array_equal(got, [0, 1, 2, 3, 1, 2, 3, 4, *range(8, 16)])
    assert (
        "submit shift: task 0 reads a view that shares bytes with a view it writes: tensor 0 "
        "(arg0 shape [4] at element 0) and tensor 1 (arg0 shape [4] at element 2)" in errors[0]
    ), errors[0]
    assert "submit_many shift: task 0 reads a view that shares bytes" in errors[1], errors[1]


@pytest.mark.parametrize("kind", PLATFORMS)
def test_host_copies_during_orchestration_are_checked_against_pending_tasks(kind, fake_vendor):
    """``w.copy_to`` into bytes a submitted task reads, or ``w.copy_from`` out of bytes one
    writes, happens before the task runs (tasks run after orchestration): refused as a hazard on
    every platform. Copies of bytes no pending task touches go through."""
    shift = sp.Kernel(lambda x, y: y.__setitem__(Ellipsis, x + 1), [IN, OUT], name="shift")
    errors = []

    def orch(o, t):
        o.submit(shift, t.view([4], [0]), t.view([4], [8]))
        with pytest.raises(sp.HazardError) as ei:
            w.copy_to(buf, np.full(2, 50, np.int32), offset=8)  # elements 2, 3: read by the task
        errors.append(str(ei.value))
        with pytest.raises(sp.HazardError) as ei:
            w.copy_from(np.empty(1, np.int32), buf, offset=40)  # element 10: written by the task
        errors.append(str(ei.value))
        w.copy_to(buf, np.full(2, 60, np.int32), offset=16)  # elements 4, 5: untouched

    with _worker(kind, fake_vendor) as w:
        buf = w.malloc(64)
        w.copy_to(buf, np.arange(16, dtype=np.int32))
        w.run(sp.Callable(orch, [INOUT]), [buf.tensor((16,), "int32")])
        got = np.zeros(16, np.int32)
        w.copy_from(got, buf)
    np.testing.assert_array_equal(got, [0, 1, 2, 3, 60, 60, 6, 7, 1, 2, 3, 4, 12, 13, 14, 15])
    assert "copy_to into the buffer of tensor arg0: writing 8 bytes" in errors[0], errors[0]
    assert "task 0 (kernel shift)" in errors[0] and "reads" in errors[0], errors[0]
    assert "copy_from out of the buffer of tensor arg0: reading 4 bytes" in errors[1], errors[1]


@pytest.mark.parametrize("kind", PLATFORMS)
def test_read_tensor_of_columns_interleaved_with_written_ones_is_not_a_hazard(kind, fake_vendor):
    """Even columns read in bulk while a task writes the odd ones: the byte spans overlap, the
    elements do not, so no HazardError; reading the written columns still is one."""
    bump = sp.Kernel(lambda a: a.__iadd__(100), [INOUT], name="bump")
    seen = {}

    def orch(o, t):
        odd, even = t.view([4, 1], [0, 1]), t.view([4, 1], [0, 0])
        o.submit(bump, odd)
        seen["even"] = o.read_tensor(even).copy()
        with pytest.raises(sp.HazardError, match="bump"):
            o.read_tensor(odd)

    with _worker(kind, fake_vendor) as w:
        buf = w.malloc(32)
        w.copy_to(buf, np.arange(8, dtype=np.float32))
        w.run(sp.Callable(orch, [INOUT]), [buf.tensor((4, 2), "float32")])
        got = np.zeros(8, np.float32)
        w.copy_from(got, buf)
    np.testing.assert_array_equal(seen["even"].ravel(), [0, 2, 4, 6])
    np.testing.assert_array_equal(got, [0, 101, 2, 103, 4, 105, 6, 107])


# -- 4. a failed unregister leaves a working view -----------------------------------------------


@pytest.mark.parametrize("via", ["free", "trim_staging"])
def test_a_failed_unregister_keeps_the_view_and_the_retry_unregisters_before_freeing(via, fake_vendor):
    with _worker("ascend", fake_vendor) as w:
        fake = _fake(fake_vendor)
        n = 1 << 15  # 128 KiB: mapped under FAKE_ASCEND_MAP=min:65536
        table = np.arange(n, dtype=np.int32)

        def read(o, t):
            return int(o.get_tensor_data(t, n - 1))

        if via == "free":
            buf = w.malloc(table.nbytes)
            w.copy_to(buf, table)
            t = buf.tensor((n,), "int32")
            w.run(sp.Callable(lambda o, t: read(o, t), [IN]), [t])
            assert w.host_view_info(buf) == "mapping"
            assert fake.fake_ascend_inject(b"halHostUnregister", 1, 8) == 0
            with pytest.raises(sp.DeviceError, match="halHostUnregister") as ei:
                w.free(buf)
            assert ei.value.code == 8 and "still usable" in str(ei.value)
            got = []
            w.run(sp.Callable(lambda o, t: got.append(read(o, t)), [IN]), [t])  # the view works
            assert got == [n - 1]
            w.free(buf)  # the retry unregisters, then frees
        else:
            # A scratch tensor read by the orchestration maps its chunk of the scratch pool
            # (staged tensors are never mapped); trim_staging frees the pool.
            def scratch_read(o, x):
                s = o.scratch((n,), "int32")
                o.set_tensor_data(s, n - 1, 5)
                return int(o.get_tensor_data(s, n - 1))

            small = np.zeros(4, np.int32)
            w.run(sp.Callable(scratch_read, [IN]), [small])
            assert w.debug_state()["views"]["mapped"] == 1
            assert fake.fake_ascend_inject(b"halHostUnregister", 1, 8) == 0
            with pytest.raises(sp.DeviceError, match="halHostUnregister"):
                w.trim_staging()
            got = []
            w.run(sp.Callable(lambda o, x: got.append(scratch_read(o, x)), [IN]), [small])
            assert got == [5]  # the kept view still works
            w.trim_staging()
        log = w.call_log()
        unmaps = [i for i, c in enumerate(log) if c[0] == "unmap" and c[3] == 0]
        frees = [i for i, c in enumerate(log) if c[0] == "free" and c[3] == 0]
        assert unmaps and frees and unmaps[-1] < frees[-1]
        assert w.stats()["live_mappings"] == 0


# -- 7. out-of-range integers are ArgumentErrors naming the argument ----------------------------


def test_out_of_range_integers_are_argument_errors_naming_the_argument(monkeypatch):
    big = 2**64
    with sp.Worker("sim") as w:
        buf = w.malloc(64)
        cases = [
            (lambda: w.malloc(big), "malloc: size"),
            (lambda: w.malloc(-1), "malloc: negative size -1"),
            (lambda: buf.tensor((2**63,), "float32"), "does not fit 64 bits"),
            (lambda: buf.tensor((4,), "float32", strides=(2**63,)), "does not fit 64 bits"),
            (lambda: buf.tensor((4,), "float32", offset=2**63), "overflows 64 bits"),
            (lambda: w.copy_to(buf, np.zeros(1, np.float32), offset=big), "copy_to: byte offset"),
            (lambda: w.inject_fault("h2d", nth=big), "inject_fault: nth"),
            (lambda: sp.Worker("sim", capacity=-1), "Worker: negative capacity -1"),
            (lambda: sp.Worker("ascend", device_id=-1), "Worker: negative device_id -1"),
        ]
        for f, msg in cases:
            with pytest.raises(sp.ArgumentError, match=msg):
                f()

        def orch(o, t):
            with pytest.raises(sp.ArgumentError, match="does not fit 64 bits"):
                t.view([1], [2**63])
            with pytest.raises(sp.ArgumentError, match="does not fit 64 bits"):
                o.get_tensor_data(t, 2**64)

        w.run(sp.Callable(orch, [IN]), [buf.tensor((16,), "float32")])


# -- 8. small ones ------------------------------------------------------------------------------


def test_device_tensors_with_strides_are_hashable_and_equal_by_layout():
    with sp.Worker("sim") as w:
        buf = w.malloc(64)
        a = buf.tensor((4,), "float32", strides=(2,))
        assert a == buf.tensor((4,), "float32", strides=[2]) and len({a, buf.tensor((4,), "float32")}) == 2


def test_a_generator_orchestration_is_refused():
    def orch(o, x):
        yield o.submit(sp.Kernel(lambda x: None, [IN]), x)

    with sp.Worker("sim") as w, pytest.raises(sp.ArgumentTypeError, match="returned a generator"):
        w.run(sp.Callable(orch, [IN]), [np.zeros(4, np.float32)])


def test_a_finite_value_the_dtype_cannot_hold_is_refused():
    def orch(o, t):
        o.set_tensor_data(t, 0, 1e6)

    msg = "value 1000000 out of range for float16"
    with sp.Worker("sim") as w, pytest.raises(sp.ArgumentError, match=msg):
        w.run(sp.Callable(orch, [INOUT]), [np.zeros(4, np.float16)])


def test_build_args_checks_the_type_of_expected_count():
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        res.add("x", np.zeros(4, np.float32))
        with pytest.raises(sp.ArgumentTypeError, match="expected_count must be an int"):
            res.build_args(expected_count="1")
        assert len(res.build_args(expected_count=1)) == 1


# -- 5. every supported dtype round-trips -------------------------------------------------------


def _values_of(dtype: np.dtype, n: int) -> np.ndarray:
    """Small values every kind can hold exactly (fp4 holds 0, 0.5, 1, 1.5, 2, 3, 4, 6)."""
    if dtype == np.bool_:
        return (np.arange(n) % 2).astype(dtype)
    base = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6]) if dtype.kind in "fV" else np.arange(8)
    return base[np.arange(n) % 8].astype(dtype)


@pytest.mark.parametrize("name", sp.SUPPORTED_DTYPES)
@pytest.mark.parametrize("kind", ["sim-mapping", "sim-mirror", "ascend"])
def test_every_supported_dtype_round_trips(name, kind, fake_vendor):
    """Staged (contiguous and strided), resident, get/set_tensor_data and read_tensor."""
    dt = sp.np_dtype(name)
    host = _values_of(dt, 24).reshape(4, 6)
    seen = {}

    def orch(o, res_t, staged_in, out):
        seen["read"] = o.read_tensor(res_t).copy()
        seen["elem"] = o.get_tensor_data(staged_in, (1, 2))
        o.set_tensor_data(res_t, (0, 0), seen["elem"])
        o.submit(sp.Kernel(lambda a, b: b.__setitem__(..., a), [IN, OUT]), staged_in, out)

    with _worker(kind, fake_vendor) as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", host, INOUT)
        strided_in = host[:, ::2]  # a staged view with gaps between its elements
        out = np.zeros((4, 6), dt)[:, 1::2]  # a staged output view with gaps
        w.run(sp.Callable(orch, [INOUT, IN, OUT]), [t, strided_in, out])
        np.testing.assert_array_equal(seen["read"].astype(np.float64), host.astype(np.float64))
        assert seen["elem"] == host[1, 4].item()
        np.testing.assert_array_equal(out.astype(np.float64), strided_in.astype(np.float64))
        back = sp.TaskArgsBuilder(sp.TensorArg("t", np.zeros((4, 6), dt)))
        res.copy_back(back, ["t"])
        want = host.copy()
        want[0, 0] = host[1, 4]
        np.testing.assert_array_equal(back.t.astype(np.float64), want.astype(np.float64))


# -- from the source documents ------------------------------------------------------------------


@pytest.mark.parametrize("svm", ["always", "never"])
def test_an_eager_host_view_is_established_at_add_and_the_first_run_pays_nothing(svm):
    with sp.Worker("sim", svm=svm) as w, sp.ResidentTaskArgs(w) as res:
        before = w.stats()
        t = res.add("table", np.arange(64, dtype=np.int32), host_view="eager")
        after = w.stats()
        kind = "mapping" if svm == "always" else "mirror"
        assert w.host_view_info(t) == kind
        assert after["maps"] - before["maps"] == 1
        assert after["d2h_calls"] - before["d2h_calls"] == (1 if kind == "mirror" else 0)
        got = []
        r = w.run(sp.Callable(lambda o, t: got.append(o.get_tensor_data(t, 63)), [IN]), [t])
        assert got == [63]
        assert (r.counters["views_mapped"], r.counters["views_mirrored"], r.counters["mirror_refreshes"]) == (
            0,
            0,
            0,
        )
        lazy = res.add("lazy", np.arange(4, dtype=np.int32))
        assert w.host_view_info(lazy) is None
        with pytest.raises(
            sp.ArgumentError, match="host_view must be one of lazy, eager, auto, mapping, cached, mirror"
        ):
            res.add("bad", np.arange(4, dtype=np.int32), host_view="sometimes")


def test_reading_a_small_staged_tensor_beside_a_large_one_maps_nothing(caplog):
    """A 256-byte control tensor staged beside 2 MiB: the orchestration reads it from the bytes
    the run uploaded. No mapping of the staging arena, no read back from the device, no warning,
    in either staging mode, every run."""
    big = np.zeros(1 << 19, np.float32)
    small = np.arange(64, dtype=np.int32)
    for staging in ("arena", "fresh"):
        with sp.Worker("sim", staging=staging) as w, caplog.at_level("WARNING", logger="simpler"):
            for _ in range(3):
                d2h = w.stats()["d2h_calls"]
                r = w.run(sp.Callable(lambda o, b, s: o.get_tensor_data(s, 1), [IN, IN]), [big, small])
                assert w.stats()["d2h_calls"] == d2h
                assert (r.counters["views_mapped"], r.counters["staged_view_copies"]) == (0, 1)
            assert w.stats()["maps"] == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
