"""Host implementations, for the fake libcuda, of the paged attention's CUDA entries
(:mod:`simpler.workloads.paged_attention_cuda`): each does with numpy what its entry's device
code does, on the rows it reads, and shares its math with the workload's numpy kernels
(:mod:`simpler.workloads.paged_attention`)."""

from __future__ import annotations

import numpy as np

from ..._arrays import np_dtype
from ...workloads import paged_attention as _ref
from ...workloads.paged_attention_cuda import MAX_HEAD_DIM, PV_HEADS, WARP
from ..fake_cuda import Launch, Region, host_impl

# -- host implementations for the fake libcuda --------------------------------------------------
#
# Each does what its entry does, task by task: it decodes the rows as the device code declares
# them, takes the dims from the consts, covers what the launch grid covers, and writes nothing
# where the device code returns early (a geometry the launch functions never make; no fault, as
# on the device). Tasks of one launch are checked for races (see fake_cuda).

_F32 = np.dtype(np.float32)


def _bf16() -> np.dtype:
    """bfloat16 (``ml_dtypes`` is imported at the first launch that reads or writes it)."""
    return np_dtype("bfloat16")


def _clamp(valid: int, n: int) -> int:
    return max(0, min(valid, n))


def _warp_block(launch: Launch) -> bool:
    """Whether the launch's blocks are rows of 32-lane warps, as ``pa_qk`` and
    ``pa_block_softmax`` need (they return at once otherwise)."""
    return launch.block[0] == WARP


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _span(addr: int, rows: int, stride: int, cols: int, itemsize: int) -> int:
    """Bytes from ``addr`` to the end of element ``(rows - 1, cols - 1)`` of a strided matrix."""
    return 0 if rows <= 0 or cols <= 0 else ((rows - 1) * stride + cols) * itemsize


@host_impl("pa_qk")
def _host_qk(launch: Launch) -> None:
    """Host ``pa_qk``: row (q, k, scores, scale f64, valid i64, H, D, BS)."""
    rows = launch.rows(8)
    if not _warp_block(launch):
        return  # the device code returns: nothing written
    tokens_covered = launch.grid[0] * launch.block[1]
    tasks = []
    for row in rows:
        q_at, k_at, sc_at = (int(x) for x in row[:3])
        scale, valid = Launch.f64(row[3]), Launch.i64(row[4])
        heads, dim, block_size = (Launch.i64(x) for x in row[5:8])
        # D past MAX_HEAD_DIM: the device code returns, so the task writes nothing.
        n = 0 if dim > MAX_HEAD_DIM else min(_clamp(valid, block_size), tokens_covered)
        tasks.append((q_at, k_at, sc_at, scale, heads, dim, block_size, n))
    launch.check_races(
        [
            Region(q_at, _span(q_at, heads, dim, dim, 2) if n else 0, False, "q"),
            Region(k_at, n * dim * 2, False, "k"),
            Region(sc_at, _span(sc_at, heads, block_size, n, 4), True, "scores"),
        ]
        for q_at, k_at, sc_at, _, heads, dim, block_size, n in tasks
    )
    for q_at, k_at, sc_at, scale, heads, dim, block_size, n in tasks:
        if n == 0:
            continue
        q = launch.array(q_at, (heads, dim), _bf16()).astype(np.float32)
        k = launch.array(k_at, (n, dim), _bf16()).astype(np.float32)
        scores = launch.array(sc_at, (heads, block_size), _F32)
        scores[:, :n] = (q @ k.T) * np.float32(scale)


@host_impl("pa_block_softmax")
def _host_block_softmax(launch: Launch) -> None:
    """Host ``pa_block_softmax``: row (scores, probs, stats, valid i64, H, BS)."""
    rows = launch.rows(6)
    if not _warp_block(launch):
        return  # the device code returns: nothing written
    heads_covered = launch.grid[0] * launch.block[1]
    tasks = []
    for row in rows:
        sc_at, pr_at, st_at = (int(x) for x in row[:3])
        valid = Launch.i64(row[3])
        heads, block_size = Launch.i64(row[4]), Launch.i64(row[5])
        nh = max(0, min(heads, heads_covered))
        tasks.append((sc_at, pr_at, st_at, heads, block_size, nh, _clamp(valid, block_size)))
    launch.check_races(
        [
            Region(sc_at, _span(sc_at, nh, block_size, n, 4), False, "scores"),
            Region(pr_at, _span(pr_at, nh, block_size, n, 2), True, "probs"),
            Region(st_at, _span(st_at, 2, heads, nh, 4), True, "stats"),
        ]
        for sc_at, pr_at, st_at, heads, block_size, nh, n in tasks
    )
    for sc_at, pr_at, st_at, heads, block_size, nh, n in tasks:
        if nh == 0:
            continue
        stats = launch.array(st_at, (2, heads), _F32)
        if n == 0:
            stats[0, :nh] = -np.inf
            stats[1, :nh] = 0.0
            continue
        sc = launch.array(sc_at, (heads, block_size), _F32)[:nh, :n]
        pr = launch.array(pr_at, (heads, block_size), _bf16())[:nh, :n]
        m = sc.max(axis=1)
        pr[...] = np.exp(sc - m[:, None])  # rounded to bfloat16 on the way in
        stats[0, :nh] = m
        stats[1, :nh] = pr.astype(np.float32).sum(axis=1)


@host_impl("pa_pv")
def _host_pv(launch: Launch) -> None:
    """Host ``pa_pv``: row (probs, v, block_out, valid i64, H, D, BS)."""
    rows = launch.rows(7)
    heads_covered = launch.grid[0] * PV_HEADS
    dims_covered = launch.grid[1] * launch.block[0]
    tasks = []
    for row in rows:
        pr_at, v_at, bo_at = (int(x) for x in row[:3])
        valid = Launch.i64(row[3])
        heads, dim, block_size = (Launch.i64(x) for x in row[4:7])
        nh, nd = max(0, min(heads, heads_covered)), max(0, min(dim, dims_covered))
        tasks.append((pr_at, v_at, bo_at, heads, dim, block_size, nh, nd, _clamp(valid, block_size)))
    launch.check_races(
        [
            Region(pr_at, _span(pr_at, nh, block_size, n, 2) if nd else 0, False, "probs"),
            Region(v_at, _span(v_at, n, dim, nd, 2) if nh else 0, False, "v"),
            Region(bo_at, _span(bo_at, nh, dim, nd, 4), True, "block_out"),
        ]
        for pr_at, v_at, bo_at, heads, dim, block_size, nh, nd, n in tasks
    )
    for pr_at, v_at, bo_at, heads, dim, block_size, nh, nd, n in tasks:
        if nh == 0 or nd == 0:
            continue
        pr = launch.array(pr_at, (heads, block_size), _bf16())[:nh, :n].astype(np.float32)
        v = launch.array(v_at, (n, dim), _bf16())[:, :nd].astype(np.float32)
        out = launch.array(bo_at, (heads, dim), _F32)
        out[:nh, :nd] = pr @ v


@host_impl("pa_online_update")
def _host_online_update(launch: Launch) -> None:
    """Host ``pa_online_update``: row (stats, block_out, m, s, acc, first i64, H, D)."""
    rows = launch.rows(8)
    if launch.grid[1] != 1 or launch.block[1] != 1 or launch.block[2] != 1:
        return  # not one writer per head: the device code returns, nothing written
    heads_covered = launch.grid[0]
    tasks = []
    for row in rows:
        st_at, bo_at, m_at, s_at, acc_at = (int(x) for x in row[:5])
        first = Launch.i64(row[5]) != 0
        heads, dim = Launch.i64(row[6]), Launch.i64(row[7])
        nh = max(0, min(heads, heads_covered))
        tasks.append((st_at, bo_at, m_at, s_at, acc_at, first, heads, dim, nh))
    launch.check_races(
        [
            Region(st_at, _span(st_at, 2, heads, nh, 4), False, "stats"),
            Region(bo_at, nh * dim * 4, False, "block_out"),
            Region(m_at, nh * 4, True, "m"),
            Region(s_at, nh * 4, True, "s"),
            Region(acc_at, nh * dim * 4, True, "acc"),
        ]
        for st_at, bo_at, m_at, s_at, acc_at, first, heads, dim, nh in tasks
    )
    for st_at, bo_at, m_at, s_at, acc_at, first, heads, dim, nh in tasks:
        if nh == 0:
            continue
        st = launch.array(st_at, (2, heads), _F32)[:, :nh]
        bo = launch.array(bo_at, (nh, dim), _F32)
        m = launch.array(m_at, (nh,), _F32)
        s = launch.array(s_at, (nh,), _F32)
        acc = launch.array(acc_at, (nh, dim), _F32)
        # The covered heads fold exactly as the reference kernel folds them.
        _ref.UPDATE.fn(st, bo, m, s, acc, first)


@host_impl("pa_normalize")
def _host_normalize(launch: Launch) -> None:
    """Host ``pa_normalize``: row (s, acc, out, H, D)."""
    rows = launch.rows(5)
    covered = launch.grid[0] * launch.block[0]
    tasks = []
    for row in rows:
        s_at, acc_at, out_at = (int(x) for x in row[:3])
        heads, dim = Launch.i64(row[3]), Launch.i64(row[4])
        n = max(0, min(heads * dim, covered))
        tasks.append((s_at, acc_at, out_at, heads, dim, n))
    launch.check_races(
        [
            Region(s_at, _cdiv(n, dim) * 4 if n else 0, False, "s"),
            Region(acc_at, n * 4, False, "acc"),
            Region(out_at, n * 4, True, "out"),
        ]
        for s_at, acc_at, out_at, heads, dim, n in tasks
    )
    for s_at, acc_at, out_at, _heads, dim, n in tasks:
        if n == 0:
            continue
        s = launch.array(s_at, (_cdiv(n, dim),), _F32)  # element i divides by s[i / D]
        acc = launch.array(acc_at, (n,), _F32)
        out = launch.array(out_at, (n,), _F32)
        out[...] = acc / np.repeat(s, dim)[:n]


@host_impl("pa_zero")
def _host_zero(launch: Launch) -> None:
    """Host ``pa_zero``: row (out, count)."""
    rows = launch.rows(2)
    covered = launch.grid[0] * launch.block[0]
    tasks = [(int(row[0]), max(0, min(Launch.i64(row[1]), covered))) for row in rows]
    launch.check_races([Region(out_at, n * 4, True, "out")] for out_at, n in tasks)
    for out_at, n in tasks:
        if n:
            launch.array(out_at, (n,), _F32)[...] = 0.0
