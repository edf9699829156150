"""Rounds that do not wait for the device (``w.run(..., wait=False)``), on cuda against the fake
libcuda, whose stream runs each operation late here (a wake-up latency): a pending round gives
the results of a waited one; the next round's orchestration reads a control tensor the pending
round's tasks do not write without waiting for it, and reads of bytes they write wait first, so a
pending round's outputs are never read early; copies, frees and close wait for it; a round that
stages an argument, or launches no device code, waits as before; a device failure surfaces at
``wait()``."""

from __future__ import annotations

import numpy as np
import pytest

import simpler as sp
from simpler.testing import fake_cuda

F32 = np.dtype(np.float32)

#: y[i] += alpha * x[i] over each task's view of n elements.
SOURCE = r"""
struct ov_row { const float* x; float* y; double alpha; long long n; };
extern "C" __global__ void t_ov_saxpy(const ov_row* rows) {
    const ov_row r = rows[blockIdx.z];
    for (long long i = threadIdx.x; i < r.n; i += blockDim.x) r.y[i] += (float)r.alpha * r.x[i];
}
"""


@fake_cuda.host_impl("t_ov_saxpy")
def _saxpy(launch: fake_cuda.Launch) -> None:
    for x, y, alpha, n in launch.rows(4):
        n = launch.i64(n)
        dst = launch.array(int(y), (n,), F32)
        dst += np.float32(launch.f64(alpha)) * launch.array(int(x), (n,), F32)


def _saxpy_fn(x, y, alpha):
    y += np.float32(alpha) * x


K = sp.Kernel(
    _saxpy_fn,
    [sp.IN, sp.INOUT],
    name="ov_saxpy",
    cuda=sp.CudaCode(
        SOURCE,
        entry="t_ov_saxpy",
        launch=lambda xs, ys: sp.Launch(grid=1, block=64, consts=(int(np.prod(xs)),)),
        scalars=("float64",),
    ),
)

#: Each round: the orchestration reads the step from ``pos`` (a control tensor no task
#: touches), adds ``step + 1`` times x to y row by row, and advances ``pos`` itself.
SEEN: list[tuple[int, bool]] = []


def _orch(watch: list | None = None, read_y: bool = False):
    def orch(o, x, y, pos):
        step = int(o.get_tensor_data(pos, 0))
        if watch:
            SEEN.append((step, watch[0].pending))
        if read_y:
            SEEN.append((int(o.get_tensor_data(y, (0, 1))), watch[0].pending if watch else False))
        o.submit_many(
            K,
            x.views([1, 8], [[i, 0] for i in range(4)]),
            y.views([1, 8], [[i, 0] for i in range(4)]),
            float(step + 1),
        )
        o.set_tensor_data(pos, 0, step + 1)

    return sp.Callable(orch, [sp.IN, sp.INOUT, sp.INOUT])


@pytest.fixture
def cuda(fake_vendor):
    SEEN.clear()
    lib = fake_vendor.cuda_lib()
    with fake_vendor.worker("cuda", poison=False) as w:
        lib.fake_cuda_set_stream_latency_us(20_000)
        try:
            yield w
        finally:
            lib.fake_cuda_set_stream_latency_us(0)


def _buffers(w):
    x, y, pos = w.malloc(4 * 8 * 4), w.malloc(4 * 8 * 4), w.malloc(4)
    x.copy_to(np.arange(32, dtype=np.float32))
    y.copy_to(np.zeros(32, np.float32))
    pos.copy_to(np.zeros(1, np.int32))
    args = [x.tensor([4, 8], F32), y.tensor([4, 8], F32), pos.tensor([1], np.int32)]
    return (x, y, pos), args


def _y(y) -> np.ndarray:
    out = np.empty(32, np.float32)
    y.copy_from(out)
    return out


def _want(rounds: int) -> np.ndarray:
    return np.arange(32, dtype=np.float32) * np.float32(sum(range(1, rounds + 1)))


def test_pending_rounds_give_the_results_of_waited_ones_and_their_reports(cuda):
    """Four rounds left pending, each waited for only by the next round's execute: the same
    results, and each report counts the round's own launches."""
    (x, y, pos), args = _buffers(cuda)
    call = _orch()
    handles = [cuda.run(call, args, wait=False) for _ in range(4)]
    assert [h.pending for h in handles] == [False, False, False, True]
    reports = [h.wait() for h in handles]
    assert [r.counters["device_launches"] for r in reports] == [1, 1, 1, 1]
    assert [r.counters["device_tasks"] for r in reports] == [4, 4, 4, 4]
    np.testing.assert_array_equal(_y(y), _want(4))
    with pytest.raises(sp.StateError, match="no report to wait for"):
        handles[0].wait()
    # The same rounds, waited for.
    y.copy_to(np.zeros(32, np.float32))
    pos.copy_to(np.zeros(1, np.int32))
    waited = [cuda.run(call, args) for _ in range(4)]
    assert isinstance(waited[0], sp.RunReport)
    np.testing.assert_array_equal(_y(y), _want(4))
    for b in (x, y, pos):
        b.free()


def test_the_next_round_reads_a_control_tensor_without_waiting_but_never_a_pending_output(cuda):
    """The next round's orchestration reads ``pos`` (no task of the pending round touches it)
    while that round is still pending, and the step it read is the one the pending round's
    orchestration wrote; its read of ``y`` (the pending round's tasks write it) waits first and
    sees the pending round's results, which the fake's stream ran 20 ms late."""
    (x, y, pos), args = _buffers(cuda)
    first = cuda.run(_orch(), args, wait=False)
    assert first.pending
    second = cuda.run(_orch(watch=[first], read_y=True), args, wait=False)
    # pos read while the first round was pending; y[0, 1] read after it completed: x * 1.
    assert SEEN == [(1, True), (1, False)]
    assert not first.pending and second.pending
    assert first.wait().counters["device_tasks"] == 4
    # Another round reading y: waits for the second round, sees 1 + 2 times x.
    SEEN.clear()
    third = cuda.run(_orch(watch=[second], read_y=True), args, wait=False)
    assert SEEN == [(2, True), (3, False)]
    assert second.wait().counters["device_tasks"] == 4
    third.wait()
    np.testing.assert_array_equal(_y(y), _want(3))
    for b in (x, y, pos):
        b.free()


def test_a_copy_a_free_and_close_wait_for_a_pending_round(cuda):
    """A copy back, a free of a buffer the pending round reads and close each complete the
    pending round first (its stream ran it 20 ms late): its results are there, and its handle
    still returns its report."""
    (x, y, _), args = _buffers(cuda)
    p = cuda.run(_orch(), args, wait=False)
    assert p.pending
    out = np.empty(32, np.float32)
    y.copy_from(out)
    assert not p.pending
    np.testing.assert_array_equal(out, _want(1))
    p = cuda.run(_orch(), args, wait=False)
    x.free()
    assert not p.pending
    assert p.wait().counters["device_tasks"] == 4
    np.testing.assert_array_equal(_y(y), _want(2))
    x = cuda.malloc(4 * 8 * 4)
    x.copy_to(np.arange(32, dtype=np.float32))
    p = cuda.run(_orch(), [x.tensor([4, 8], F32), args[1], args[2]], wait=False)
    assert p.pending
    cuda.close()
    assert not p.pending
    assert p.wait().counters["device_tasks"] == 4


def test_a_round_that_stages_or_launches_nothing_waits_as_before(cuda):
    (x, y, pos), args = _buffers(cuda)
    staged_y = np.zeros((4, 8), np.float32)
    p = cuda.run(_orch(), [args[0], staged_y, args[2]], wait=False)
    assert not p.pending
    assert p.wait().counters["device_tasks"] == 4
    np.testing.assert_array_equal(staged_y.ravel(), np.arange(32, dtype=np.float32))
    nothing = sp.Callable(lambda o, x, y, pos: None, [sp.IN, sp.INOUT, sp.INOUT])
    p = cuda.run(nothing, args, wait=False)
    assert not p.pending and p.wait().counters["tasks"] == 0
    for b in (x, y, pos):
        b.free()


def test_a_device_failure_of_a_pending_round_is_raised_by_its_wait(cuda):
    (x, y, pos), args = _buffers(cuda)
    p = cuda.run(_orch(), args, wait=False)
    cuda.inject_fault("sync", 1, 700)
    with pytest.raises(sp.DeviceError, match="700"):
        p.wait()
    for b in (x, y, pos):
        b.free()
