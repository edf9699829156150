"""Device groups: one worker process per device, residency in each of them (sim devices)."""

from __future__ import annotations

import gc
import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from _group_calls import hold_next, stamp, stamp_and_alloc
from _group_calls import make_acc as make_light_acc
from _signals import SignalsInTurn, interrupt_main_when, kill_when, marker_exists
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import simpler as sp
from simpler.group import DeviceGroup, DeviceGroupError, RemoteError
from simpler.group import _group as group_module

_NO_RAY = importlib.util.find_spec("ray") is None
_NEEDS_RAY = pytest.mark.skipif(_NO_RAY, reason="ray is not installed (requirements/ray.txt)")
BACKENDS = ["multiprocessing", pytest.param("ray", marks=_NEEDS_RAY)]


@pytest.fixture(scope="module", autouse=True)
def local_ray(request):
    """A local Ray for the tests on the ray backend: started once (2 CPUs, no dashboard) and shut
    down after the module's tests, so that its processes do not idle through the rest of the
    suite; nothing when no selected test of the module runs on ray (a ``backend`` parameter, or
    a class whose ``backend`` is ``"ray"``), or when a Ray is up already (someone else's, left
    running). Another test module uses it by importing it."""
    on_ray = any(
        item.module is request.module
        and (
            (getattr(item, "callspec", None) is not None and item.callspec.params.get("backend") == "ray")
            or getattr(item.cls, "backend", None) == "ray"
        )
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
        assert all(r.ok for r in reports)
        # No staging for resident tensors, on any device, in any round.
        assert [(r.counters["staged_bytes"], r.counters["device_mallocs"]) for r in reports] == [(0, 0)] * 2
        assert [r.counters["resident_tensors"] for r in reports] == [2, 2]
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


def test_a_run_returns_each_devices_report_itself(backend):
    x = np.ones(4, np.float32)
    with DeviceGroup("sim", devices=[0, 1], backend=backend, model="ascend-a3,h200") as g:
        reports = g.run(make_acc, [[x, np.zeros(4, np.float32)], [x, np.zeros(4, np.float32)]])
    assert [type(r) for r in reports] == [sp.RunReport, sp.RunReport]
    with sp.Worker("sim", model="ascend-a3,h200") as w:
        local = w.run(make_acc(), [x, np.zeros(4, np.float32)])
    for r in reports:
        # What the device's worker reported, whole: the runtime's figures, not ones re-derived.
        assert r.ok and r.callable == "acc" and list(r.modeled_by) == ["ascend-a3", "h200"]
        assert r.dispatch_ns == sum(v for k, v in r.phases.items() if k != "execute")
        assert r.modeled_round_ns == local.modeled_round_ns and r.kernels == local.kernels
        counts = {k: v for k, v in r.counters.items() if not k.endswith("_ns")}  # not the times
        assert counts == {k: v for k, v in local.counters.items() if not k.endswith("_ns")}


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


def test_a_library_error_of_a_device_crosses_as_itself_with_its_attributes(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        g.inject_fault(1, "alloc")
        with pytest.raises(sp.DeviceError) as ei:
            g.round(malloc_free)
        e = ei.value
        assert type(e) is sp.DeviceError and str(e).startswith("device 1 (round): ")
        # What the device's driver call said, not only its message.
        assert (e.op, e.call, e.nbytes, e.phase) == ("alloc", "sim_malloc", 64, "buffer")
        assert isinstance(e.code, int)
        assert any(n.startswith("raised in the process of device 1:") for n in e.__notes__)


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
    """The group shared-memory blocks of this process that exist now (a group names its blocks
    after the process that made them; another test run on the machine makes its own)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"simpler-{os.getpid()}-")}


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


# -- the edges of a group: threads, what cannot cross, forks, interrupts, exits -------------------


def echo(ctx, token, out=None, pause=0.0):
    """Writes ``token`` into ``out`` and returns it with the device, after ``pause`` seconds."""
    if pause:
        time.sleep(pause)
    if out is not None:
        out[...] = token
    return ctx.device, token


_CALLS = [0]


def count_calls(ctx, *args):
    """How many times this function ran in this device's process (a call never sent is not
    counted)."""
    _CALLS[0] += 1
    return _CALLS[0]


def _accounted(g, timeout=60.0):
    """Every process and shared-memory block the group started is accounted for: open, every
    process runs and only the current round's arrays and the mailbox exist; closed, every process
    has ended and no block is left."""
    res = g._resources()
    existing = [b for b in res["blocks"] if os.path.exists(f"/dev/shm/{b}")]
    if g.closed:
        _gone(res["pids"], timeout)
        assert existing == [], f"{g!r} left shared memory behind: {existing}"
    else:
        assert all(_running(p) for p in res["pids"]), f"a device process of {g!r} has ended"
        assert sorted(existing) == sorted(res["held"]), f"{g!r}: blocks {existing}, holding {res['held']}"


def _ended(pids, timeout=60.0):
    """Every process of ``pids`` has ended (a zombie has: its parent has not reaped it yet)."""
    end = time.monotonic() + timeout
    while any(_running(p) for p in pids):
        assert time.monotonic() < end, f"a process of {pids} is still running"
        time.sleep(0.01)


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_calls_from_several_threads_run_one_at_a_time_each_with_its_own_results(backend):
    errors = []
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:

        def caller(t):
            try:
                for r in range(8):
                    tokens = [t * 1000 + r * 10 + d for d in range(2)]
                    outs = [np.zeros(3, np.int64), np.zeros(3, np.int64)]
                    got = g.round(echo, [(tokens[d], outs[d], 0.002) for d in range(2)])
                    assert got == [(0, tokens[0]), (1, tokens[1])], f"thread {t} got another call's results"
                    assert [o.tolist() for o in outs] == [[tokens[0]] * 3, [tokens[1]] * 3]
            except BaseException as e:  # reported by the test's thread
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert not g.closed
        _accounted(g)
    _accounted(g)


def test_an_array_of_object_references_is_refused_by_name_before_anything_is_sent(backend):
    refs = np.array([object(), object()], dtype=object)
    fields = np.zeros(2, dtype=[("n", np.int32), ("o", object)])
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        first = g.round(count_calls)
        refused = r"device 0 \(round\): argument 1 is an array of dtype object"
        with pytest.raises(sp.ArgumentError, match=refused):
            g.round(count_calls, args=(np.ones(2), refs))
        with pytest.raises(sp.ArgumentError, match=r"device 1 \(round\): argument 0\['k'\]\[1\] .*dtype \["):
            g.round(count_calls, [((),), ({"k": [0, fields]},)])
        with pytest.raises(sp.ArgumentError, match=refused.replace("round", "run")):
            g.run(make_acc, args=[np.ones(4, np.float32), refs])
        rs = g.resident_set()
        with pytest.raises(sp.ArgumentError, match=r"device 0 \(add 'o'\): an array of dtype object"):
            rs.add("o", refs, sp.IN)
        assert not rs.released, "nothing was sent: the set stays"
        # No device process saw any of them.
        assert g.round(count_calls) == [c + 1 for c in first]
        _accounted(g)


def test_an_argument_that_cannot_be_pickled_fails_the_call_and_keeps_the_group(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        rs = g.resident_set()
        rs.add("acc", np.arange(4, dtype=np.float32), sp.INOUT)
        first = g.round(count_calls)
        lock = threading.Lock()
        with pytest.raises(sp.ArgumentError, match=r"device 1 \(round\): an argument cannot be sent.*lock"):
            g.round(count_calls, [(1,), (lock,)])
        if backend == "multiprocessing":  # Ray carries a lambda by value
            with pytest.raises(sp.ArgumentError, match=r"device 0 \(round\): an argument cannot be sent"):
                g.round(count_calls, args=(lambda: None,))
        assert not g.closed and not rs.released
        assert g.round(count_calls) == [c + 1 for c in first], "no device saw the call"
        np.testing.assert_array_equal(rs.gather("acc")[1], np.arange(4, dtype=np.float32))
        _accounted(g)


_FORKED = """
import os, sys
import numpy as np
import simpler as sp
from simpler.group import DeviceGroup
from simpler.group.examples import accumulate

if __name__ == "__main__":
    g = DeviceGroup("sim", devices=[0, 1])
    x = np.ones(2, np.float32)
    g.round(accumulate, args=(x,))
    pid = os.fork()
    if pid == 0:  # a helper: its copy of the group is inert, and it exits normally
        try:
            g.round(accumulate, args=(x,))
            print("helper: the round ran", flush=True)
        except sp.StateError as e:
            print("helper: refused:", e, flush=True)
        print("helper: close", g.close(), flush=True)
        del g
        sys.exit(0)  # the exit hooks run (multiprocessing's among them)
    _, status = os.waitpid(pid, 0)
    print("parent: helper exited", os.waitstatus_to_exitcode(status), flush=True)
    print("parent: round", g.round(accumulate, args=(x,)), flush=True)
    g.close()
"""


def _script(tmp_path, text, *args, timeout=120):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(text))
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def test_a_forked_childs_copy_of_a_group_is_inert_and_never_touches_the_parents_devices(tmp_path):
    out = _script(tmp_path, _FORKED)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("helper: refused:") and "forked" in line for line in lines), out.stdout
    assert "helper: close []" in lines
    assert "parent: helper exited 0" in lines
    assert "parent: round [2.0, 2.0]" in lines, out.stdout + out.stderr


def test_a_second_ctrl_c_while_the_children_stop_leaves_nothing_behind(backend, tmp_path, monkeypatch):
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    g.round(describe, args=(np.zeros(4),))  # a block of shared arrays in use
    marker = tmp_path / "in-round"
    stopping = threading.Event()
    kill = type(g._backend).kill

    def kill_slowly(self, index):
        # The first kill waits here for the second Ctrl+C: it lands half-way through the stop.
        if not stopping.is_set():
            stopping.set()
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(0.001)
        kill(self, index)

    monkeypatch.setattr(type(g._backend), "kill", kill_slowly)
    with SignalsInTurn(marker_exists(marker), stopping.is_set) as ctrl_c:
        with pytest.raises(KeyboardInterrupt):
            g.round(sleep_then, args=(60, str(marker)))
    assert (ctrl_c.sent, ctrl_c.delivered) == (2, 2)
    assert g.closed
    _accounted(g)
    assert g.close() == []


def test_close_finishes_a_stop_that_was_interrupted_more_than_it_outlasts(backend, tmp_path, monkeypatch):
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    g.round(describe, args=(np.zeros(4),))
    marker = tmp_path / "in-round"
    stopping = threading.Event()
    kill = type(g._backend).kill

    def kill_slowly(self, index):
        if not stopping.is_set():
            stopping.set()
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(0.001)
        kill(self, index)

    monkeypatch.setattr(type(g._backend), "kill", kill_slowly)
    monkeypatch.setattr(group_module, "_STOP_ATTEMPTS", 1)
    with SignalsInTurn(marker_exists(marker), stopping.is_set) as ctrl_c:
        with pytest.raises(KeyboardInterrupt):
            g.round(sleep_then, args=(60, str(marker)))
    assert ctrl_c.delivered == 2
    assert g.closed and g._stop_pending, "the stop was left half-way"
    assert g.close() == []
    assert not g._stop_pending
    _accounted(g)


_ORPHANED = """
import sys, time
from pathlib import Path

def busy(ctx, marker):
    Path(f"{marker}.{ctx.index}").touch()
    time.sleep(600)  # what the device is doing when its parent dies

if __name__ == "__main__":
    from simpler.group import DeviceGroup
    g = DeviceGroup("sim", devices=[0, 1])
    print(" ".join(str(p) for p in g.pids), flush=True)
    g.round(busy, args=(sys.argv[1],))
"""


def test_device_processes_end_within_seconds_of_their_parents_death(tmp_path):
    script = tmp_path / "orphaned.py"
    script.write_text(textwrap.dedent(_ORPHANED))
    marker = tmp_path / "busy"
    parent = subprocess.Popen(
        [sys.executable, str(script), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pids = []
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        end = time.monotonic() + 120
        while not all(Path(f"{marker}.{i}").exists() for i in range(2)):
            assert time.monotonic() < end and parent.poll() is None, "the round never started"
            time.sleep(0.01)
        parent.kill()  # SIGKILL: no exit hook, no close
        parent.wait()
        end = time.monotonic() + 30  # "within seconds", with room for a loaded machine
        while any(_running(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(_running(p) for p in pids), "a device process outlived its parent by 30 s"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        for p in pids:  # what a failure would leave behind
            if _running(p):
                os.kill(p, signal.SIGKILL)


_LEFT_OPEN = """
import atexit
import numpy as np
import simpler as sp
from simpler.group import DeviceGroup
from simpler.group.examples import accumulate

def after():  # registered before the group's exit hook: runs after it
    codes = [c.proc.exitcode for c in g._backend.children]
    print("at exit: closed", g.closed, "exit codes", codes, flush=True)

if __name__ == "__main__":
    atexit.register(after)
    g = DeviceGroup("sim", devices=[0, 1])
    rs = g.resident_set()
    rs.add("w", np.ones(4, np.float32), sp.IN)
    g.round(accumulate, args=(np.ones(2, np.float32),))
    print("end of script", flush=True)
"""


def test_a_group_left_open_at_exit_warns_and_closes_in_order_without_a_traceback(tmp_path):
    out = _script(tmp_path, _LEFT_OPEN)
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed DeviceGroup('sim', devices=[0, 1]" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    # Closed by the group's hook, before multiprocessing's: the children released everything
    # and exited by themselves (status 0), none was terminated.
    assert "at exit: closed True exit codes [0, 0]" in out.stdout.splitlines(), out.stdout


_BUSY_AT_EXIT = """
import sys, threading, time
from pathlib import Path
from simpler.group import DeviceGroup
from simpler.group import _group

def busy(ctx, marker):
    Path(marker).touch()
    time.sleep(600)

if __name__ == "__main__":
    _group._CLOSE_TIMEOUT_S = 1.0  # how long the exit hook waits for the call in progress
    g = DeviceGroup("sim", devices=[0, 1])
    threading.Thread(target=g.round, args=(busy,), kwargs={"args": (sys.argv[1],)}, daemon=True).start()
    while not Path(sys.argv[1]).exists():
        time.sleep(0.01)
    print("end of script", g.pids, flush=True)
"""


def test_a_group_busy_in_a_daemon_thread_at_exit_is_killed_not_waited_for(tmp_path):
    marker = tmp_path / "busy"
    out = _script(tmp_path, _BUSY_AT_EXIT, str(marker), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "was still in a call at exit: its device processes are killed" in out.stderr, out.stderr
    pids = [int(p) for p in out.stdout.split("[", 1)[1].split("]")[0].split(",")]
    _ended(pids, timeout=60)


@pytest.mark.parametrize("platform", ["sim", "cuda", "ascend"])
def test_device_id_is_refused_the_devices_name_each_processs_device(platform):
    with pytest.raises(sp.ArgumentError, match=r"device_id=0 is not an option of a group.*devices=\[0, 1\]"):
        DeviceGroup(platform, devices=[0, 1], device_id=0)


def test_a_0d_array_crosses_as_it_is_and_a_0d_resident_tensor_gathers_0d(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        got = g.round(describe, args=(np.array(2.5, np.float32),))
        assert [d[0][:3] for d in got] == [("<f4", (), 2.5)] * 2
        outs = [np.array(0, np.int64), np.array(0, np.int64)]
        g.round(echo, [(7, outs[0]), (8, outs[1])])
        assert [(o.shape, int(o)) for o in outs] == [((), 7), ((), 8)]
        rs = g.resident_set()
        rs.add("z", np.array(1.5, np.float32), sp.INOUT)
        assert [(z.shape, float(z)) for z in rs.gather("z")] == [((), 1.5)] * 2


def test_inject_fault_on_a_dead_device_closes_the_group_like_every_other_call(backend):
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    g.round(describe, args=(np.zeros(4),))
    os.kill(g.pids[1], signal.SIGKILL)
    _ended([g.pids[1]])
    with pytest.raises(DeviceGroupError, match=r"device 1 \(process \d+\) died during inject_fault") as ei:
        g.inject_fault(1, "alloc")
    assert (ei.value.device, ei.value.phase) == (1, "inject_fault")
    assert g.closed
    _accounted(g)


def test_a_zero_byte_resident_tensor_gathers_as_the_empty_array(backend):
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        rs = g.resident_set()
        rs.add("e", np.zeros((0, 3), np.float32), sp.INOUT)
        rs.add("x", np.arange(4, dtype=np.float32), sp.IN)
        got = rs.gather("e")
        assert [(a.shape, a.dtype) for a in got] == [((0, 3), np.float32)] * 2
        assert g.round(count_calls)  # the set and the group stay usable
        np.testing.assert_array_equal(rs.gather("x")[0], np.arange(4, dtype=np.float32))


def test_a_message_or_answer_larger_than_the_mailbox_crosses_whole(backend):
    from simpler.group._mp import SLOT_BYTES

    big = list(range(SLOT_BYTES // 2))  # not an array: pickled, several slots' worth
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        assert g.round(echo, args=(big,)) == [(0, big), (1, big)]
        rs = g.resident_set()
        w = np.arange(1 << 18, dtype=np.float32)  # a 1 MiB answer per device
        rs.add("w", w, sp.IN)
        for part in rs.gather("w"):
            np.testing.assert_array_equal(part, w)
        assert g.round(count_calls)


# -- what a round gives back ---------------------------------------------------------------------


def write_then_fail(ctx, out):
    out[...] = 7.0
    if ctx.index == 1:
        raise RuntimeError("device 1 fails after device 0 wrote its output")


def test_a_round_where_one_device_raises_leaves_every_callers_array_unchanged(backend):
    outs = [np.zeros(4, np.float32), np.zeros(4, np.float32)]
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        with pytest.raises(RemoteError, match=r"device 1 \(round\): device 1 fails"):
            g.round(write_then_fail, [(outs[0],), (outs[1],)])
        assert [o.tolist() for o in outs] == [[0.0] * 4] * 2, "a failed round copied something back"


_RELEASES = "releases.log"


def spy_on_releases(ctx, path):
    """From now on, this device's process logs each resident set it releases and the names its
    frees belonged to, in order, into ``path``."""
    from simpler.group._host import DeviceHost

    real = DeviceHost.release_set
    if getattr(real, "spied", False):
        return

    def release_set(self, set_id):
        held = self.sets.get(set_id)
        names = {}
        if held is not None:
            for n in held[1].names:
                names[held[1][n].buffer.ptr] = n
        mark = len(self.worker.call_log())
        real(self, set_id)
        freed = [names.get(c[1], hex(c[1])) for c in self.worker.call_log()[mark:] if c[0] == "free"]
        with open(path, "a") as f:
            f.write(f"{self.device} {set_id} {' '.join(freed)}\n")

    release_set.spied = True
    DeviceHost.release_set = release_set


def test_close_releases_resident_sets_newest_first_each_last_in_first_out(backend, tmp_path):
    log = tmp_path / _RELEASES
    g = DeviceGroup("sim", devices=[0, 1], backend=backend)
    g.round(spy_on_releases, args=(str(log),))
    for k in range(3):
        rs = g.resident_set()
        for name in ("a", "b", "c"):
            rs.add(f"{name}{k}", np.zeros(4, np.float32), sp.INOUT)
    g.close()
    lines = log.read_text().splitlines()
    for d in (0, 1):
        mine = [line.split()[1:] for line in lines if line.split()[0] == str(d)]
        # Set ids 3, 2, 1 (the newest first), each freeing c, b, a (the last added first).
        assert mine == [[str(k + 1), f"c{k}", f"b{k}", f"a{k}"] for k in (2, 1, 0)], mine


_QUIET_NAN, _OTHER_NAN = 0x7FF8000000000001, 0x7FF8000000000123


def write_bits(ctx, *outs):
    """Writes ``-0.0`` into the first array, a NaN with another payload into the second and
    the third."""
    for out, bits in zip(outs, (0x8000000000000000, _OTHER_NAN, _OTHER_NAN)):
        out.view(np.uint64)[...] = bits


def test_negative_zero_and_nan_payloads_written_over_the_callers_come_back_bit_identical(backend):
    # -0.0 over 0.0 (equal as values), a NaN over a NaN of another payload (equal as NaNs), a
    # NaN over 0.0: each array by itself, so that none is written back for another's sake.
    def fresh():
        return [np.zeros(2), np.full(2, _QUIET_NAN, np.uint64).view(np.float64), np.zeros(2)]

    outs = [fresh(), fresh()]
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        g.round(write_bits, outs)
    for dev in outs:
        assert [o.view(np.uint64).tolist() for o in dev] == [
            [0x8000000000000000] * 2,
            [_OTHER_NAN] * 2,
            [_OTHER_NAN] * 2,
        ]


def big_array(ctx, n):
    return np.full(n, ctx.index, np.float32)


def test_returned_and_gathered_arrays_are_writable_copies(backend):
    n = 1 << 18  # 1 MiB: Ray returns it from its object store
    with DeviceGroup("sim", devices=[0, 1], backend=backend) as g:
        got = g.round(big_array, args=(n,))
        rs = g.resident_set()
        rs.add("w", np.arange(n, dtype=np.float32), sp.IN)
        gathered = rs.gather("w")
    for arr in [*got, *gathered]:
        assert arr.flags.writeable
        arr[0] = 42.0  # the caller owns it
    assert not np.shares_memory(got[0], got[1]) and not np.shares_memory(gathered[0], gathered[1])


# -- a state machine over a group, on both backends -------------------------------------------
#
# A hypothesis state machine over a device group of two sim devices, on both backends.
#
# Random sequences of rounds (each device given a token and an output array of its own), rounds
# from several threads at once, resident adds (replicated or stacked), gathers, runs that evolve a
# resident tensor, set releases, injected faults, device processes killed (between calls, or in
# the middle of a round, an add, a gather, a release or a close), Ctrl+C at the same points (and a
# second one while the group stops its children, during the kill of either device), closes and
# reopens. A model holds every resident tensor's contents. After every step, for every group the
# example opened:
#
# * open: every device process it started runs, and the shared-memory blocks that exist are
#   exactly those it holds (its mailbox and its current block of arrays);
# * closed: every device process it started has ended and none of its blocks exists;
#
# and every result, output array and gathered tensor is the one of its own call (tokens are never
# reused). Example and step counts are a small share of the hypothesis profile's
# (tests/conftest.py): this machine starts device processes at every open.


#: The calls a device can be caught in the middle of.
POINTS = ["call", "add", "read", "release_set", "close"]


class GroupMachine(RuleBasedStateMachine):
    """See the module docs; ``backend`` is set by the subclasses below."""

    backend = "multiprocessing"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="group-machine-"))
        self.markers = itertools.count()
        self.tokens = itertools.count(1, 10)
        self.groups: list[DeviceGroup] = []
        self.g: DeviceGroup | None = None
        self._open()

    # -- the model -----------------------------------------------------------------------------

    def _open(self) -> None:
        self.g = DeviceGroup("sim", devices=[0, 1], backend=self.backend)
        self.groups.append(self.g)
        #: Open resident sets: (set, {name: [device 0's contents, device 1's]}), oldest first.
        self.sets: list[tuple[sp.GroupResidentSet, dict[str, list[np.ndarray]]]] = []

    def _closed(self) -> None:
        """The group was closed (by a death, an interruption or ``close``): it refuses calls, and
        the next step has a new group (the invariant keeps accounting for the closed one)."""
        assert self.g is not None and self.g.closed
        with pytest.raises(sp.StateError, match="closed"):
            self.g.round(stamp, args=(0, np.zeros(1)))
        self._open()

    def _marker(self) -> Path:
        return self.tmp / f"m{next(self.markers)}"

    def _token(self) -> int:
        return next(self.tokens)

    def teardown(self) -> None:
        try:
            for g in self.groups:
                g.close()
            for g in self.groups:
                _accounted(g)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @invariant()
    def everything_is_accounted_for(self) -> None:
        for g in self.groups:
            # (A process left running fails here after 30 s; hypothesis pays that again for
            # each example it tries while shrinking a failure.)
            _accounted(g, timeout=30.0)

    # -- rules ---------------------------------------------------------------------------------

    def _round(self, fn) -> list[np.ndarray]:
        token = self._token()
        outs = [np.zeros(3, np.int64), np.zeros(3, np.int64)]
        got = self.g.round(fn, [(token, outs[0]), (token, outs[1])])
        assert got == [(0, token), (1, token + 1)], f"results of another call: {got} for token {token}"
        assert [o.tolist() for o in outs] == [[token] * 3, [token + 1] * 3]
        return outs

    @rule()
    def round(self) -> None:
        self._round(stamp)

    @rule(threads=st.integers(2, 3))
    def rounds_from_threads(self, threads: int) -> None:
        event("rounds from threads")
        errors: list[BaseException] = []

        def caller() -> None:
            try:
                for _ in range(3):
                    self._round(stamp)
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=caller) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []

    @rule(new_set=st.booleans(), stacked=st.booleans(), rows=st.integers(2, 5), seed=st.integers(0, 2**16))
    def add(self, new_set: bool, stacked: bool, rows: int, seed: int) -> None:
        if new_set or not self.sets:
            self.sets.append((self.g.resident_set(), {}))
        rs, model = self.sets[-1]
        name = f"t{len(model)}"
        value = np.random.default_rng(seed).integers(-100, 100, (rows, 2)).astype(np.float32)
        rs.add(name, value, sp.INOUT, layout="stacked" if stacked else "replicated")
        model[name] = list(np.array_split(value, 2)) if stacked else [value.copy(), value.copy()]

    def _some_tensor(self, pick: int) -> tuple[sp.GroupResidentSet, dict, str] | None:
        tensors = [(rs, m, n) for rs, m in self.sets for n in m]
        return tensors[pick % len(tensors)] if tensors else None

    @rule(pick=st.integers(0, 100))
    def gather(self, pick: int) -> None:
        found = self._some_tensor(pick)
        if found is None:
            return
        rs, model, name = found
        got = rs.gather(name)
        parts = np.array_split(got, [len(model[name][0])]) if isinstance(got, np.ndarray) else got
        for part, want in zip(parts, model[name]):
            np.testing.assert_array_equal(part, want)

    @rule(pick=st.integers(0, 100))
    def run_evolves_a_resident_tensor(self, pick: int) -> None:
        found = self._some_tensor(pick)
        if found is None:
            return
        rs, model, name = found
        ws = [np.full(m.shape, self._token(), np.float32) for m in model[name]]
        reports = self.g.run(make_light_acc, [[ws[i], rs[name][i]] for i in range(2)])
        assert all(r.ok for r in reports)
        for i in range(2):
            model[name][i] = model[name][i] + ws[i]

    @rule(pick=st.integers(0, 100))
    def release(self, pick: int) -> None:
        if not self.sets:
            return
        rs, _ = self.sets.pop(pick % len(self.sets))
        rs.release()

    @rule(device=st.integers(0, 1))
    def injected_fault(self, device: int) -> None:
        event("fault injected")
        self.g.inject_fault(device, "alloc")
        outs = [np.zeros(3, np.int64), np.zeros(3, np.int64)]
        with pytest.raises(sp.DeviceError, match=rf"device {device} \(round\)"):
            self.g.round(stamp_and_alloc, [(self._token(), outs[0]), (self._token(), outs[1])])
        assert [o.tolist() for o in outs] == [[0] * 3] * 2, "a failed round copied something back"
        self._round(stamp_and_alloc)  # the fault was spent; the group stays usable

    @rule(device=st.integers(0, 1))
    def device_dies_between_calls(self, device: int) -> None:
        event("device killed between calls")
        pid = self.g.pids[device]
        os.kill(pid, 9)
        _ended([pid])
        with pytest.raises(DeviceGroupError, match=rf"device {device} \(process {pid}\) died during round"):
            self._round(stamp)
        self._closed()

    def _trigger(self, point: str, pick: int) -> None:
        """A call that reaches ``point`` on every device."""
        g = self.g
        if point == "call":
            self._round(stamp)
        elif point == "add":
            g.resident_set().add("held", np.zeros(4, np.float32), sp.IN)
        elif point == "read":
            found = self._some_tensor(pick)
            rs = found[0] if found else g.resident_set()
            if not found:
                rs.add("x", np.zeros(4, np.float32), sp.IN)
            rs.gather(found[2] if found else "x")
        elif point == "release_set":
            (g.resident_set() if not self.sets else self.sets[pick % len(self.sets)][0]).release()
        else:
            g.close()

    @rule(point=st.sampled_from(POINTS), device=st.integers(0, 1), pick=st.integers(0, 100))
    def device_dies_in_a_call(self, point: str, device: int, pick: int) -> None:
        event(f"device killed in {point}")
        marker = self._marker()
        self.g.round(hold_next, args=(device, point, str(marker)))
        pid = self.g.pids[device]
        with kill_when(pid, marker_exists(marker)) as kill:
            with pytest.raises(DeviceGroupError, match=rf"device {device} \(process {pid}\) died during"):
                self._trigger(point, pick)
        assert kill.sent
        self._closed()

    @rule(
        point=st.sampled_from(POINTS),
        device=st.integers(0, 1),
        again=st.sampled_from([None, 0, 1]),
        pick=st.integers(0, 100),
    )
    def ctrl_c_in_a_call(self, point: str, device: int, again: int | None, pick: int) -> None:
        """Ctrl+C while ``device`` is in ``point``; with ``again``, a second one while the group
        kills that device."""
        event(f"Ctrl+C in {point}" + (" and while stopping" if again is not None else ""))
        marker = self._marker()
        self.g.round(hold_next, args=(device, point, str(marker)))
        readies = [marker_exists(marker)]
        if again is not None:
            b = self.g._backend
            stopping = threading.Event()
            real_kill = b.kill

            def kill(index: int) -> None:
                if index == again and not stopping.is_set():
                    stopping.set()  # the second Ctrl+C lands here
                    end = time.monotonic() + 60
                    while time.monotonic() < end:
                        time.sleep(0.001)
                real_kill(index)

            b.kill = kill
            readies.append(stopping.is_set)
        with SignalsInTurn(*readies) as ctrl_c:
            with pytest.raises(KeyboardInterrupt):
                self._trigger(point, pick)
        assert ctrl_c.delivered == len(readies)
        self._closed()

    # (An argument, so that hypothesis, which orders rules by their argument count and draws the
    # first one more often, does not favour this rule, which ends a group.)
    @rule(release_first=st.booleans())
    def close(self, release_first: bool) -> None:
        if release_first:
            for rs, _ in reversed(self.sets):
                rs.release()
        summaries = self.g.close()
        assert [s["errors"] for s in summaries] == [[], []]
        self._closed()


class MultiprocessingGroupMachine(GroupMachine):
    backend = "multiprocessing"


class RayGroupMachine(GroupMachine):
    backend = "ray"


#: A small share of the profile's counts: every open starts device processes (Ray's are slower).
_SCALE = settings.default.max_examples / 100
_STEPS = settings.default.stateful_step_count

TestMultiprocessingGroup = MultiprocessingGroupMachine.TestCase
TestMultiprocessingGroup.settings = settings(
    settings.default, max_examples=max(1, round(8 * _SCALE)), stateful_step_count=max(4, _STEPS // 5)
)
TestRayGroup = pytest.mark.skipif(_NO_RAY, reason="ray is not installed (requirements/ray.txt)")(
    RayGroupMachine.TestCase
)
TestRayGroup.settings = settings(
    settings.default, max_examples=max(1, round(2 * _SCALE)), stateful_step_count=max(4, _STEPS // 8)
)
TestRayGroup.backend = "ray"  # the local_ray fixture starts a Ray for the classes that say so
