"""ResidentTaskArgs: per-direction traffic, consumption of fixtures, rejection, rollback, LIFO release."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import weakref

import numpy as np
import pytest

import simpler as sp
from simpler.errors import ArgumentError, ArgumentTypeError, DeviceError, StateError


@pytest.fixture
def w():
    with sp.Worker("sim", staging="fresh") as worker:
        yield worker


def _delta(before, after):
    return {
        k: after[k] - before[k] for k in ("allocs", "frees", "h2d_calls", "d2h_calls", "live_allocations")
    }


@pytest.mark.parametrize(
    ("direction", "h2d"),
    [(sp.IN, 1), (sp.OUT, 0), (sp.INOUT, 1)],
)
def test_add_allocates_and_uploads_unless_out(w, direction, h2d):
    s0 = w.stats()
    with sp.ResidentTaskArgs(w) as res:
        t = res.add("x", np.arange(8, dtype=np.float32), direction)
        assert isinstance(t, sp.DeviceTensor)
        assert t.shape == (8,) and t.dtype == "float32" and t.buffer.nbytes == 32
        assert res["x"] is t and res.direction("x") is direction
        assert _delta(s0, w.stats()) == {
            "allocs": 1,
            "frees": 0,
            "h2d_calls": h2d,
            "d2h_calls": 0,
            "live_allocations": 1,
        }
    assert _delta(s0, w.stats()) == {
        "allocs": 1,
        "frees": 1,
        "h2d_calls": h2d,
        "d2h_calls": 0,
        "live_allocations": 0,
    }


def test_upload_contents_reach_the_device(w):
    host = np.arange(6, dtype=np.int32).reshape(2, 3)
    with sp.ResidentTaskArgs(w) as res:
        t = res.add("x", host)
        back = np.zeros_like(host)
        w.copy_from(back, t.buffer)
        np.testing.assert_array_equal(back, host)


def test_add_keeps_nothing_of_the_host_array(w):
    with sp.ResidentTaskArgs(w) as res:
        host = np.ones(1024, dtype=np.float32)
        ref = weakref.ref(host)
        res.add("weight", host)
        del host
        gc.collect()
        assert ref() is None, "ResidentTaskArgs kept a reference to a consumed fixture"
        # a streaming driver: build, add, drop, next
        for i in range(4):
            res.add(f"layer{i}", np.full(256, i, dtype=np.float32))
        assert res.names == ["weight", "layer0", "layer1", "layer2", "layer3"]


def test_rejections_allocate_nothing(w):
    s0 = w.stats()
    with sp.ResidentTaskArgs(w) as res:
        res.add("a", np.zeros(4, dtype=np.float32))
        with pytest.raises(ArgumentError, match="'a' was already added"):
            res.add("a", np.zeros(4, dtype=np.float32))
        with pytest.raises(ArgumentTypeError, match="expected a numpy array"):
            res.add("b", [1.0, 2.0])
        with pytest.raises(ArgumentError, match="C-contiguous"):
            res.add("c", np.zeros((4, 4), dtype=np.float32)[:, 1])
        with pytest.raises(ArgumentTypeError, match="unsupported dtype"):
            res.add("d", np.zeros(4, dtype=np.complex64))
        with pytest.raises(ArgumentTypeError, match="unsupported dtype"):
            res.add("e", np.array([object()]))
        with pytest.raises(ArgumentTypeError, match="direction"):
            res.add("f", np.zeros(4, dtype=np.float32), "SIDEWAYS")
        assert res.names == ["a"]
        assert w.stats()["allocs"] - s0["allocs"] == 1


def test_aliased_fixtures_are_rejected(w):
    base = np.zeros(16, dtype=np.float32)
    with sp.ResidentTaskArgs(w) as res:
        res.add("lo", base[:8])  # the slice is a temporary: the check must still see base
        with pytest.raises(ArgumentError, match="overlaps resident fixture 'lo'"):
            res.add("mid", base[4:12])
        with pytest.raises(ArgumentError, match="overlaps"):
            res.add("same", base[:8])
        with pytest.raises(ArgumentError, match="overlaps"):
            res.add("bytes", base[:8].view(np.uint8))
        res.add("hi", base[8:])  # adjacent, not overlapping
        assert res.names == ["lo", "hi"]
        assert w.stats()["live_allocations"] == 2


def test_zero_byte_fixture_stays_host_staged(w, caplog):
    empty = np.zeros((0, 4), dtype=np.float32)
    s0 = w.stats()
    with caplog.at_level(logging.DEBUG, logger="simpler"), sp.ResidentTaskArgs(w) as res:
        out = res.add("empty", empty)
        assert out is empty and res["empty"] is empty
        assert res.names == ["empty"] and res.resident_names == []
        assert w.stats()["allocs"] == s0["allocs"]
    assert any("host-staged" in r.message for r in caplog.records)


def test_build_args_rejects_a_skipped_empty_fixture(w):
    c = sp.Callable(lambda o, a, e, out: None, [sp.IN, sp.IN, sp.OUT])
    a = np.ones(4, dtype=np.float32)
    e = np.zeros(0, dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    with sp.ResidentTaskArgs(w) as res:
        res.add("a", a)
        # a driver that skips the empty fixture instead of adding it
        res.add("out", out, sp.OUT)
        with pytest.raises(ArgumentError, match="expected 3 tensor arguments, have 2"):
            res.build_args(expected_count=3)
    with sp.ResidentTaskArgs(w) as res:
        res.add("a", a)
        res.add("e", e)  # recorded, stays host-staged
        res.add("out", out, sp.OUT)
        built = res.build_args(expected_count=3)
        assert built.names == ["a", "e", "out"] and built[1] is e
        report = w.run(c, built)
        assert report.counters["resident_tensors"] == 2 and report.counters["staged_tensors"] == 1


def test_build_args_runs_over_rounds_without_traffic(w):
    def axpy(x, acc, out, s):
        acc += s * x
        out[...] = acc

    k = sp.Kernel(axpy, [sp.IN, sp.INOUT, sp.OUT])
    c = sp.Callable(lambda o, x, acc, out, s: o.submit(k, x, acc, out, s), [sp.IN, sp.INOUT, sp.OUT])
    x = np.arange(4, dtype=np.float32)
    with sp.ResidentTaskArgs(w) as res:
        res.add("x", x)
        res.add("acc", np.zeros(4, dtype=np.float32), sp.INOUT)
        res.add("out", np.zeros(4, dtype=np.float32), sp.OUT)
        s0 = w.stats()
        args = res.build_args(expected_count=3, scalars=[sp.Scalar("s", 2.0)])
        assert args.names == ["x", "acc", "out", "s"]
        for _ in range(3):
            report = w.run(c, args)
            assert report.counters["resident_tensors"] == 3
            assert report.counters["staged_tensors"] == 0
        assert _delta(s0, w.stats()) == {
            "allocs": 0,
            "frees": 0,
            "h2d_calls": 0,
            "d2h_calls": 0,
            "live_allocations": 0,
        }
        dst = sp.TaskArgsBuilder(
            sp.TensorArg("x", np.zeros(4, dtype=np.float32)),
            sp.TensorArg("acc", np.zeros(4, dtype=np.float32)),
            sp.TensorArg("out", np.zeros(4, dtype=np.float32)),
        )
        res.copy_back(dst)  # default: every resident OUT/INOUT
        np.testing.assert_array_equal(dst.acc, 6 * x)
        np.testing.assert_array_equal(dst.out, 6 * x)
        np.testing.assert_array_equal(dst.x, 0)  # IN is not read back by default
        assert w.stats()["d2h_calls"] - s0["d2h_calls"] == 2
        res.copy_back(dst, ["x"])
        np.testing.assert_array_equal(dst.x, x)
        with pytest.raises(ArgumentError, match="destination is float64"):
            res.copy_back(sp.TaskArgsBuilder(sp.TensorArg("acc", np.zeros(4))), ["acc"])


def test_resident_tensor_mixes_with_staged_arguments(w):
    def add(a, b, out):
        out[...] = a + b

    k = sp.Kernel(add, [sp.IN, sp.IN, sp.OUT])
    c = sp.Callable(lambda o, a, b, out: o.submit(k, a, b, out), [sp.IN, sp.IN, sp.OUT])
    with sp.ResidentTaskArgs(w) as res:
        res.add("a", np.full(4, 3, dtype=np.int32))
        out = np.zeros(4, dtype=np.int32)
        report = w.run(c, [res["a"], np.ones(4, dtype=np.int32), out])
        assert report.counters["resident_tensors"] == 1 and report.counters["staged_tensors"] == 2
        np.testing.assert_array_equal(out, 4)
        with pytest.raises(StateError, match="owned by a ResidentTaskArgs"):
            w.free(res["a"].buffer)


def test_failed_upload_frees_what_the_add_allocated(w):
    with sp.ResidentTaskArgs(w) as res:
        res.add("a", np.zeros(4, dtype=np.float32))
        w.inject_fault("h2d", 1)
        with pytest.raises(DeviceError) as ei:
            res.add("b", np.zeros(4, dtype=np.float32))
        assert ei.value.op == "h2d"
        assert w.stats()["live_allocations"] == 1
        assert res.names == ["a"]
        res.add("b", np.zeros(4, dtype=np.float32))  # the name was not taken by the failed add
        w.inject_fault("alloc", 1)
        with pytest.raises(DeviceError):
            res.add("c", np.zeros(4, dtype=np.float32))
        assert w.stats()["live_allocations"] == 2
    assert w.stats()["live_allocations"] == 0


def test_release_is_lifo_and_idempotent(w):
    res = sp.ResidentTaskArgs(w)
    ptrs = [res.add(n, np.zeros(4, dtype=np.float32)).buffer.ptr for n in ("a", "b", "c")]
    res.release()
    frees = [addr for op, addr, _, code, _ in w.call_log() if op == "free"]
    assert frees[-3:] == ptrs[::-1]
    assert w.stats()["live_allocations"] == 0
    n_calls = len(w.call_log())
    res.release()
    res.release()
    assert len(w.call_log()) == n_calls and res.released
    for op in (lambda: res.add("d", np.zeros(1)), lambda: res.build_args(), lambda: res["a"]):
        with pytest.raises(StateError, match="released"):
            op()


def test_release_attempts_every_free_logs_each_failure_and_raises_the_first(w, caplog):
    res = sp.ResidentTaskArgs(w)
    ptrs = [res.add(n, np.zeros(4, dtype=np.float32)).buffer.ptr for n in ("a", "b", "c")]
    w.inject_fault("free", 1)  # the first free (of "c") fails
    w.inject_fault("free", 2)  # and the one after (of "b")
    with caplog.at_level(logging.ERROR), pytest.raises(DeviceError) as ei:
        res.release()
    assert "'c'" in str(ei.value) or ei.value.tensor == "c"
    attempted = [addr for op, addr, _, _, _ in w.call_log() if op == "free"]
    assert attempted[-3:] == ptrs[::-1], "every free must be attempted"
    assert sum("release of resident tensor" in r.getMessage() for r in caplog.records) >= 2
    res.release()  # idempotent, raises nothing the second time


def test_context_manager_releases_on_error_and_keeps_the_error(w):
    with pytest.raises(RuntimeError, match="boom"), sp.ResidentTaskArgs(w) as res:
        res.add("a", np.zeros(4, dtype=np.float32))
        raise RuntimeError("boom")
    assert res.released and w.stats()["live_allocations"] == 0


def test_from_builder_makes_child_memory_tensors_resident(w):
    c = sp.Callable(lambda o, *a: None, [sp.IN, sp.OUT, sp.INOUT])
    args = sp.TaskArgsBuilder(
        sp.TensorArg("x", np.ones(4, dtype=np.float32), child_memory=True),
        sp.TensorArg("y", np.ones(4, dtype=np.float32)),
        sp.TensorArg("z", np.ones(4, dtype=np.float32), child_memory=True),
        sp.Scalar("s", 1),
    )
    s0 = w.stats()
    with sp.ResidentTaskArgs.from_builder(w, args, c) as res:
        assert res.resident_names == ["x", "z"]
        assert res.direction("z") is sp.INOUT
        assert _delta(s0, w.stats())["h2d_calls"] == 2
        bound = res.bind(args)
        assert bound.names == ["x", "y", "z", "s"]
        assert isinstance(bound[0], sp.DeviceTensor) and bound[1] is args.y and bound[3] == 1
        w.run(c, bound)


def test_from_builder_checks_the_count_before_device_work(w):
    args = sp.TaskArgsBuilder(sp.TensorArg("x", np.ones(4), child_memory=True))
    s0 = w.stats()
    with pytest.raises(ArgumentError, match="from_builder: signature has 2 tensor arguments, got 1"):
        sp.ResidentTaskArgs.from_builder(w, args, [sp.IN, sp.IN])
    assert w.stats()["allocs"] == s0["allocs"]


@pytest.mark.parametrize("op", ["alloc", "h2d"])
def test_from_builder_rolls_back_a_partial_construction(w, op):
    args = sp.TaskArgsBuilder(
        *(sp.TensorArg(n, np.ones(64, dtype=np.float32), child_memory=True) for n in ("a", "b", "c"))
    )
    w.inject_fault(op, 2)
    with pytest.raises(DeviceError) as ei:
        sp.ResidentTaskArgs.from_builder(w, args, [sp.IN, sp.IN, sp.IN])
    assert ei.value.op == op
    assert w.stats()["live_allocations"] == 0


def test_a_fixture_with_an_invalid_geometry_allocates_nothing_and_keeps_its_name_free(w):
    res = sp.ResidentTaskArgs(w)
    with pytest.raises(sp.GeometryError, match="rank 9"):
        res.add("x", np.zeros((1,) * 9, np.float32))
    assert w.stats()["allocs"] == 0 and res.names == []
    res.add("x", np.zeros(4, np.float32))
    res.release()
    assert w.stats()["live_allocations"] == 0


def test_release_refused_during_a_run_leaves_the_set_usable(w):
    res = sp.ResidentTaskArgs(w)
    x = res.add("x", np.ones(4, np.float32))

    def orch(o, t):
        with pytest.raises(sp.StateError, match="bound to the run in progress"):
            res.release()
        assert not res.released

    w.run(sp.Callable(orch, [sp.IN]), [x])
    assert res["x"] is x
    res.release()
    assert res.released and w.stats()["live_allocations"] == 0


def test_an_add_whose_eager_view_fails_is_rolled_back():
    """The view of ``add(..., eager=True)`` cannot be established: the error is filed under the
    add (``resident_add``, as the call log has it), the allocation is freed and the name is free
    for a retry."""
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        w.inject_fault("map", 1)
        with pytest.raises(sp.DeviceError) as ei:
            res.add("q", np.ones(1024, np.float32), eager=True)
        assert ei.value.phase == "resident_add" and ei.value.op == "map"
        assert [c[4] for c in w.call_log() if c[0] == "map"] == ["resident_add"]
        assert res.names == [] and w.stats()["live_allocations"] == 0
        t = res.add("q", np.ones(1024, np.float32), eager=True)
        assert res.names == ["q"] and w.host_view_info(t) == "mapping"


def test_python_code_run_by_the_collector_during_an_add_may_use_the_set():
    """A finalizer that reads the set runs (through the garbage collector) while ``add`` works:
    the set's own lock is never held while Python code can run, so this completes. In a
    subprocess with a time limit: a deadlock shows as a timeout, not a hung suite."""
    code = """if True:
        import gc, numpy as np, simpler as sp
        w = sp.Worker("sim")
        res = sp.ResidentTaskArgs(w)
        seen = []
        class Finalized:
            def __del__(self):
                seen.append(list(res.names))
        res.add("a", np.ones(4, np.float32))
        x = np.ones(4, np.float32)
        f = Finalized(); f.cycle = f; del f
        gc.set_threshold(1)
        res.add("b", x)
        gc.set_threshold(700)
        gc.collect()
        assert seen and res.names == ["a", "b"], (seen, res.names)
        res.release(); w.close()
        print("ok")
    """
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_copy_back_names_and_build_args_scalars_take_what_the_python_set_took():
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        res.add("a", np.ones(4, np.float32), sp.OUT)
        res.add("b", np.ones(4, np.float32), "INOUT", eager=1)
        builder = sp.TaskArgsBuilder(
            sp.TensorArg("a", np.zeros(4, np.float32)), sp.TensorArg("b", np.zeros(4, np.float32))
        )
        res.copy_back(builder, {"a": 0, "b": 1}.keys())  # any iterable of names
        assert builder.b.tolist() == [1.0] * 4
        args = res.build_args(2, [sp.Scalar("n", 3), 2.5, "not a scalar"])
        assert args.names == ["a", "b", "n", "scalar1", "scalar2"] and args[2:] == [3, 2.5, "not a scalar"]
        assert repr(args) == "BuiltArgs(['a', 'b', 'n', 'scalar1', 'scalar2'])"
        assert sp.ArgDirection("OUT") is sp.OUT and res.direction("b") is sp.INOUT
