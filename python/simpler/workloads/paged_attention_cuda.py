"""CUDA device code for the paged attention kernels (:mod:`simpler.workloads.paged_attention`).

Each of the six numpy kernels there (``qk``, ``block_softmax``, ``pv``, ``online_update``,
``normalize``, ``zero``) has a device entry here (``pa_qk``, ...) computing the same thing on the
same views: :data:`SOURCE` is one self-contained CUDA C++ translation unit (no ``#include``: it
compiles with the NVRTC wheel alone) holding all six, and :data:`KERNELS` gives each entry's
scalar kinds and launch function. The module also registers a host implementation of every entry
for the fake libcuda CI runs over (:mod:`simpler.testing.fake_cuda`).

The ABI, as these kernels use it
--------------------------------
* An entry is ``extern "C" __global__ void pa_x(const pa_x_row* rows)``: one parameter, the
  device address of the first task row of the launch.
* A launch covers ``n`` tasks of one submit call (consecutive, or one dependence level): grid
  ``(gx, gy, gz * n)``, where ``(gx, gy, gz)`` is the per-task grid the launch function
  returned. Every launch function here returns ``gz = 1``, so task ``blockIdx.z`` reads
  ``rows[blockIdx.z]`` and its blocks are ``(blockIdx.x, blockIdx.y)``.
* A row is a C struct of 8-byte fields: the device address of the first element of each tensor
  slot's view (the views here are dense, row-major), then the task's scalars in submit order
  (``double`` for ``"float64"``, ``long long`` for ``"int64"``), then the launch function's
  ``consts`` (``long long`` each, the same for every task of the submit call). The dimensions a
  kernel needs travel as consts; nothing else tells it the shape of a view.

Shapes (per task view): ``q`` [1, H, D] bf16, ``k`` / ``v`` [1, BS, 1, D] bf16, ``scores`` /
``probs`` [1, H, BS] f32, ``stats`` [1, 2, H] f32, ``block_out`` [1, H, D] f32, running max /
sum [1, H] f32, ``acc`` [1, H, D] f32, ``out`` [1, H, D] f32. bfloat16 is read as ``unsigned
short`` and widened exactly (``__uint_as_float(u << 16)``); all arithmetic is float32.

=====================  ===================  ==============  ===========================================
entry                  row fields           consts          per-task grid / block
=====================  ===================  ==============  ===========================================
``pa_qk``              q, k, scores,        H, D, BS        (ceil(BS/4), 1, 1) / (32, 4, 1): a warp
                       scale, valid                         per token, lanes over D, every head
``pa_block_softmax``   scores, probs,       H, BS           (ceil(H/4), 1, 1) / (32, 4, 1): a warp
                       stats, valid                         per head, lanes over tokens
``pa_pv``              probs, v,            H, D, BS        (ceil(H/4), ceil(D/bx), 1) / (bx, 1, 1):
                       block_out, valid                     a thread per (4 heads, d)
``pa_online_update``   stats, block_out,    H, D            (H, 1, 1) / (bx, 1, 1): a block per head
                       m, s, acc, first
``pa_normalize``       s, acc, out          H, D            (ceil(H*D/256), 1, 1) / (256, 1, 1)
``pa_zero``            out                  count           (ceil(count/256), 1, 1) / (256, 1, 1)
=====================  ===================  ==============  ===========================================

(``bx`` is ``D`` rounded up to a warp, at most 128.) As the numpy kernels do, ``pa_qk``,
``pa_block_softmax`` and ``pa_pv`` read and write only the first ``valid`` tokens (``valid`` is
clamped to ``[0, BS]``); the rest of ``scores`` / ``probs`` is left untouched. ``D`` is at most
:data:`MAX_HEAD_DIM` (a key row lives in registers in ``pa_qk``); ``H`` and ``BS`` are bounded only
by the grid. Summation orders differ from numpy's, so device results agree with the numpy kernels
to float32 rounding, not bit for bit.

No entry ever traps. A trap is a sticky fault: it leaves the CUDA context unusable for every
library that shares it (torch, CuPy, other workers), not only for this kernel. So the launch
functions refuse, at submit, every geometry the device code cannot handle (an
``ArgumentError`` naming the entry and the limit: ``D`` past :data:`MAX_HEAD_DIM`, a grid past the
device's limits, views of the wrong shapes), and an entry launched with a geometry its launch
function never makes returns without writing anything.

Tasks of one launch run concurrently. The ``online_update`` submits hold dependent tasks (the
blocks of one batch fold into the same running max / sum / accumulator, in order); the runtime
runs such a batch in levels, one launch per level, so no launch holds two tasks of one batch.
The fake's host implementations check that: a launch whose tasks touch the same bytes, one of
them writing, fails (:class:`simpler.testing.fake_cuda.LaunchRace`) instead of producing the
sequential answer a device would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import simpler as sp

from ..testing import fake_cuda
from ..testing.fake_cuda import Launch, Region


def __getattr__(name: str) -> Any:
    """``BF16``: ``ml_dtypes.bfloat16``, resolved when first read (``ml_dtypes`` is imported only
    where a bfloat16 array is made or read, not with this module)."""
    if name == "BF16":
        return sp.np_dtype("bfloat16").type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The largest head dimension ``pa_qk`` supports (a key row is held in registers, 8 per lane).
MAX_HEAD_DIM = 256
#: Warps per block of ``pa_qk`` (one token each) and of ``pa_block_softmax`` (one head each).
WARPS = 4
#: Heads per ``pa_pv`` thread (each value element read is used for this many heads).
PV_HEADS = 4
#: Most threads per block along D (``pa_pv``, ``pa_online_update``).
DIM_THREADS = 128
#: Threads per block of the elementwise entries (``pa_normalize``, ``pa_zero``).
FLAT_THREADS = 256
#: Threads per warp.
WARP = 32
#: The most blocks of a grid along x the device takes (2**31 - 1).
MAX_GRID_X = 2**31 - 1
#: The most blocks of a grid along y (and z) the device takes.
MAX_GRID_Y = 65535

_DEFINES = f"""
#define PA_WARP {WARP}
#define PA_MAX_DIM {MAX_HEAD_DIM}
#define PA_DIM_PER_LANE (PA_MAX_DIM / PA_WARP)
#define PA_PV_HEADS {PV_HEADS}
"""

_BODY = r"""
#define PA_FULL_MASK 0xffffffffu

typedef unsigned short pa_bf16; /* bfloat16 bits */

static __device__ __forceinline__ float pa_bf16_to_f32(pa_bf16 u) {
    return __uint_as_float(((unsigned int)u) << 16);
}

/* float32 -> bfloat16 bits, rounding to nearest even (the inputs here are finite). */
static __device__ __forceinline__ pa_bf16 pa_f32_to_bf16(float f) {
    const unsigned int u = __float_as_uint(f);
    return (pa_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float pa_neg_inf() { return __uint_as_float(0xff800000u); }

/* The numpy kernels slice [:valid]; the device clamps to [0, n] (never reads past the view). */
static __device__ __forceinline__ long long pa_clamp(long long valid, long long n) {
    return valid < 0 ? 0 : (valid > n ? n : valid);
}

static __device__ __forceinline__ float pa_warp_sum(float x) {
#pragma unroll
    for (int o = PA_WARP / 2; o > 0; o >>= 1) x += __shfl_xor_sync(PA_FULL_MASK, x, o);
    return x;
}

static __device__ __forceinline__ float pa_warp_max(float x) {
#pragma unroll
    for (int o = PA_WARP / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(PA_FULL_MASK, x, o));
    return x;
}

/* ---- qk: scores[h, t] = scale * q[h] . k[t] for t < valid ----------------------------------- */
struct pa_qk_row {
    const pa_bf16* q;  /* [H, D] */
    const pa_bf16* k;  /* [BS, D] */
    float* scores;     /* [H, BS], tokens [0, valid) written */
    double scale;
    long long valid;
    long long heads, dim, block_size; /* consts */
};

/* grid (ceil(BS / W), 1, n), block (32, W, 1): warp blockIdx.x * W + threadIdx.y owns one token,
   keeps its key row in registers (lanes split D) and produces the token's score for every head. */
extern "C" __global__ void pa_qk(const pa_qk_row* rows) {
    const pa_qk_row& r = rows[blockIdx.z];
    const long long H = r.heads, D = r.dim, BS = r.block_size;
    /* qk_launch refuses D > PA_MAX_DIM and always makes 32-lane warps: any other geometry
       writes nothing (never a trap: that would fault the context for every library in it). */
    if (D > PA_MAX_DIM || blockDim.x != PA_WARP) return;
    const long long valid = pa_clamp(r.valid, BS);
    const long long t = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (t >= valid) return; /* the whole warp: t is uniform in it */
    const unsigned int lane = threadIdx.x;
    const pa_bf16* kt = r.k + t * D;
    float kr[PA_DIM_PER_LANE];
#pragma unroll
    for (int j = 0; j < PA_DIM_PER_LANE; ++j) {
        const long long d = lane + (long long)PA_WARP * j;
        kr[j] = d < D ? pa_bf16_to_f32(kt[d]) : 0.0f;
    }
    const float scale = (float)r.scale;
    for (long long h = 0; h < H; ++h) {
        const pa_bf16* qh = r.q + h * D;
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < PA_DIM_PER_LANE; ++j) {
            const long long d = lane + (long long)PA_WARP * j;
            if (d < D) part += pa_bf16_to_f32(qh[d]) * kr[j];
        }
        part = pa_warp_sum(part);
        if (lane == 0) r.scores[h * BS + t] = part * scale;
    }
}

/* ---- block_softmax: probs = bf16(exp(scores - rowmax)), stats = [rowmax, rowsum of probs] --- */
struct pa_softmax_row {
    const float* scores; /* [H, BS] */
    pa_bf16* probs;      /* [H, BS], tokens [0, valid) written, rounded to bfloat16 */
    float* stats;        /* [2, H] */
    long long valid;
    long long heads, block_size; /* consts */
};

/* grid (ceil(H / W), 1, n), block (32, W, 1): warp blockIdx.x * W + threadIdx.y owns one head,
   its lanes stride over the valid tokens. valid == 0 gives max -inf, sum 0 (numpy would raise). */
extern "C" __global__ void pa_block_softmax(const pa_softmax_row* rows) {
    const pa_softmax_row& r = rows[blockIdx.z];
    const long long H = r.heads, BS = r.block_size;
    if (blockDim.x != PA_WARP) return; /* never made by block_softmax_launch: write nothing */
    const long long h = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (h >= H) return; /* the whole warp */
    const long long valid = pa_clamp(r.valid, BS);
    const float* sc = r.scores + h * BS;
    pa_bf16* pr = r.probs + h * BS;
    const unsigned int lane = threadIdx.x;
    float m = pa_neg_inf();
    for (long long t = lane; t < valid; t += PA_WARP) m = fmaxf(m, sc[t]);
    m = pa_warp_max(m);
    float s = 0.0f;
    for (long long t = lane; t < valid; t += PA_WARP) {
        /* P is kept in the inputs' dtype (bfloat16); the row sum is of the rounded values. */
        const pa_bf16 p = pa_f32_to_bf16(expf(sc[t] - m));
        pr[t] = p;
        s += pa_bf16_to_f32(p);
    }
    s = pa_warp_sum(s);
    if (lane == 0) {
        r.stats[h] = m;
        r.stats[H + h] = s;
    }
}

/* ---- pv: block_out[h] = probs[h, :valid] @ v[:valid] ---------------------------------------- */
struct pa_pv_row {
    const pa_bf16* probs; /* [H, BS], bfloat16 */
    const pa_bf16* v;     /* [BS, D] */
    float* block_out;     /* [H, D], all written */
    long long valid;
    long long heads, dim, block_size; /* consts */
};

/* grid (ceil(H / PA_PV_HEADS), ceil(D / bx), n), block (bx, 1, 1): thread owns dim
   d = blockIdx.y * bx + threadIdx.x of heads [blockIdx.x * PA_PV_HEADS, + PA_PV_HEADS). */
extern "C" __global__ void pa_pv(const pa_pv_row* rows) {
    const pa_pv_row& r = rows[blockIdx.z];
    const long long H = r.heads, D = r.dim, BS = r.block_size;
    const long long d = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    const long long h0 = (long long)blockIdx.x * PA_PV_HEADS;
    if (d >= D || h0 >= H) return;
    const long long valid = pa_clamp(r.valid, BS);
    const long long nh = H - h0 < PA_PV_HEADS ? H - h0 : PA_PV_HEADS;
    const pa_bf16* p = r.probs + h0 * BS;
    float acc[PA_PV_HEADS];
#pragma unroll
    for (int j = 0; j < PA_PV_HEADS; ++j) acc[j] = 0.0f;
    for (long long t = 0; t < valid; ++t) {
        const float vt = pa_bf16_to_f32(r.v[t * D + d]);
#pragma unroll
        for (int j = 0; j < PA_PV_HEADS; ++j) {
            if (j < nh) acc[j] += pa_bf16_to_f32(p[j * BS + t]) * vt;
        }
    }
#pragma unroll
    for (int j = 0; j < PA_PV_HEADS; ++j) {
        if (j < nh) r.block_out[(h0 + j) * D + d] = acc[j];
    }
}

/* ---- online_update: fold one block's (max, sum, out) into the batch's running state --------- */
struct pa_update_row {
    const float* stats;     /* [2, H] */
    const float* block_out; /* [H, D] */
    float* m;               /* [H] */
    float* s;               /* [H] */
    float* acc;             /* [H, D] */
    long long first;
    long long heads, dim; /* consts */
};

/* grid (H, 1, n), block (bx, 1, 1): block blockIdx.x folds head h, its threads stride over D.
   Thread 0 replaces m[h] and s[h] only after every thread read m[h] (__syncthreads). */
extern "C" __global__ void pa_online_update(const pa_update_row* rows) {
    const pa_update_row& r = rows[blockIdx.z];
    const long long H = r.heads, D = r.dim;
    /* One writer per head: online_update_launch always makes a 1-D grid of 1-D blocks; any
       other geometry writes nothing (uniform per block, so every thread leaves before the
       __syncthreads below). */
    if (gridDim.y != 1 || blockDim.y != 1 || blockDim.z != 1) return;
    const long long h = blockIdx.x;
    if (h >= H) return; /* the whole block */
    const float m_blk = r.stats[h], s_blk = r.stats[H + h];
    const float* bo = r.block_out + h * D;
    float* acc = r.acc + h * D;
    if (r.first != 0) {
        for (long long d = threadIdx.x; d < D; d += blockDim.x) acc[d] = bo[d];
        if (threadIdx.x == 0) {
            r.m[h] = m_blk;
            r.s[h] = s_blk;
        }
        return;
    }
    const float m_old = r.m[h];
    const float m_new = fmaxf(m_old, m_blk);
    const float a_old = expf(m_old - m_new), a_blk = expf(m_blk - m_new);
    for (long long d = threadIdx.x; d < D; d += blockDim.x) acc[d] = acc[d] * a_old + bo[d] * a_blk;
    __syncthreads();
    if (threadIdx.x == 0) {
        r.s[h] = r.s[h] * a_old + s_blk * a_blk;
        r.m[h] = m_new;
    }
}

/* ---- normalize: out = acc / s ---------------------------------------------------------------- */
struct pa_normalize_row {
    const float* s;   /* [H] */
    const float* acc; /* [H, D] */
    float* out;       /* [H, D] */
    long long heads, dim; /* consts */
};

/* grid (ceil(H * D / bx), 1, n), block (bx, 1, 1): one element per thread. */
extern "C" __global__ void pa_normalize(const pa_normalize_row* rows) {
    const pa_normalize_row& r = rows[blockIdx.z];
    const long long H = r.heads, D = r.dim;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= H * D) return;
    r.out[i] = r.acc[i] / r.s[i / D];
}

/* ---- zero: out = 0 -------------------------------------------------------------------------- */
struct pa_zero_row {
    float* out;      /* [count] */
    long long count; /* const */
};

/* grid (ceil(count / bx), 1, n), block (bx, 1, 1): one element per thread. */
extern "C" __global__ void pa_zero(const pa_zero_row* rows) {
    const pa_zero_row& r = rows[blockIdx.z];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < r.count) r.out[i] = 0.0f;
}
"""

#: The CUDA C++ source of the six entries (self-contained; compile with NVRTC).
SOURCE = (
    "/* simpler: paged attention (decode) device kernels; see simpler.workloads.paged_attention_cuda */\n"
    + _DEFINES
    + _BODY
)


# -- launch functions (one call per submit, with the shapes of the task's views) --------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _size(shape: Sequence[int]) -> int:
    return int(np.prod([int(s) for s in shape], dtype=np.int64))


def _require(ok: bool, msg: str) -> None:
    """Refuses a submit the device code cannot run: an ``ArgumentError`` (a ``ValueError``) with
    ``msg``, which names the entry and the limit."""
    if not ok:
        raise sp.ArgumentError(msg)


def _mat(shape: Sequence[int], what: str) -> tuple[int, int]:
    """The (rows, cols) a numpy kernel reshapes a view to: its last two dims, leading dims 1."""
    shape = tuple(int(s) for s in shape)
    _require(len(shape) >= 2 and _size(shape[:-2]) == 1, f"{what} view {shape} is not [1.., rows, cols]")
    _require(shape[-2] >= 1 and shape[-1] >= 1, f"{what} view {shape} is empty")
    return shape[-2], shape[-1]


def _kv(shape: Sequence[int], what: str) -> tuple[int, int]:
    """(BS, D) of a key / value block view [1, BS, 1, D]."""
    shape = tuple(int(s) for s in shape)
    _require(
        len(shape) == 4 and shape[0] == 1 and shape[2] == 1 and shape[1] >= 1 and shape[3] >= 1,
        f"{what} view {shape} is not [1, BS, 1, D]",
    )
    return shape[1], shape[3]


def _dim_threads(dim: int) -> int:
    return min(DIM_THREADS, _cdiv(dim, WARP) * WARP)


def _launch(
    entry: str, grid: tuple[int, int, int], block: tuple[int, int, int], consts: tuple[int, ...]
) -> dict:
    """The launch dict of ``entry``, refused when its per-task grid is past the device's limits
    (:data:`MAX_GRID_X`, :data:`MAX_GRID_Y`; the message gives the grid and the consts it
    came from)."""
    _require(
        grid[0] <= MAX_GRID_X and grid[1] <= MAX_GRID_Y,
        f"{entry}: grid {grid} is past the device's limits (x <= {MAX_GRID_X}, y <= {MAX_GRID_Y}) "
        f"for consts {consts}",
    )
    return {"grid": grid, "block": block, "shared": 0, "consts": consts}


def qk_launch(q_shape: Sequence[int], k_shape: Sequence[int], scores_shape: Sequence[int]) -> dict:
    """``pa_qk``: a warp per token (:data:`WARPS` per block), consts ``(H, D, BS)``; refuses
    ``D > MAX_HEAD_DIM``."""
    heads, dim = _mat(q_shape, "pa_qk: q")
    block_size, k_dim = _kv(k_shape, "pa_qk: k")
    _require(k_dim == dim, f"pa_qk: q {tuple(q_shape)} and k {tuple(k_shape)} differ in D")
    _require(
        _mat(scores_shape, "pa_qk: scores") == (heads, block_size),
        f"pa_qk: scores view {tuple(scores_shape)} != [1, H, BS]",
    )
    _require(
        dim <= MAX_HEAD_DIM,
        f"pa_qk: head dimension D = {dim} is past the kernel's limit MAX_HEAD_DIM = {MAX_HEAD_DIM} "
        "(a key row is held in registers)",
    )
    return _launch("pa_qk", (_cdiv(block_size, WARPS), 1, 1), (WARP, WARPS, 1), (heads, dim, block_size))


def block_softmax_launch(
    scores_shape: Sequence[int], probs_shape: Sequence[int], stats_shape: Sequence[int]
) -> dict:
    """``pa_block_softmax``: a warp per head (:data:`WARPS` per block), consts ``(H, BS)``."""
    heads, block_size = _mat(scores_shape, "pa_block_softmax: scores")
    _require(
        _mat(probs_shape, "pa_block_softmax: probs") == (heads, block_size),
        f"pa_block_softmax: probs view {tuple(probs_shape)} != scores'",
    )
    _require(
        _size(stats_shape) == 2 * heads, f"pa_block_softmax: stats view {tuple(stats_shape)} is not [1, 2, H]"
    )
    return _launch("pa_block_softmax", (_cdiv(heads, WARPS), 1, 1), (WARP, WARPS, 1), (heads, block_size))


def pv_launch(probs_shape: Sequence[int], v_shape: Sequence[int], block_out_shape: Sequence[int]) -> dict:
    """``pa_pv``: a thread per (:data:`PV_HEADS` heads, d), consts ``(H, D, BS)``."""
    heads, block_size = _mat(probs_shape, "pa_pv: probs")
    v_block, dim = _kv(v_shape, "pa_pv: v")
    _require(v_block == block_size, f"pa_pv: probs {tuple(probs_shape)} and v {tuple(v_shape)} differ in BS")
    _require(
        _mat(block_out_shape, "pa_pv: block_out") == (heads, dim),
        f"pa_pv: block_out view {tuple(block_out_shape)} != [1, H, D]",
    )
    bx = _dim_threads(dim)
    return _launch("pa_pv", (_cdiv(heads, PV_HEADS), _cdiv(dim, bx), 1), (bx, 1, 1), (heads, dim, block_size))


def online_update_launch(
    stats_shape: Sequence[int],
    block_out_shape: Sequence[int],
    m_shape: Sequence[int],
    s_shape: Sequence[int],
    acc_shape: Sequence[int],
) -> dict:
    """``pa_online_update``: a block per head, consts ``(H, D)``."""
    heads, dim = _mat(block_out_shape, "pa_online_update: block_out")
    _require(
        _size(stats_shape) == 2 * heads,
        f"pa_online_update: stats view {tuple(stats_shape)} is not [1, 2, H]",
    )
    _require(
        _size(m_shape) == heads and _size(s_shape) == heads,
        f"pa_online_update: running max / sum views != [1, {heads}]",
    )
    _require(
        _mat(acc_shape, "pa_online_update: acc") == (heads, dim),
        f"pa_online_update: acc view {tuple(acc_shape)} != block_out's",
    )
    return _launch("pa_online_update", (heads, 1, 1), (_dim_threads(dim), 1, 1), (heads, dim))


def normalize_launch(s_shape: Sequence[int], acc_shape: Sequence[int], out_shape: Sequence[int]) -> dict:
    """``pa_normalize``: a thread per element, consts ``(H, D)``."""
    heads, dim = _mat(acc_shape, "pa_normalize: acc")
    _require(_size(s_shape) == heads, f"pa_normalize: sum view {tuple(s_shape)} != [1, {heads}]")
    _require(
        _mat(out_shape, "pa_normalize: out") == (heads, dim),
        f"pa_normalize: out view {tuple(out_shape)} != acc's",
    )
    grid = (_cdiv(heads * dim, FLAT_THREADS), 1, 1)
    return _launch("pa_normalize", grid, (FLAT_THREADS, 1, 1), (heads, dim))


def zero_launch(out_shape: Sequence[int]) -> dict:
    """``pa_zero``: a thread per element, consts ``(count,)``."""
    count = _size(out_shape)
    _require(count >= 1, f"pa_zero: out view {tuple(out_shape)} is empty")
    return _launch("pa_zero", (_cdiv(count, FLAT_THREADS), 1, 1), (FLAT_THREADS, 1, 1), (count,))


#: Entry name -> its ``entry``, the kinds of the task scalars (in submit order) and its launch
#: function. The numpy kernel of entry ``pa_<name>`` is the ``Kernel`` named ``<name>`` in
#: :mod:`simpler.workloads.paged_attention`.
KERNELS: dict[str, dict] = {
    "pa_qk": {"entry": "pa_qk", "scalars": ("float64", "int64"), "launch": qk_launch},
    "pa_block_softmax": {"entry": "pa_block_softmax", "scalars": ("int64",), "launch": block_softmax_launch},
    "pa_pv": {"entry": "pa_pv", "scalars": ("int64",), "launch": pv_launch},
    "pa_online_update": {"entry": "pa_online_update", "scalars": ("int64",), "launch": online_update_launch},
    "pa_normalize": {"entry": "pa_normalize", "scalars": (), "launch": normalize_launch},
    "pa_zero": {"entry": "pa_zero", "scalars": (), "launch": zero_launch},
}


def cuda_code(entry: str) -> sp.CudaCode:
    """The :class:`simpler.CudaCode` of ``entry`` (one of :data:`KERNELS`): :data:`SOURCE`
    compiled with NVRTC, launched with the entry's launch function, once per submit call."""
    spec = KERNELS[entry]
    shape_launch = spec["launch"]

    def launch(*shapes: Sequence[int]) -> sp.Launch:
        d = shape_launch(*shapes)
        return sp.Launch(d["grid"], d["block"], d["shared"], d["consts"])

    launch.__name__ = f"{entry}_launch"
    # The entries read dense row-major views (only each view's first address travels).
    return sp.CudaCode(SOURCE, entry=entry, launch=launch, scalars=spec["scalars"], contiguous=True)


def _reference():
    """:mod:`simpler.workloads.paged_attention` (imported when first needed: it imports this
    module), whose numpy kernels are the reference the host implementations share math with."""
    from . import paged_attention

    return paged_attention


# -- host implementations for the fake libcuda --------------------------------------------------
#
# Each does what its entry does, task by task: it decodes the rows as the device code declares
# them, takes the dims from the consts, covers what the launch grid covers, and writes nothing
# where the device code returns early (a geometry the launch functions never make; no fault, as
# on the device). Tasks of one launch are checked for races (see fake_cuda).

_F32 = np.dtype(np.float32)


def _bf16() -> np.dtype:
    """bfloat16 (``ml_dtypes`` is imported at the first launch that reads or writes it)."""
    return sp.np_dtype("bfloat16")


def _clamp(valid: int, n: int) -> int:
    return max(0, min(valid, n))


def _warp_block(launch: Launch) -> bool:
    """Whether the launch's blocks are rows of 32-lane warps, as ``pa_qk`` and
    ``pa_block_softmax`` need (they return at once otherwise)."""
    return launch.block[0] == WARP


def _span(addr: int, rows: int, stride: int, cols: int, itemsize: int) -> int:
    """Bytes from ``addr`` to the end of element ``(rows - 1, cols - 1)`` of a strided matrix."""
    return 0 if rows <= 0 or cols <= 0 else ((rows - 1) * stride + cols) * itemsize


@fake_cuda.host_impl("pa_qk")
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


@fake_cuda.host_impl("pa_block_softmax")
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


@fake_cuda.host_impl("pa_pv")
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


@fake_cuda.host_impl("pa_online_update")
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
        _reference().UPDATE.fn(st, bo, m, s, acc, first)


@fake_cuda.host_impl("pa_normalize")
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


@fake_cuda.host_impl("pa_zero")
def _host_zero(launch: Launch) -> None:
    """Host ``pa_zero``: row (out, count)."""
    rows = launch.rows(2)
    covered = launch.grid[0] * launch.block[0]
    tasks = [(int(row[0]), max(0, min(Launch.i64(row[1]), covered))) for row in rows]
    launch.check_races([Region(out_at, n * 4, True, "out")] for out_at, n in tasks)
    for out_at, n in tasks:
        if n:
            launch.array(out_at, (n,), _F32)[...] = 0.0
