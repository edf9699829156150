"""Host implementations, for the fake libcuda, of the unrolled paged attention's CUDA entries
(:mod:`simpler.workloads.paged_attention_unroll_cuda`): each does with numpy what its entry's
device code does, on the rows it reads, and shares its math with the workload's numpy kernels
(:mod:`simpler.workloads.paged_attention_unroll`)."""

from __future__ import annotations

import numpy as np

from ..._arrays import np_dtype
from ...workloads import paged_attention_unroll as _ref
from ...workloads.paged_attention_unroll_cuda import (
    MAX_HEAD_DIM,
    MAX_Q_TILE,
    PV_COLS,
    PV_THREADS,
    QK_THREADS,
    ROW_THREADS,
)
from ..fake_cuda import Launch, Region, host_impl

# -- host implementations for the fake libcuda ------------------------------------------------------
#
# Each does what its entry does, task by task: it decodes the rows as the device code declares
# them, covers what the launch grid covers, writes nothing where the device code returns early,
# and checks that no two tasks of the launch touch the same bytes with one of them writing.

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def _bf16() -> np.dtype:
    return np_dtype("bfloat16")


def _ids(launch: Launch, at: int, n: int, nb: int) -> np.ndarray:
    return launch.array(at, (n,), _I32).astype(np.int64)


@host_impl("pu_qk")
def _host_qk(launch: Launch) -> None:
    """Host ``pu_qk``: row (q, key_cache, ids, scores, QT, D, BS, n, NB)."""
    rows = launch.rows(9)
    if launch.block != (QK_THREADS, 1, 1):
        return
    tasks = []
    for row in rows:
        q_at, kc_at, ids_at, sc_at = (int(x) for x in row[:4])
        qt, dim, bs, n, nb = (Launch.i64(x) for x in row[4:9])
        if dim > MAX_HEAD_DIM or qt > MAX_Q_TILE:
            continue
        covered = min(n, launch.grid[0])
        ids = _ids(launch, ids_at, covered, nb)
        ok = [j for j in range(covered) if 0 <= ids[j] < nb]
        tasks.append((q_at, kc_at, ids_at, sc_at, qt, dim, bs, nb, ids, ok))
    launch.check_races(
        [Region(sc_at + j * qt * bs * 4, qt * bs * 4, True, "scores") for j in ok]
        + [Region(q_at, qt * dim * 2, False, "q"), Region(ids_at, len(ids) * 4, False, "ids")]
        for q_at, _, ids_at, sc_at, qt, dim, bs, _, ids, ok in tasks
    )
    for q_at, kc_at, _, sc_at, qt, dim, bs, nb, ids, ok in tasks:
        q = launch.array(q_at, (qt, dim), _bf16()).astype(np.float32)
        kc = launch.array(kc_at, (nb, bs, dim), _bf16())
        scores = launch.array(sc_at, (len(ids), qt, bs), _F32)
        for j in ok:
            scores[j] = q @ kc[ids[j]].astype(np.float32).T


@host_impl("pu_softmax")
def _host_softmax(launch: Launch) -> None:
    """Host ``pu_softmax``: row (scores, probs, m, l, scale f64, valid i64, QT, BS, n)."""
    rows = launch.rows(9)
    if launch.block != (ROW_THREADS, 1, 1):
        return
    tasks = []
    for row in rows:
        sc_at, pr_at, m_at, l_at = (int(x) for x in row[:4])
        scale, valid = Launch.f64(row[4]), Launch.i64(row[5])
        qt, bs, n = (Launch.i64(x) for x in row[6:9])
        if n < 1:
            continue
        tasks.append((sc_at, pr_at, m_at, l_at, scale, valid, qt, bs, n, min(qt, launch.grid[0])))
    launch.check_races(
        [
            Region(sc_at, n * qt * bs * 4, False, "scores"),
            Region(pr_at, n * qt * bs * 2, True, "probs"),
            Region(m_at, nh * 4, True, "m"),
            Region(l_at, nh * 4, True, "l"),
        ]
        for sc_at, pr_at, m_at, l_at, _, _, qt, bs, n, nh in tasks
    )
    for sc_at, pr_at, m_at, l_at, scale, valid, qt, bs, n, nh in tasks:
        if nh < qt:  # the device covers rows [0, nh) only
            continue
        _ref._softmax(
            launch.array(sc_at, (n, qt, bs), _F32),
            launch.array(pr_at, (n, qt, bs), _bf16()),
            launch.array(m_at, (qt,), _F32),
            launch.array(l_at, (qt,), _F32),
            scale,
            valid,
        )


@host_impl("pu_pv")
@host_impl("pu_pv_m16")
def _host_pv(launch: Launch) -> None:
    """Host ``pu_pv`` and ``pu_pv_m16``: row (probs, value_cache, ids, oi, QT, D, BS, n, NB)."""
    rows = launch.rows(9)
    if launch.block != (PV_THREADS, 1, 1):
        return
    tasks = []
    for row in rows:
        pr_at, vc_at, ids_at, oi_at = (int(x) for x in row[:4])
        qt, dim, bs, n, nb = (Launch.i64(x) for x in row[4:9])
        if dim > MAX_HEAD_DIM or qt > MAX_Q_TILE:
            continue
        cols = min(dim, launch.grid[0] * PV_COLS)
        tasks.append((pr_at, vc_at, ids_at, oi_at, qt, dim, bs, n, nb, cols))
    launch.check_races(
        [
            Region(pr_at, n * qt * bs * 2, False, "probs"),
            Region(ids_at, n * 4, False, "ids"),
            Region(oi_at, ((qt - 1) * dim + cols) * 4 if cols else 0, True, "oi"),
        ]
        for pr_at, _, ids_at, oi_at, qt, dim, bs, n, _, cols in tasks
    )
    for pr_at, vc_at, ids_at, oi_at, qt, dim, bs, n, nb, cols in tasks:
        if cols <= 0:
            continue
        ids = _ids(launch, ids_at, n, nb)
        ok = (ids >= 0) & (ids < nb)
        p = launch.array(pr_at, (n, qt, bs), _bf16()).astype(np.float32)[ok]
        v = launch.array(vc_at, (nb, bs, dim), _bf16())[ids[ok]][:, :, :cols].astype(np.float32)
        oi = launch.array(oi_at, (qt, dim), _F32)
        oi[:, :cols] = p.transpose(1, 0, 2).reshape(qt, -1) @ v.reshape(-1, cols)


@host_impl("pu_update")
def _host_update(launch: Launch) -> None:
    """Host ``pu_update``: row (m_g, l_g, oi_g, m, l, acc, out, first i64, last i64, QT, D)."""
    rows = launch.rows(11)
    if launch.grid[1] != 1 or launch.block[1] != 1 or launch.block[2] != 1:
        return
    tasks = []
    for row in rows:
        ats = [int(x) for x in row[:7]]
        first, last = Launch.i64(row[7]) != 0, Launch.i64(row[8]) != 0
        qt, dim = Launch.i64(row[9]), Launch.i64(row[10])
        tasks.append((ats, first, last, qt, dim, min(qt, launch.grid[0])))
    launch.check_races(
        [
            Region(ats[0], nh * 4, False, "m_g"),
            Region(ats[1], nh * 4, False, "l_g"),
            Region(ats[2], nh * dim * 4, False, "oi_g"),
            Region(ats[3], nh * 4, True, "m"),
            Region(ats[4], nh * 4, True, "l"),
            Region(ats[5], nh * dim * 4, True, "acc"),
            Region(ats[6], nh * dim * 4 if last else 0, True, "out"),
        ]
        for ats, _, last, qt, dim, nh in tasks
    )
    for ats, first, last, _qt, dim, nh in tasks:
        if nh <= 0:
            continue
        m_g, l_g, oi_g, m, s, acc, out = (
            launch.array(a, shape, _F32)
            for a, shape in zip(ats, [(nh,), (nh,), (nh, dim), (nh,), (nh,), (nh, dim), (nh, dim)])
        )
        _ref._update(m_g, l_g, oi_g, m, s, acc, out, first, last)
