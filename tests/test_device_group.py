"""Device groups: one worker process per device, residency in each of them (sim devices)."""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest
from _signals import interrupt_main_when, kill_when, marker_exists

import simpler as sp
from simpler.group import DeviceGroup, DeviceGroupError

_NO_RAY = importlib.util.find_spec("ray") is None
_NEEDS_RAY = pytest.mark.skipif(_NO_RAY, reason="ray is not installed (requirements/ray.txt)")
BACKENDS = ["multiprocessing", pytest.param("ray", marks=_NEEDS_RAY)]


@pytest.fixture(scope="module", autouse=True)
def local_ray(request):
    """A local Ray for the tests on the ray backend: started once (2 CPUs, no dashboard) and shut
    down after this module's tests, so that its processes do not idle through the rest of the
    suite; nothing when no selected test runs on ray, or when a Ray is up already (someone
    else's, left running)."""
    on_ray = any(
        getattr(item, "callspec", None) is not None and item.callspec.params.get("backend") == "ray"
        for item in request.session.items
    )
    if _NO_RAY or not on_ray:
        yield None
        return
    import ray

    if ray.is_initialized():
        yield ray
        return
    # Ray's notice about accelerator variables, and the files and processes its start and
    # shutdown leave to the garbage collector.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
        gc.collect()
    try:
        yield ray
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            ray.shutdown()
            gc.collect()


# -- what the children run (module-level: a spawned child imports this module) ----------------


def whoami(ctx, x):
    return ctx.device, ctx.index, float(x.sum()), os.getpid()


def scale(ctx, x, out, a):
    out[...] = x * a


def sleep_then(ctx, seconds, marker=None):
    """Device 1 sleeps ``seconds``; it first creates the file ``marker`` (when given), so a test
    knows the round is in progress there."""
    if ctx.index == 1:
        if marker is not None:
            open(marker, "x").close()
        time.sleep(seconds)
    return ctx.device


def malloc_free(ctx):
    ctx.worker.free(ctx.worker.malloc(64))
    return ctx.device


def frees(ctx):
    return [c[1] for c in ctx.worker.call_log() if c[0] == "free" and c[3] == 0]


def make_acc():
    k = sp.Kernel(lambda w, acc: np.add(acc, w, out=acc), [sp.IN, sp.INOUT], name="acc")
    return sp.Callable(lambda o, w, acc: o.submit(k, w, acc), [sp.IN, sp.INOUT], name="acc")


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_a_round_runs_on_every_device_with_its_arguments_and_arrays_are_shared_once(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        x = np.arange(1 << 18, dtype=np.float32)  # 1 MiB, given to both devices
        got = g.round(whoami, args=(x,))
        assert [r[:3] for r in got] == [(0, 0, float(x.sum())), (1, 1, float(x.sum()))]
        assert len({r[3] for r in got}) == 2 and os.getpid() not in {r[3] for r in got}
        assert g.shared_bytes == x.nbytes, "placed once, not once per device"
        outs = [np.zeros(4, np.float32), np.zeros(4, np.float32)]
        g.round(scale, [(x[:4], outs[0], 2.0), (x[4:8], outs[1], 3.0)])
        np.testing.assert_array_equal(outs[0], x[:4] * 2)
        np.testing.assert_array_equal(outs[1], x[4:8] * 3)


def test_stacked_and_replicated_residency_evolve_over_rounds_and_release_lifo(backend):
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    with DeviceGroup("sim", devices=[3, 5], backend=backend) as g:
        rs = g.resident_set()
        rs.add("w", w, sp.IN, layout="stacked")
        rs.add("acc", np.zeros((2, 2), np.float32), sp.INOUT)
        for _ in range(3):
            reports = g.run(make_acc, rs.build_args())
        assert all(r["ok"] for r in reports)
        # No staging for resident tensors, on any device, in any round.
        assert [(r["counters"]["staged_bytes"], r["counters"]["device_mallocs"]) for r in reports] == [
            (0, 0)
        ] * 2
        assert [r["counters"]["resident_tensors"] for r in reports] == [2, 2]
        np.testing.assert_array_equal(rs.gather("w"), w)
        acc = rs.gather("acc")
        np.testing.assert_array_equal(acc[0], 3 * w[:2])
        np.testing.assert_array_equal(acc[1], 3 * w[2:])
        before = g.round(frees)
        rs.release()
        freed = [after[len(b) :] for b, after in zip(before, g.round(frees))]
        for dev_frees in freed:
            assert len(dev_frees) == 2  # acc first, then w: last in, first out
        with pytest.raises(sp.StateError, match="released"):
            g.run(make_acc, rs.build_args())


def test_a_handle_on_the_wrong_device_is_refused(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        rs = g.resident_set()
        h = rs.add("acc", np.zeros(4, np.float32), sp.INOUT)
        w = np.ones(4, np.float32)
        with pytest.raises(sp.ArgumentError, match="lives on device 1; it was used on device 0"):
            g.run(make_acc, [[w, h[1]], [w, h[1]]])
        g.run(make_acc, [[w, h[0]], [w, h[1]]])  # the group stays usable


def test_an_add_that_fails_on_one_device_releases_the_set_everywhere(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend, capacity=1 << 20) as g:
        rs = g.resident_set()
        rs.add("small", np.zeros(16, np.float32), sp.IN)
        with pytest.raises(sp.DeviceError, match=r"device 1 \(add 'big'\)"):
            rs.add("big", [np.zeros(16, np.float32), np.zeros(1 << 20, np.float32)], sp.IN)
        assert rs.released
        assert [s["live_allocations"] for s in g.stats()] == [0, 0]


def test_fault_injection_reaches_through_the_group(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        g.inject_fault(1, "alloc")
        with pytest.raises(sp.DeviceError, match=r"device 1 \(round\)"):
            g.round(malloc_free)
        assert g.round(malloc_free) == [0, 1]


def test_a_child_killed_in_the_middle_of_a_round_is_named_and_the_group_closes(backend, tmp_path):
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    victim = g.pids[1]
    marker = tmp_path / "in-round"
    # Killed once it is inside the round (never after the test: the kill is cancelled then).
    with kill_when(victim, marker_exists(marker)) as kill:
        with pytest.raises(DeviceGroupError, match=r"device 1 \(process \d+\) died during round") as ei:
            g.round(sleep_then, args=(60, str(marker)))
    assert kill.sent
    assert (ei.value.device, ei.value.phase) == (1, "round")
    assert g.closed
    _gone(g.pids)
    assert g.close() == [], "closing a closed group does nothing"
    with pytest.raises(sp.StateError, match="closed"):
        g.round(malloc_free)


def test_ctrl_c_during_a_round_stops_every_child(backend, tmp_path):
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    marker = tmp_path / "in-round"
    # Ctrl+C: SIGINT to the main thread, which waits for the children, once device 1 is inside
    # the round; the block never lets it land outside this test.
    with interrupt_main_when(marker_exists(marker)) as ctrl_c:
        with pytest.raises(KeyboardInterrupt):
            g.round(sleep_then, args=(60, str(marker)))
    assert ctrl_c.sent and ctrl_c.interrupted
    assert g.closed
    _gone(g.pids)


def test_bad_groups_are_refused_before_anything_starts():
    for devices, match in (([], "non-empty"), ([0, 0], "twice"), ([-1], "device ids")):
        with pytest.raises(sp.ArgumentError, match=match):
            DeviceGroup("sim", devices=devices)
    with pytest.raises(sp.ArgumentError, match="backend"):
        DeviceGroup("sim", backend="threads")


def _gone(pids, timeout=60.0):
    """Every process of ``pids`` has ended and was reaped by whoever started it (the group for
    its own children; never reaped here, so a child the group forgot to join shows)."""
    end = time.monotonic() + timeout
    for pid in pids:
        while os.path.exists(f"/proc/{pid}"):
            assert time.monotonic() < end, f"process {pid} is still there (running, or a zombie)"
            time.sleep(0.05)


def _blocks() -> set[str]:
    """The group shared-memory blocks that exist now."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("simpler-")}


# -- more of what the children run --------------------------------------------------------------


def describe(ctx, *arrays):
    return [(a.dtype.str, a.shape, a.tolist(), a.flags.writeable) for a in arrays]


def unpicklable(ctx):
    return threading.Lock()  # pickles with neither pickle nor Ray's cloudpickle


def write(ctx, out, value):
    out[...] = value


def test_arrays_keep_byte_order_dtype_and_emptiness_through_a_round(backend):
    import ml_dtypes

    arrays = [
        np.arange(3, dtype=">f4"),
        np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
        np.zeros(0, np.int32),
        np.arange(6, dtype=np.int16).reshape(2, 3)[:, ::2],  # not contiguous
    ]
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        got = g.round(describe, args=tuple(arrays))
    for dev in got:
        assert [(d, s, v) for d, s, v, _ in dev] == [(a.dtype.str, a.shape, a.tolist()) for a in arrays]
        # Given to both devices: read-only there.
        assert [w for *_, w in dev] == [False] * 4


def test_an_array_given_to_several_devices_cannot_be_written_by_them(backend):
    out = np.zeros(4, np.float32)
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        with pytest.raises(ValueError, match=r"device 0 \(round\).*read-only"):
            g.round(write, [(out, 1.0), (out, 2.0)])
        np.testing.assert_array_equal(out, 0, err_msg="a failed round copies nothing back")
        outs = [np.zeros(4, np.float32), np.zeros(4, np.float32)]
        g.round(write, [(outs[0], 1.0), (outs[1], 2.0)])
        assert [o.tolist() for o in outs] == [[1.0] * 4, [2.0] * 4]


def test_an_answer_that_cannot_cross_is_an_error_and_the_group_stays_usable(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        with pytest.raises((TypeError, sp.SimplerError), match="device 0"):
            g.round(unpicklable)
        assert g.round(malloc_free) == [0, 1]


def test_a_handle_of_another_group_is_refused(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g1:
        old = g1.resident_set().add("acc", np.zeros(4, np.float32), sp.INOUT)
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g2:
        g2.resident_set().add("acc", np.zeros(4, np.float32), sp.INOUT)
        w = np.ones(4, np.float32)
        with pytest.raises(sp.StateError, match="released"):
            g2.run(make_acc, [[w, old[0]], [w, old[1]]])


def test_a_child_dead_between_rounds_is_named_and_nothing_is_left_behind(backend):
    before = _blocks()
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    g.round(whoami, args=(np.ones(4, np.float32),))
    os.kill(g.pids[0], signal.SIGKILL)
    _gone([g.pids[0]]) if backend == "ray" else time.sleep(0.2)
    with pytest.raises(DeviceGroupError, match=r"device 0 \(process \d+\) died during round"):
        g.round(malloc_free)
    assert g.closed
    assert g.close() == []
    _gone(g.pids)
    assert _blocks() <= before, "the round's shared memory was unlinked"
