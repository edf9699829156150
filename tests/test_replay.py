"""Warm rounds reuse the launch plan of an earlier round that recorded exactly the same tasks,
on cuda against the fake libcuda: a reused plan gives exactly the launches (rows, grids) and
results of a planned one; a round that differs in one task, one scalar, one view offset, one
kernel or one buffer (freed and allocated again at the same address) is planned again, never
replayed; the worker keeps a bounded number of plans; a failed row upload keeps no plan."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import simpler as sp
from simpler.testing import fake_cuda

F32 = np.dtype(np.float32)

#: y[i] += alpha * x[i] over each task's view of n elements.
SOURCE = r"""
struct rp_row { const float* x; float* y; double alpha; long long n; };
extern "C" __global__ void t_rp_saxpy(const rp_row* rows) {
    const rp_row r = rows[blockIdx.z];
    for (long long i = threadIdx.x; i < r.n; i += blockDim.x) r.y[i] += (float)r.alpha * r.x[i];
}
"""

#: Every launch as the fake saw it: (grid, rows).
SEEN: list[tuple[tuple[int, ...], np.ndarray]] = []


@fake_cuda.host_impl("t_rp_saxpy")
def _saxpy(launch: fake_cuda.Launch) -> None:
    rows = launch.rows(4)
    SEEN.append((tuple(launch.grid), rows.copy()))
    for x, y, alpha, n in rows:
        n = launch.i64(n)
        dst = launch.array(int(y), (n,), F32)
        dst += np.float32(launch.f64(alpha)) * launch.array(int(x), (n,), F32)


def _saxpy_fn(x, y, alpha):
    y += np.float32(alpha) * x


def _kernel(name: str = "rp_saxpy") -> sp.Kernel:
    code = sp.CudaCode(
        SOURCE,
        entry="t_rp_saxpy",
        launch=lambda xs, ys: sp.Launch(grid=1, block=64, consts=(int(np.prod(xs)),)),
        scalars=("float64",),
    )
    return sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], name=name, cuda=code)


K = _kernel()


@pytest.fixture
def cuda(fake_vendor):
    SEEN.clear()
    with fake_vendor.worker("cuda", poison=False) as w:
        yield w


def _orch(rows: int = 4, alphas=None, shift: int = 0, kernel: sp.Kernel = K):
    """Per row i of x and y ([rows, 8] float32): y[i] += alpha_i * x[i + shift] (a batch of
    independent tasks), then one task over the whole of y (a second batch, a chain on y)."""
    alphas = [0.5] * rows if alphas is None else alphas

    def orch(o, x, y):
        o.submit_many(
            kernel,
            x.views([1, 8], [[i + shift, 0] for i in range(rows)]),
            y.views([1, 8], [[i, 0] for i in range(rows)]),
            np.asarray(alphas, np.float64),
        )
        o.submit(kernel, x.view([1, 8], [0, 0]), y.view([1, 8], [0, 0]), 2.0)

    return sp.Callable(orch, [sp.IN, sp.INOUT])


def _buffers(w, rows: int = 6):
    x = w.malloc(rows * 8 * 4)
    y = w.malloc(rows * 8 * 4)
    x.copy_to(np.arange(rows * 8, dtype=np.float32))
    y.copy_to(np.zeros(rows * 8, np.float32))
    return x, y


def _args(x, y, rows: int = 6):
    return [x.tensor([rows, 8], F32), y.tensor([rows, 8], F32)]


def _y(y, rows: int = 6) -> np.ndarray:
    out = np.empty(rows * 8, np.float32)
    y.copy_from(out)
    return out


def _counts(r) -> tuple[int, int, int]:
    c = r.counters
    return c["plan_reuses"], c["device_launches"], c["device_mallocs"]


def test_a_replayed_round_launches_exactly_what_a_planned_one_did(cuda):
    """The second and third rounds of the same tasks reuse the first round's plan: no rows
    written or uploaded, the same launches with the same rows, and the same results as rounds
    planned with replay off."""
    x, y = _buffers(cuda)
    call = _orch()
    cuda.replay = "plans"
    reports = [cuda.run(call, _args(x, y)) for _ in range(3)]
    assert [_counts(r) for r in reports] == [(0, 2, 1), (1, 2, 0), (1, 2, 0)]
    assert reports[0].counters["task_row_bytes"] == 5 * 32  # five tasks, four 8-byte fields
    assert [r.counters["task_row_bytes"] for r in reports[1:]] == [0, 0]
    assert [r.counters["device_tasks"] for r in reports] == [5, 5, 5]
    assert len(SEEN) == 6
    for again in (SEEN[2:4], SEEN[4:6]):
        for (g0, r0), (g1, r1) in zip(SEEN[0:2], again):
            assert g0 == g1
            np.testing.assert_array_equal(r0, r1)
    replayed = _y(y)
    cuda.replay = "off"
    y.copy_to(np.zeros(6 * 8, np.float32))
    planned = [cuda.run(call, _args(x, y)) for _ in range(3)]
    assert [_counts(r)[0] for r in planned] == [0, 0, 0]
    assert all(r.counters["task_row_bytes"] == 160 for r in planned)
    np.testing.assert_array_equal(_y(y), replayed)
    # Per round: rows 0..3 get 0.5 x, row 0 then 2 x more; three rounds.
    xs = np.arange(48, dtype=np.float32)
    want = np.zeros(48, np.float32)
    for _ in range(3):
        want[:32] += np.float32(0.5) * xs[:32]
        want[:8] += np.float32(2.0) * xs[:8]
    np.testing.assert_array_equal(replayed, want)
    assert cuda.plans_kept == 1
    x.free()
    y.free()


def _differs(name: str, w, x, y):
    """A round that differs from `_orch()` over (x, y) in one thing: its call and arguments."""
    if name == "one task":
        return _orch(rows=5), _args(x, y)
    if name == "one scalar":
        return _orch(alphas=[0.5, 0.5, 0.25, 0.5]), _args(x, y)
    if name == "one scalar's sign bit":
        return _orch(alphas=[0.5, 0.5, 0.5, -0.0]), _args(x, y)
    if name == "one view offset":
        return _orch(shift=1), _args(x, y)
    if name == "the kernel":
        return _orch(kernel=_kernel("rp_saxpy_again")), _args(x, y)
    raise AssertionError(name)


@pytest.mark.parametrize(
    "change", ["one task", "one scalar", "one scalar's sign bit", "one view offset", "the kernel"]
)
def test_a_round_that_differs_in_one_thing_is_planned_again(cuda, change):
    x, y = _buffers(cuda)
    base = _orch()
    assert [_counts(cuda.run(base, _args(x, y)))[0] for _ in range(2)] == [0, 1]
    call, args = _differs(change, cuda, x, y)
    SEEN.clear()
    r = cuda.run(call, args)
    assert r.counters["plan_reuses"] == 0 and r.counters["task_row_bytes"] > 0
    # What ran is the new round's tasks: its rows, not the kept plan's.
    rows = np.concatenate([rw for _, rw in SEEN])
    if change == "one task":
        assert len(rows) == 6
    if change == "one scalar":
        assert rows[2, 2].view(np.float64) == 0.25
    if change == "one scalar's sign bit":
        assert rows[3, 2] == np.float64(-0.0).view(np.uint64)
    if change == "one view offset":
        assert int(rows[0, 0]) == x.ptr + 32
    # Both plans are kept now: each replays.
    assert cuda.run(call, args).counters["plan_reuses"] == 1
    assert cuda.run(base, _args(x, y)).counters["plan_reuses"] == 1
    x.free()
    y.free()


def test_a_buffer_freed_and_allocated_again_at_the_same_address_is_planned_again(cuda):
    """The same tasks over a buffer that was freed and allocated again (the fake hands the same
    address back) bind a new allocation: the plan over the old one was dropped with it."""
    x, y = _buffers(cuda)
    call = _orch()
    assert [_counts(cuda.run(call, _args(x, y)))[0] for _ in range(2)] == [0, 1]
    assert cuda.plans_kept == 1
    old = y.ptr
    y.free()
    assert cuda.plans_kept == 0
    y = cuda.malloc(6 * 8 * 4)
    assert y.ptr == old
    y.copy_to(np.zeros(48, np.float32))
    r = cuda.run(call, _args(x, y))
    # Planned again, its rows in the region the dropped plan gave back (no malloc).
    assert _counts(r) == (0, 2, 0)
    assert cuda.run(call, _args(x, y)).counters["plan_reuses"] == 1
    x.free()
    y.free()


def test_at_most_four_plans_are_kept_least_recently_used_first_out(cuda):
    x, y = _buffers(cuda)
    calls = [_orch(alphas=[float(k)] * 4) for k in range(5)]
    first = [cuda.run(c, _args(x, y)) for c in calls[:4]]
    # Each new plan takes a task-row region of its own while fewer than four are held.
    assert [_counts(r) for r in first] == [(0, 2, 1)] * 4
    assert cuda.plans_kept == 4
    assert cuda.run(calls[0], _args(x, y)).counters["plan_reuses"] == 1  # 0 is the newest now
    r = cuda.run(calls[4], _args(x, y))  # drops the least recently used: 1
    assert _counts(r) == (0, 2, 0) and cuda.plans_kept == 4
    assert [cuda.run(calls[k], _args(x, y)).counters["plan_reuses"] for k in (0, 2, 3, 4)] == [1] * 4
    assert cuda.run(calls[1], _args(x, y)).counters["plan_reuses"] == 0
    assert cuda.stats()["live_allocations"] == 2 + 4  # x, y and four task-row regions
    cuda.trim_staging()
    assert cuda.plans_kept == 0 and cuda.stats()["live_allocations"] == 2
    x.free()
    y.free()


def test_a_failed_row_upload_names_the_call_and_keeps_no_plan(cuda, fake_vendor):
    x, y = _buffers(cuda)
    call = _orch()
    lib = fake_vendor.cuda_lib()
    lib.fake_cuda_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    assert lib.fake_cuda_inject(b"cuMemcpyHtoDAsync_v2", 1, 1) == 0
    with pytest.raises(sp.DeviceError) as e:
        cuda.run(call, _args(x, y))
    assert re.search(r"<task rows>.*cuMemcpyHtoDAsync_v2", str(e.value)), str(e.value)
    assert (e.value.code, e.value.phase) == (1, "execute")
    assert cuda.plans_kept == 0
    # The next round plans again, into the region the failed one left (no malloc), and works.
    y.copy_to(np.zeros(48, np.float32))
    r = cuda.run(call, _args(x, y))
    assert _counts(r) == (0, 2, 0)
    assert cuda.run(call, _args(x, y)).counters["plan_reuses"] == 1
    assert cuda.plans_kept == 1
    x.free()
    y.free()


def test_replay_is_a_worker_setting(cuda, monkeypatch):
    assert cuda.replay == "graphs"
    cuda.replay = "off"
    assert cuda.replay == "off"
    with pytest.raises(ValueError, match=r"replay must be 'off', 'plans' or 'graphs', not 'always'"):
        cuda.replay = "always"
    with pytest.raises(TypeError, match="replay must be a string"):
        cuda.replay = 1  # type: ignore[assignment]
    monkeypatch.setenv("SIMPLER_REPLAY", "off")
    with sp.Worker("sim") as w:
        assert w.replay == "off"


def test_execute_is_split_into_planning_upload_launch_calls_and_the_wait(cuda):
    """The host's parts of execute and the wait are counted apart and never add up to more than
    execute; a reused plan uploads nothing, so its upload part is exactly 0; a run without
    device code counts none of them."""
    x, y = _buffers(cuda)
    call = _orch()
    planned, replayed = cuda.run(call, _args(x, y)), cuda.run(call, _args(x, y))
    parts = ("plan_ns", "row_upload_ns", "launch_ns", "execute_wait_ns")
    for r in (planned, replayed):
        assert sum(r.counters[k] for k in parts) <= r.phases["execute"]
    assert planned.counters["row_upload_ns"] > 0 and planned.counters["launch_ns"] > 0
    assert replayed.counters["row_upload_ns"] == 0 and replayed.counters["launch_ns"] > 0
    r = cuda.run(sp.Callable(lambda o, x, y: None, [sp.IN, sp.INOUT]), _args(x, y))
    assert [r.counters[k] for k in parts] == [0, 0, 0, 0]
    x.free()
    y.free()


# -- replay as one CUDA graph launch -------------------------------------------------------------


def _fake_count(fake_vendor, name: str) -> int:
    fn = getattr(fake_vendor.cuda_lib(), name)
    fn.restype = ctypes.c_uint64
    return int(fn())


def test_a_reused_plan_is_captured_once_and_replayed_as_one_graph_launch(cuda, fake_vendor):
    """Under replay="graphs" the first reuse captures the plan's launches into a graph and
    every reuse launches it once: the fake runs exactly the launches (rows, grids) the planned
    round ran, and the results equal replay="plans" and replay="off" rounds."""
    x, y = _buffers(cuda)
    call = _orch()
    launches0 = _fake_count(fake_vendor, "fake_cuda_graph_launches")
    reps = [cuda.run(call, _args(x, y)) for _ in range(3)]
    c = [r.counters for r in reps]
    assert [(k["plan_reuses"], k["graph_captures"], k["graph_launches"]) for k in c] == [
        (0, 0, 0),
        (1, 1, 1),
        (1, 0, 1),
    ]
    assert [k["device_launches"] for k in c] == [2, 2, 2]
    assert [k["device_tasks"] for k in c] == [5, 5, 5]
    assert _fake_count(fake_vendor, "fake_cuda_graph_launches") - launches0 == 2
    assert _fake_count(fake_vendor, "fake_cuda_live_graphs") == 1
    assert len(SEEN) == 6
    for again in (SEEN[2:4], SEEN[4:6]):
        for (g0, r0), (g1, r1) in zip(SEEN[0:2], again):
            assert g0 == g1
            np.testing.assert_array_equal(r0, r1)
    graphs = _y(y)
    for mode in ("plans", "off"):
        cuda.replay = mode
        y.copy_to(np.zeros(48, np.float32))
        for _ in range(3):
            assert cuda.run(call, _args(x, y)).counters["graph_launches"] == 0
        np.testing.assert_array_equal(_y(y), graphs)
    # Dropping the plan (its buffer freed) destroys its graph.
    y.free()
    assert cuda.plans_kept == 0 and _fake_count(fake_vendor, "fake_cuda_live_graphs") == 0
    x.free()


def test_a_round_with_a_host_task_between_batches_replays_without_a_graph(cuda):
    host = sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], name="rp_host")

    def orch(o, x, y):
        o.submit(K, x.view([1, 8], [0, 0]), y.view([1, 8], [0, 0]), 1.0)
        o.submit(host, x.view([1, 8], [0, 0]), y.view([1, 8], [0, 0]), 10.0)
        o.submit(K, x.view([1, 8], [0, 0]), y.view([1, 8], [0, 0]), 100.0)

    x, y = _buffers(cuda)
    call = sp.Callable(orch, [sp.IN, sp.INOUT])
    c = [cuda.run(call, _args(x, y)).counters for _ in range(2)]
    assert [(k["plan_reuses"], k["graph_launches"], k["host_path_tasks"]) for k in c] == [
        (0, 0, 1),
        (1, 0, 1),
    ]
    np.testing.assert_array_equal(_y(y)[:8], 2 * 111 * np.arange(8, dtype=np.float32))
    x.free()
    y.free()


@pytest.mark.parametrize(
    "call_name", ["cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags"]
)
def test_a_failed_capture_replays_with_plain_launches_and_leaves_no_graph(cuda, fake_vendor, call_name):
    x, y = _buffers(cuda)
    call = _orch()
    cuda.run(call, _args(x, y))
    lib = fake_vendor.cuda_lib()
    lib.fake_cuda_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    assert lib.fake_cuda_inject(call_name.encode(), 1, 999) == 0
    c = [cuda.run(call, _args(x, y)).counters for _ in range(2)]
    assert [
        (k["plan_reuses"], k["graph_captures"], k["graph_launches"], k["device_launches"]) for k in c
    ] == [
        (1, 0, 0, 2),
        (1, 0, 0, 2),
    ]
    assert _fake_count(fake_vendor, "fake_cuda_live_graphs") == 0
    # Per round: rows 0..3 get 0.5 x, row 0 then 2 x more; three rounds.
    xs = np.arange(48, dtype=np.float32)
    want = np.zeros(48, np.float32)
    for _ in range(3):
        want[:32] += np.float32(0.5) * xs[:32]
        want[:8] += np.float32(2.0) * xs[:8]
    np.testing.assert_array_equal(_y(y), want)
    x.free()
    y.free()


def test_a_failed_graph_launch_is_the_runs_error_naming_the_call(cuda, fake_vendor):
    x, y = _buffers(cuda)
    call = _orch()
    cuda.run(call, _args(x, y))
    cuda.run(call, _args(x, y))
    lib = fake_vendor.cuda_lib()
    lib.fake_cuda_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    assert lib.fake_cuda_inject(b"cuGraphLaunch", 1, 1) == 0
    with pytest.raises(sp.DeviceError) as e:
        cuda.run(call, _args(x, y))
    assert "cuGraphLaunch" in str(e.value) and e.value.code == 1, str(e.value)
    assert cuda.run(call, _args(x, y)).counters["graph_launches"] == 1
    x.free()
    y.free()
