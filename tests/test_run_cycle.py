"""The run cycle over host-staged arguments: arena, uploads, copy-back, orchestration, failures."""

from __future__ import annotations

import gc
import re
import weakref

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT


def _add(x, y, out):
    out[...] = x + y


ADD = sp.Kernel(_add, [IN, IN, OUT])


def _orch_add(o, x, y, out):
    o.submit(ADD, x, y, out)


ADD_CALL = sp.Callable(_orch_add, [IN, IN, OUT])


def _args(n=256):
    x = np.arange(n, dtype=np.float32)
    return x, x * 2, np.zeros(n, np.float32)


def test_warm_arena_run_does_no_device_malloc():
    with sp.Worker("sim") as w:
        x, y, out = _args()
        r1 = w.run(ADD_CALL, [x, y, out])
        np.testing.assert_array_equal(out, x * 3)
        assert r1.counters["device_mallocs"] == 1  # the arena, once
        for _ in range(3):
            r = w.run(ADD_CALL, [x, y, out])
            assert (r.counters["device_mallocs"], r.counters["device_frees"]) == (0, 0)
        # A smaller footprint fits too.
        r = w.run(ADD_CALL, list(_args(16)))
        assert r.counters["device_mallocs"] == 0


def test_fresh_staging_mallocs_and_frees_per_staged_tensor_per_run():
    with sp.Worker("sim", staging="fresh") as w:
        for _ in range(3):
            r = w.run(ADD_CALL, list(_args()))
            assert (r.counters["device_mallocs"], r.counters["device_frees"]) == (3, 3)
        assert w.stats()["live_allocations"] == 0


def test_out_is_not_uploaded_and_in_is_not_copied_back():
    with sp.Worker("sim") as w:
        x, y, out = _args(100)
        r = w.run(ADD_CALL, [x, y, out])
        c = r.counters
        assert c["staged_tensors"] == 3
        assert c["staged_bytes"] == 800  # x and y, not out
        assert c["copied_back_bytes"] == 400  # out only
        s = w.stats()
        assert (s["h2d_calls"], s["h2d_bytes"], s["d2h_calls"], s["d2h_bytes"]) == (2, 800, 1, 400)


def test_every_run_uploads_even_when_address_and_size_match():
    with sp.Worker("sim") as w:
        x, y, out = _args(8)
        w.run(ADD_CALL, [x, y, out])
        x[:] = 100  # same array, same address, new contents
        w.run(ADD_CALL, [x, y, out])
        np.testing.assert_array_equal(out, 100 + y)


def test_strided_views_are_staged_by_extent_and_scattered_back():
    with sp.Worker("sim") as w:
        base = np.arange(24, dtype=np.float32).reshape(4, 6)
        xt = base.T  # transposed (6, 4)
        y = np.ones((6, 4), np.float32)
        holder = np.full((6, 8), -7.0, np.float32)
        out = holder[:, ::2]  # every other column: gaps between the elements
        r = w.run(ADD_CALL, [xt, y, out])
        np.testing.assert_array_equal(out, xt + 1)
        np.testing.assert_array_equal(holder[:, 1::2], -7.0)  # gap bytes untouched
        assert r.counters["staged_bytes"] == 96 + 96
        assert r.counters["copied_back_bytes"] == ((5 * 8 + 3 * 2) + 1) * 4
        # Negative strides and big-endian arrays go through a contiguous copy.
        rev = np.arange(10, dtype=np.float32)[::-1]
        be = np.arange(10, dtype=">f4")
        o2 = np.zeros(10, np.float32)[::-1]
        w.run(ADD_CALL, [rev, be, o2])
        np.testing.assert_array_equal(o2, rev + np.arange(10))


def _double(x, y):
    y[...] = x * 2


DOUBLE = sp.Kernel(_double, [IN, OUT])


def test_orchestrator_reads_a_control_tensor_to_decide_the_task_count():
    def orch(o, n, x, out):
        count = o.get_tensor_data(n, 0)
        for i in range(count):
            o.submit(DOUBLE, x.view([1, 4], [i, 0]), out.view([1, 4], [i, 0]))

    c = sp.Callable(orch, [IN, IN, OUT])
    with sp.Worker("sim") as w:
        x = np.arange(32, dtype=np.float32).reshape(8, 4)
        out = np.zeros((8, 4), np.float32)
        r = w.run(c, [np.array([3], np.int32), x, out])
        assert r.counters["tasks"] == 3
        np.testing.assert_array_equal(out[:3], x[:3] * 2)
        # OUT is not uploaded: rows no task wrote come back as the device had them (poison on sim).
        assert (out[3:].view(np.uint8) == 0xA5).all()


@pytest.mark.parametrize("svm", ["always", "never"])
def test_orchestrator_write_to_in_reaches_the_kernel_not_the_caller(svm):
    def orch(o, x, out):
        o.set_tensor_data(x, 1, 41.5)
        assert o.get_tensor_data(x, 1) == 41.5
        o.submit(DOUBLE, x, out)

    c = sp.Callable(orch, [IN, OUT])
    with sp.Worker("sim", svm=svm) as w:
        x = np.zeros(4, np.float32)
        out = np.zeros(4, np.float32)
        r = w.run(c, [x, out])
        np.testing.assert_array_equal(out, [0, 83, 0, 0])
        np.testing.assert_array_equal(x, 0)  # caller's IN array unchanged
        assert r.counters["orch_writes"] == 1
        # Read from the bytes the run uploaded (one copy of the span), never mapped.
        assert (r.counters["staged_view_copies"], r.counters["views_mapped"]) == (1, 0)


def test_typed_access_for_half_types_and_ints():
    def orch(o, h, b, i):
        assert o.get_tensor_data(h, (1, 0)) == 1.5
        assert o.get_tensor_data(b, (0, 1)) == -2.0
        assert o.get_tensor_data(i, (1, 1)) == 2**40
        o.set_tensor_data(h, (0, 0), 0.25)
        assert o.get_tensor_data(h, (0, 0)) == 0.25
        with pytest.raises(sp.ArgumentError, match="out of range"):
            o.set_tensor_data(i, (0, 0), 2**70)
        with pytest.raises(sp.ArgumentTypeError):
            o.set_tensor_data(i, (0, 0), 1.5)
        with pytest.raises(sp.ArgumentError, match="out of bounds"):
            o.get_tensor_data(h, (2, 0))
        with pytest.raises(sp.ArgumentError, match="rank"):
            o.get_tensor_data(h, 0)
        with pytest.raises(sp.ArgumentTypeError):
            o.get_tensor_data(h, (float("nan"), 0))
        assert o.read_tensor(b).dtype.name == "bfloat16"

    import ml_dtypes

    c = sp.Callable(orch, [IN, IN, IN])
    with sp.Worker("sim") as w:
        h = np.array([[0, 0], [1.5, 0]], np.float16)
        b = np.array([[1, -2], [0, 0]], dtype=ml_dtypes.bfloat16)
        i = np.array([[0, 0], [0, 2**40]], np.int64)
        w.run(c, [h, b, i])


def test_hazards_between_orchestrator_and_submitted_tasks():
    def orch(o, x, out):
        o.submit(DOUBLE, x, out)
        o.get_tensor_data(x, 0)  # reading an input of a submitted task is fine
        with pytest.raises(sp.HazardError, match="stale"):
            o.get_tensor_data(out, 0)
        with pytest.raises(
            sp.HazardError, match=r"task \d+ \(kernel _double\) submitted earlier in this run (reads|writes)"
        ):
            o.set_tensor_data(x, 0, 1.0)

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [IN, OUT]), [np.ones(4, np.float32), np.zeros(4, np.float32)])


_READ_X = sp.Kernel(lambda x: None, [IN], name="read_x")
_WRITE_X = sp.Kernel(lambda x: x.fill(7), [OUT], name="write_x")


@pytest.mark.parametrize("where", ["staged", "resident", "scratch"])
@pytest.mark.parametrize("how", ["submit", "submit_many"])
def test_a_view_read_by_a_task_then_written_by_the_next_is_stale_for_the_orchestrator(where, how):
    """Task 0 reads view X, task 1 writes the same X: an orchestrator read of X (or of one of its
    elements) is a HazardError naming task 1, the writer, although the task before it only read
    X. The two equal spans are different accesses; one must not stand for the other."""
    errors = []

    def orch(o, a):
        x = o.scratch([4, 8], "float32") if where == "scratch" else a
        v = x.view([2, 8], [1, 0])
        if how == "submit":
            o.submit(_READ_X, v)
            o.submit(_WRITE_X, v)
        else:  # views that do not ascend (one span per task), the last one X, then X written
            o.submit_many(_READ_X, x.views([2, 8], [[2, 0], [1, 0]]))
            o.submit_many(_WRITE_X, x.views([2, 8], [[1, 0]]))
        for read in (lambda: o.read_tensor(v), lambda: o.get_tensor_data(x, (2, 3))):
            with pytest.raises(sp.HazardError) as ei:
                read()
            errors.append(str(ei.value))
        o.get_tensor_data(x, (0, 0))  # no task writes row 0

    a = np.zeros((4, 8), np.float32)
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        arg = res.add("a", a, direction=sp.INOUT) if where == "resident" else a
        w.run(sp.Callable(orch, [sp.INOUT]), [arg])
    writers = {1} if how == "submit" else {2}
    named = [
        re.search(r"task (\d+) \(kernel write_x\) submitted earlier in this run writes", e) for e in errors
    ]
    assert len(errors) == 2 and all(m and int(m.group(1)) in writers for m in named), errors


def test_bad_arguments_fail_before_any_device_work():
    with sp.Worker("sim") as w:
        x, y, out = _args(4)
        for bad, exc in [
            ([x, y], sp.ArgumentError),
            ([x, y, out, out], sp.ArgumentError),
            ([x, 1.0, y, out], sp.ArgumentError),
            ([x, y, out, "s"], sp.ArgumentTypeError),
            ([x.astype(np.complex64), y, out], sp.ArgumentTypeError),
        ]:
            with pytest.raises(exc):
                w.run(ADD_CALL, bad)
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(sp.ArgumentError, match="read-only"):
            w.run(ADD_CALL, [x, y, ro])
        typed = sp.Callable(_orch_add, [IN, IN, (OUT, "float16")])
        with pytest.raises(sp.ArgumentTypeError, match="float16"):
            w.run(typed, [x, y, out])
        assert w.stats()["allocs"] == 0


def _live_beyond_arena(w):
    arena = w.debug_state()["arena"]
    return w.stats()["live_allocations"] - (1 if arena else 0)


FAULT_CELLS = [
    # (staging, op, nth, phase)
    ("arena", "alloc", 1, "bind"),
    ("arena", "h2d", 1, "bind"),
    ("arena", "h2d", 2, "bind"),
    ("fresh", "alloc", 2, "bind"),
    ("fresh", "h2d", 2, "bind"),
    ("arena", "d2h", 1, "copy_back"),
    ("fresh", "d2h", 1, "copy_back"),
    ("fresh", "free", 1, "cleanup"),
    ("fresh", "free", 3, "cleanup"),
]


@pytest.mark.parametrize(("staging", "op", "nth", "phase"), FAULT_CELLS)
def test_fault_in_each_run_phase_names_it_and_leaks_nothing(staging, op, nth, phase):
    with sp.Worker("sim", staging=staging) as w:
        user = w.malloc(64)
        x, y, out = _args(64)
        w.inject_fault(op, nth=nth, code=507000)
        with pytest.raises(sp.DeviceError) as ei:
            w.run(ADD_CALL, [x, y, out])
        e = ei.value
        assert (e.op, e.code, e.phase) == (op, 507000, phase), str(e)
        assert str(e).startswith(f"[{phase}]")
        # Only the arena and the caller's own buffer stay live.
        live = _live_beyond_arena(w)
        if phase == "cleanup":
            live -= 1  # the buffer whose free failed is kept (orphaned) for close to retry
        assert live == 1
        frees = [c for c in w.call_log() if c[0] == "free" and c[3] == 0]
        assert len({c[1] for c in frees}) == len(frees), "double free"
        out[:] = 0
        w.run(ADD_CALL, [x, y, out])
        np.testing.assert_array_equal(out, x + y)
        w.free(user)


def test_orchestration_and_kernel_failures_skip_copy_back_and_clean_up():
    def bad_orch(o, x, y, out):
        o.submit(ADD, x, y, out)
        raise RuntimeError("orchestration bug")

    def bad_kernel(x, y, out):
        out[...] = 1
        raise ValueError("kernel bug")

    with sp.Worker("sim", staging="fresh") as w:
        x, y, out = _args(8)
        with pytest.raises(RuntimeError, match="orchestration bug"):
            w.run(sp.Callable(bad_orch, [IN, IN, OUT]), [x, y, out])
        k = sp.Kernel(bad_kernel, [IN, IN, OUT])
        with pytest.raises(ValueError, match="kernel bug"):
            w.run(sp.Callable(lambda o, *t: o.submit(k, *t), [IN, IN, OUT]), [x, y, out])
        np.testing.assert_array_equal(out, 0)  # copy back skipped
        assert w.stats()["live_allocations"] == 0
        assert w.stats()["d2h_calls"] == 0


def test_report_is_json_serializable_with_the_documented_keys():
    import json

    with sp.Worker("sim") as w:
        r = w.run(ADD_CALL, list(_args(4)))
    d = json.loads(json.dumps(r.to_dict()))
    assert set(d["phases"]) == {"bind", "orchestrate", "execute", "copy_back", "cleanup"}
    assert {
        "staged_tensors",
        "staged_bytes",
        "copied_back_bytes",
        "device_mallocs",
        "device_frees",
        "resident_tensors",
        "views_mapped",
        "views_mirrored",
        "mirror_refreshes",
        "mirror_refresh_bytes",
        "orch_reads",
        "orch_writes",
    } <= set(d["counters"])


def test_one_worker_runs_one_call_at_a_time():
    def orch(o, x, out):
        with pytest.raises(sp.StateError, match="busy"):
            w.run(ADD_CALL, list(_args(4)))
        o.submit(DOUBLE, x, out)

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [IN, OUT]), [np.ones(4, np.float32), np.zeros(4, np.float32)])


def _square(x, tmp):
    tmp[...] = x * x


def _plus_one(tmp, out):
    out[...] = tmp + 1


SQUARE = sp.Kernel(_square, [IN, OUT])
PLUS_ONE = sp.Kernel(_plus_one, [IN, OUT])


@pytest.mark.parametrize("svm", ["always", "never"])
def test_scratch_tensors_chain_tasks_and_are_retained_across_runs(svm):
    def orch(o, x, out):
        rows = x.shape[0]
        for r in range(rows):
            tmp = o.scratch([1, 64], "float32", name=f"tmp{r}")
            o.submit(SQUARE, x.view([1, 64], [r, 0]), tmp)
            o.submit(PLUS_ONE, tmp, out.view([1, 64], [r, 0]))
            with pytest.raises(sp.HazardError):
                o.get_tensor_data(tmp, (0, 0))  # a task writes it later in this run
        big = o.scratch([3 << 18], "float32")  # larger than a pool chunk
        o.set_tensor_data(big, 5, 2.5)
        assert o.get_tensor_data(big, 5) == 2.5

    call = sp.Callable(orch, [IN, OUT])
    with sp.Worker("sim", svm=svm) as w:
        x = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
        out = np.zeros_like(x)
        cold = w.run(call, [x, out])
        np.testing.assert_array_equal(out, x * x + 1)
        assert cold.counters["scratch_tensors"] == 5
        assert cold.counters["scratch_bytes"] == 4 * 256 + (3 << 20)
        warm = w.run(call, [x, out])
        assert (warm.counters["device_mallocs"], warm.counters["device_frees"]) == (0, 0)
        w.trim_staging()
        assert w.stats()["live_allocations"] == 0


def test_an_overlapping_strided_output_only_gets_its_elements_back():
    # extent == nbytes, yet elements 1 and 2 of the base are gaps (and each element is viewed twice)
    from numpy.lib.stride_tricks import as_strided

    k = sp.Kernel(lambda a: a.__setitem__(Ellipsis, 7), [OUT])
    with sp.Worker("sim") as w:
        base = np.arange(4, dtype=np.float32)
        v = as_strided(base, shape=(2, 2), strides=(12, 0))
        w.run(sp.Callable(lambda o, t: o.submit(k, t), [OUT]), [v])
        np.testing.assert_array_equal(base, [7, 1, 2, 7])


def test_hazards_are_exact_for_strided_task_views():
    k = sp.Kernel(lambda a: a.__setitem__(Ellipsis, 1), [OUT])

    def orch(o, t):
        o.submit(k, t.view([4, 1], [0, 0]))  # column 0 only
        assert o.get_tensor_data(t, (0, 1)) == 0  # column 1: no task writes it
        o.set_tensor_data(t, (3, 1), 5)
        with pytest.raises(sp.HazardError):
            o.get_tensor_data(t, (2, 0))

    with sp.Worker("sim") as w:
        t = np.zeros((4, 2), np.float32)
        w.run(sp.Callable(orch, [INOUT]), [t])
        np.testing.assert_array_equal(t, [[1, 0], [1, 0], [1, 0], [1, 5]])


def test_negative_offsets_and_fault_counts_are_argument_errors():
    with sp.Worker("sim") as w:
        b = w.malloc(16)
        with pytest.raises(sp.ArgumentError, match="negative byte offset"):
            w.copy_to(b, np.zeros(2, np.float32), offset=-1)
        with pytest.raises(sp.ArgumentError, match="negative byte offset"):
            w.copy_from(np.zeros(2, np.float32), b, offset=-4)
        with pytest.raises(sp.ArgumentError, match="nth"):
            w.inject_fault("h2d", nth=-1)


def test_kernels_and_callables_take_part_in_garbage_collection():
    """A kernel or callable whose function refers back to it (a closure over itself) is
    collected once unreachable: the native classes report what they hold to the collector."""
    freed = []

    class Payload:
        def __del__(self):
            freed.append(1)

    def make():
        p = Payload()
        k = sp.Kernel(lambda *a: (p, k), [sp.IN])
        c = sp.Callable(lambda o, *a: (p, c), [sp.IN])
        return weakref.ref(k), weakref.ref(c)

    refs = make()
    gc.collect()
    assert freed == [1] and all(r() is None for r in refs)


def test_run_tensors_handed_out_again_stay_each_runs_own():
    """A warm run hands its orchestration the run tensors of the last run again where nothing
    holds them any more (no new objects per run): a tensor kept from a run is never handed out
    again (it stays that run's, refused in a later one), and a run over other arguments gets
    tensors that describe them."""
    kept, seen = {}, []

    def orch(o, t):
        seen.append((t.name, t.shape, t.dtype, o.get_tensor_data(t, 1)))
        if "old" in kept:
            with pytest.raises(sp.StateError, match="finished run"):
                o.get_tensor_data(kept["old"], 0)
            assert kept["old"] is not t
        if len(seen) == 2:
            kept["old"] = t

    class Named:
        def __init__(self, name, value):
            self.pair = (name, value)

        def __simpler_args__(self):
            return [self.pair]

    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        a = res.add("a", np.arange(4, dtype=np.int32))
        b = res.add("b", np.arange(10, 18, dtype=np.float32))
        call = sp.Callable(orch, [IN])
        for args in ([a], [a], [a], [a], Named("b", b), [a]):
            w.run(call, args)
        assert [s[:2] for s in seen] == [("arg0", (4,))] * 4 + [("b", (8,)), ("arg0", (4,))]
        assert [s[2] for s in seen] == ["int32"] * 4 + ["float32", "int32"]
        assert [s[3] for s in seen] == [1, 1, 1, 1, 11.0, 1]
        del kept["old"]
        w.run(call, [a])
        assert seen[-1] == ("arg0", (4,), "int32", 1)


def test_view_lists_take_any_integer_entries():
    """A view's shape and offsets parse the same from ints, numpy integers and objects with
    `__index__` (plain ints are read without running Python code; an entry that runs some, even
    one that empties its list, is taken as it comes, the list ending where it ends)."""

    class Idx:
        def __init__(self, v, clears=None):
            self.v, self.clears = v, clears

        def __index__(self):
            if self.clears is not None:
                self.clears.clear()
            return self.v

    got = []

    def orch(o, t):
        for shape, offsets in (
            ([1, 4], [2, 0]),
            ([np.int64(1), 4], [np.int32(2), Idx(0)]),
            ([Idx(1), np.uint8(4)], [2, np.int16(0)]),
        ):
            v = t.view(shape, offsets)
            got.append((v.shape, [o.get_tensor_data(v, (0, j)) for j in range(4)]))
        shape = [1, 4]
        shape[0] = Idx(1, clears=shape)
        got.append(t.view(shape, [0, 0]).shape)

    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.arange(16, dtype=np.int32).reshape(4, 4))
        w.run(sp.Callable(orch, [IN]), [t])
    assert got[:3] == [((1, 4), [8, 9, 10, 11])] * 3
    assert got[3] == (1, 0)
