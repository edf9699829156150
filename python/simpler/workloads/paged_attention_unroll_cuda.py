"""CUDA device code for the unrolled paged attention (:mod:`simpler.workloads.paged_attention_unroll`).

Each of the four group kernels there (``qk``, ``softmax``, ``pv``, ``update``) has a device entry
here (``pu_qk``, ...) computing the same thing on the same views: :data:`SOURCE` is one
self-contained CUDA C++ translation unit (no ``#include``: bfloat16 travels as ``unsigned short``)
holding all four, and :data:`KERNELS` gives each entry's scalar kinds and launch function. The
module also registers a host implementation of every entry for the fake libcuda CI runs over
(:mod:`simpler.testing.fake_cuda`). The ABI is the runtime's (``docs/device-kernels.md``): one
parameter, the address of the launch's first task row; a row holds the views' addresses, the
task's scalars, then the launch function's consts; task ``blockIdx.z`` reads ``rows[blockIdx.z]``.

Shapes (per task view): ``q`` [1, QT, D] bf16, ``key_cache`` / ``value_cache`` the whole cache
[NB, BS, 1, D] bf16, ``ids`` [1, n] int32 (the group's slice of the block table), ``scores``
[1, n, QT, BS] f32 and ``probs`` [1, n, QT, BS] bf16 (one tile per block), ``m`` / ``l``
[1, QT] f32, ``oi`` / ``acc`` / ``out`` [1, QT, D] f32.

=================  =====================  =====================  ==================================
entry              row fields             consts                 per-task grid / block
=================  =====================  =====================  ==================================
``pu_qk``          q, key_cache, ids,     QT, D, BS, n, NB       (n, 1, 1) / (128, 1, 1): a CTA per
                   scores                                        block; Q and the K block staged in
                                                                 shared memory with 16-byte loads,
                                                                 bf16 ``mma.sync`` m16n8k16
``pu_softmax``     scores, probs, m, l,   QT, BS, n              (QT, 1, 1) / (256, 1, 1): a CTA per
                   scale, valid_last                             head row; the row (up to 8,192
                                                                 scores) held in registers
``pu_pv``          probs, value_cache,    QT, D, BS, n, NB       (ceil(D / 16), 1, 1) / (512, 1, 1):
                   ids, oi                                       a CTA per 16 columns of D, its 16
                                                                 warps splitting the blocks; V staged
                                                                 with 16-byte loads, bf16 ``mma.sync``,
                                                                 partials summed in shared memory
``pu_update``      m_g, l_g, oi_g, m, l,  QT, D                  (QT, 1, 1) / (bx, 1, 1): a CTA per
                   acc, out, first, last                         head row
=================  =====================  =====================  ==================================

``mma.sync`` needs compute capability 8.0; below it the same fragments are computed with scalar
FMAs (``__CUDA_ARCH__ < 800``). Summation orders differ from numpy's, so device results agree
with the numpy kernels to float32 rounding (the scores) and to one bfloat16 rounding step of P
where an exponential lands on a rounding boundary, not bit for bit.

No entry traps: the launch functions refuse, at submit, every geometry the code cannot run (``D``
past :data:`MAX_HEAD_DIM`, ``QT`` past :data:`MAX_Q_TILE`, views of the wrong shapes), and an
entry launched otherwise returns without writing. A block id outside the cache (the block table
is data, so the launch functions cannot see it) makes ``pu_qk`` and ``pu_pv`` skip that block:
its scores are left unwritten and its V rows are not read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import simpler as sp

from ..testing import fake_cuda
from ..testing.fake_cuda import Launch, Region

#: The largest head dimension the entries take (the QK tile in shared memory).
MAX_HEAD_DIM = 256
#: The most query heads of one task (upstream's ``q_tile`` limit).
MAX_Q_TILE = 128
#: Threads of a ``pu_qk`` CTA (4 warps) and of a ``pu_softmax`` CTA (8 warps).
QK_THREADS = 128
ROW_THREADS = 256
#: Columns of D one ``pu_pv`` CTA computes (two 8-wide ``mma`` tiles), and its threads (16 warps).
PV_COLS = 16
PV_THREADS = 512
#: Scores of one softmax row held in registers (256 threads x 32); longer rows are read twice.
SOFTMAX_REGS = ROW_THREADS * 32
#: Most threads of a ``pu_update`` CTA.
UPDATE_THREADS = 128
WARP = 32
#: The most dynamic shared memory a launch asks for (the H200's opt-in limit per block).
MAX_SHARED = 227 << 10

_DEFINES = f"""
#define PU_MAX_DIM {MAX_HEAD_DIM}
#define PU_MAX_QT {MAX_Q_TILE}
#define PU_QK_THREADS {QK_THREADS}
#define PU_ROW_THREADS {ROW_THREADS}
#define PU_PV_COLS {PV_COLS}
#define PU_PV_THREADS {PV_THREADS}
#define PU_UPDATE_THREADS {UPDATE_THREADS}
"""

_BODY = r"""
#define PU_FULL 0xffffffffu
#define PU_ROW_ITEMS 8 /* float4 per thread held by pu_softmax: 32 scores */
#define PU_PV_WARPS (PU_PV_THREADS / 32)
#define PU_PV_NT (PU_PV_COLS / 8) /* 8-wide mma column tiles per pu_pv CTA */
#define PU_PV_STEP 32 /* tokens a pu_pv warp stages at once */
#define PU_PV_LD (PU_PV_COLS + 8) /* bf16 per staged V row (padded) */

typedef unsigned short pu_bf16; /* bfloat16 bits */
struct alignas(16) pu_u4 { unsigned int x, y, z, w; };
struct alignas(16) pu_f4 { float x, y, z, w; };
struct alignas(8) pu_u2 { unsigned int x, y; };

static __device__ __forceinline__ float pu_f(pu_bf16 u) { return __uint_as_float(((unsigned int)u) << 16); }

/* float32 -> bfloat16 bits, round to nearest even (finite inputs). */
static __device__ __forceinline__ pu_bf16 pu_b(float f) {
    const unsigned int u = __float_as_uint(f);
    return (pu_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float pu_neg_inf() { return __uint_as_float(0xff800000u); }

static __device__ __forceinline__ unsigned int pu_ld32(const pu_bf16* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}

static __device__ __forceinline__ unsigned int pu_pack(pu_bf16 lo, pu_bf16 hi) {
    return (unsigned int)lo | ((unsigned int)hi << 16);
}

/* c (16 x 8, f32) += a (16 x 16, bf16, row-major fragments) * b (16 x 8, bf16, column fragments):
   lane = 4 * g + t holds a = {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
   b = {B[2t..][g], B[2t+8..][g]}, c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}
   (pairs packed low element first). */
static __device__ __forceinline__ void pu_mma(float* c, const unsigned int* a, const unsigned int* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    /* The same product without tensor cores: gather the fragments across the warp. */
    const unsigned int lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    for (int e = 0; e < 4; ++e) {
        const unsigned int row = g + (e >= 2 ? 8u : 0u), col = 2u * t + (e & 1);
        float s = 0.0f;
#pragma unroll 1
        for (unsigned int k = 0; k < 16; ++k) {
            /* A[row][k] lives in lane 4 * (row % 8) + (k % 8) / 2, register (row >= 8) + 2 * (k >= 8). */
            const unsigned int a_src = 4u * (row & 7u) + ((k & 7u) >> 1);
            const unsigned int a_reg = (row >> 3) + 2u * (k >> 3);
            unsigned int av = 0;
            for (unsigned int r = 0; r < 4; ++r) {
                const unsigned int v = __shfl_sync(PU_FULL, a[r], a_src);
                if (r == a_reg) av = v;
            }
            /* B[k][col] lives in lane 4 * col + (k % 8) / 2, register k >= 8. */
            const unsigned int b_src = 4u * col + ((k & 7u) >> 1);
            const unsigned int bv0 = __shfl_sync(PU_FULL, b[0], b_src);
            const unsigned int bv1 = __shfl_sync(PU_FULL, b[1], b_src);
            const unsigned int bv = k >= 8 ? bv1 : bv0;
            const pu_bf16 ah = (pu_bf16)((k & 1u) ? (av >> 16) : (av & 0xffffu));
            const pu_bf16 bh = (pu_bf16)((k & 1u) ? (bv >> 16) : (bv & 0xffffu));
            s += pu_f(ah) * pu_f(bh);
        }
        c[e] += s;
    }
#endif
}

/* rows x cols bf16 (row stride cols) from global into shared rows_pad x cols_pad (row stride ld),
   zeros outside; 16-byte loads when every row starts 16-byte aligned. */
static __device__ void pu_stage(pu_bf16* dst, const pu_bf16* src, int rows, int rows_pad, int cols,
                                int cols_pad, int ld) {
    if ((cols & 7) == 0 && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0) {
        const int per_row = cols_pad >> 3;
        for (int i = threadIdx.x; i < rows_pad * per_row; i += blockDim.x) {
            const int rr = i / per_row, cc = (i - rr * per_row) << 3;
            pu_u4 v = {0u, 0u, 0u, 0u};
            if (rr < rows && cc < cols) v = *reinterpret_cast<const pu_u4*>(src + (long long)rr * cols + cc);
            *reinterpret_cast<pu_u4*>(dst + rr * ld + cc) = v;
        }
    } else {
        for (int i = threadIdx.x; i < rows_pad * cols_pad; i += blockDim.x) {
            const int rr = i / cols_pad, cc = i - rr * cols_pad;
            dst[rr * ld + cc] = (rr < rows && cc < cols) ? src[(long long)rr * cols + cc] : (pu_bf16)0;
        }
    }
}

static __device__ __forceinline__ float pu_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(PU_FULL, x, o);
    return x;
}

static __device__ __forceinline__ float pu_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(PU_FULL, x, o));
    return x;
}

/* A block-wide reduction of x (sum, or max when is_max) over PU_ROW_THREADS threads. */
static __device__ float pu_block_reduce(float x, bool is_max, float* scratch) {
    x = is_max ? pu_warp_max(x) : pu_warp_sum(x);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* scratch may still be read by a previous reduction */
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x >> 5) ? scratch[lane] : (is_max ? pu_neg_inf() : 0.0f);
    return is_max ? pu_warp_max(x) : pu_warp_sum(x);
}

/* ---- qk: scores[j, h, t] = q[h] . K[ids[j], t] ------------------------------------------------ */
struct pu_qk_row {
    const pu_bf16* q;   /* [QT, D] */
    const pu_bf16* kc;  /* [NB, BS, 1, D] */
    const int* ids;     /* [n] */
    float* scores;      /* [n, QT, BS] */
    long long qt, dim, bs, n, nb; /* consts */
};

/* grid (n, 1, tasks), block (PU_QK_THREADS): CTA j stages Q (rows padded to 16) and block ids[j]
   (tokens padded to 8, D to 16) in shared memory; each warp computes 16 x 8 tiles of S. */
extern "C" __global__ void __launch_bounds__(PU_QK_THREADS) pu_qk(const pu_qk_row* rows) {
    const pu_qk_row& r = rows[blockIdx.z];
    const int QT = (int)r.qt, D = (int)r.dim, BS = (int)r.bs;
    if (blockDim.x != PU_QK_THREADS || blockDim.y != 1 || D > PU_MAX_DIM || QT > PU_MAX_QT) return;
    const long long j = blockIdx.x;
    if (j >= r.n) return;
    const long long id = r.ids[j];
    if (id < 0 || id >= r.nb) return; /* a block outside the cache: nothing written */
    extern __shared__ pu_u4 pu_smem_qk[];
    const int DK = (D + 15) & ~15, LD = DK + 8, MT = (QT + 15) >> 4, NT = (BS + 7) >> 3;
    pu_bf16* qs = reinterpret_cast<pu_bf16*>(pu_smem_qk);
    pu_bf16* ks = qs + MT * 16 * LD;
    pu_stage(qs, r.q, QT, MT * 16, D, DK, LD);
    pu_stage(ks, r.kc + id * BS * D, BS, NT * 8, D, DK, LD);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float* out = r.scores + j * QT * BS;
    for (int tile = warp; tile < MT * NT; tile += PU_QK_THREADS / 32) {
        const int mt = tile / NT, nt = tile - mt * NT;
        const pu_bf16* a_lo = qs + (mt * 16 + g) * LD + 2 * t;
        const pu_bf16* a_hi = a_lo + 8 * LD;
        const pu_bf16* b_p = ks + (nt * 8 + g) * LD + 2 * t; /* B[k][n] = K[token n][k] */
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < DK; k0 += 16) {
            const unsigned int a[4] = {pu_ld32(a_lo + k0), pu_ld32(a_hi + k0), pu_ld32(a_lo + k0 + 8),
                                       pu_ld32(a_hi + k0 + 8)};
            const unsigned int b[2] = {pu_ld32(b_p + k0), pu_ld32(b_p + k0 + 8)};
            pu_mma(c, a, b);
        }
        const int row = mt * 16 + g, col = nt * 8 + 2 * t;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int rr = row + (e >= 2 ? 8 : 0), cc = col + (e & 1);
            if (rr < QT && cc < BS) out[(long long)rr * BS + cc] = c[e];
        }
    }
}

/* ---- softmax: one max per group, P rounded to bfloat16, the row sums of the rounded P --------- */
struct pu_softmax_row {
    const float* scores; /* [n, QT, BS] */
    pu_bf16* probs;      /* [n, QT, BS] */
    float* m;            /* [QT] */
    float* l;            /* [QT] */
    double scale;
    long long valid; /* valid tokens of the last block */
    long long qt, bs, n; /* consts */
};

/* grid (QT, 1, tasks), block (PU_ROW_THREADS): CTA h owns head row h of every block. Element e of
   the row is token e % BS of block e / BS; with BS % 4 == 0 the row is read as float4, and a row
   of at most PU_ROW_THREADS * 32 scores is read once and kept in registers. */
extern "C" __global__ void __launch_bounds__(PU_ROW_THREADS) pu_softmax(const pu_softmax_row* rows) {
    const pu_softmax_row& r = rows[blockIdx.z];
    if (blockDim.x != PU_ROW_THREADS || blockDim.y != 1) return;
    const long long QT = r.qt, BS = r.bs, N = r.n, h = blockIdx.x;
    if (h >= QT || N < 1) return;
    __shared__ float red[PU_ROW_THREADS / 32];
    const long long valid = r.valid < 0 ? 0 : (r.valid > BS ? BS : r.valid);
    const long long L = N * BS, last0 = (N - 1) * BS; /* tokens from last0 + valid on are masked */
    const float sc = (float)r.scale;
    const bool vec = (BS & 3) == 0 && (reinterpret_cast<unsigned long long>(r.scores) & 15ull) == 0 &&
                     (reinterpret_cast<unsigned long long>(r.probs) & 7ull) == 0;
    float mx = pu_neg_inf();
    if (vec && L <= (long long)PU_ROW_THREADS * 4 * PU_ROW_ITEMS) {
        pu_f4 v[PU_ROW_ITEMS];
#pragma unroll
        for (int i = 0; i < PU_ROW_ITEMS; ++i) {
            const long long e = ((long long)i * PU_ROW_THREADS + threadIdx.x) * 4;
            pu_f4 x = {pu_neg_inf(), pu_neg_inf(), pu_neg_inf(), pu_neg_inf()};
            if (e < L) {
                const long long jb = e / BS, t = e - jb * BS;
                x = *reinterpret_cast<const pu_f4*>(r.scores + (jb * QT + h) * BS + t);
                x.x = (e + 0 - last0 >= valid) ? pu_neg_inf() : x.x * sc;
                x.y = (e + 1 - last0 >= valid) ? pu_neg_inf() : x.y * sc;
                x.z = (e + 2 - last0 >= valid) ? pu_neg_inf() : x.z * sc;
                x.w = (e + 3 - last0 >= valid) ? pu_neg_inf() : x.w * sc;
            }
            v[i] = x;
            mx = fmaxf(mx, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
        }
        mx = pu_block_reduce(mx, true, red);
        const bool none = mx == pu_neg_inf();
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < PU_ROW_ITEMS; ++i) {
            const long long e = ((long long)i * PU_ROW_THREADS + threadIdx.x) * 4;
            if (e < L) {
                const long long jb = e / BS, t = e - jb * BS;
                const pu_bf16 p0 = none ? (pu_bf16)0 : pu_b(expf(v[i].x - mx));
                const pu_bf16 p1 = none ? (pu_bf16)0 : pu_b(expf(v[i].y - mx));
                const pu_bf16 p2 = none ? (pu_bf16)0 : pu_b(expf(v[i].z - mx));
                const pu_bf16 p3 = none ? (pu_bf16)0 : pu_b(expf(v[i].w - mx));
                const pu_u2 packed = {pu_pack(p0, p1), pu_pack(p2, p3)};
                *reinterpret_cast<pu_u2*>(r.probs + (jb * QT + h) * BS + t) = packed;
                sum += (pu_f(p0) + pu_f(p1)) + (pu_f(p2) + pu_f(p3));
            }
        }
        sum = pu_block_reduce(sum, false, red);
        if (threadIdx.x == 0) {
            r.m[h] = mx;
            r.l[h] = sum;
        }
        return;
    }
    /* Any BS, any length: two passes over global memory. */
    for (long long e = threadIdx.x; e < L; e += PU_ROW_THREADS) {
        if (e - last0 >= valid) continue;
        const long long jb = e / BS, t = e - jb * BS;
        mx = fmaxf(mx, r.scores[(jb * QT + h) * BS + t] * sc);
    }
    mx = pu_block_reduce(mx, true, red);
    const bool none = mx == pu_neg_inf();
    float sum = 0.0f;
    for (long long e = threadIdx.x; e < L; e += PU_ROW_THREADS) {
        const long long jb = e / BS, t = e - jb * BS, at = (jb * QT + h) * BS + t;
        const pu_bf16 p = (none || e - last0 >= valid) ? (pu_bf16)0 : pu_b(expf(r.scores[at] * sc - mx));
        r.probs[at] = p;
        sum += pu_f(p);
    }
    sum = pu_block_reduce(sum, false, red);
    if (threadIdx.x == 0) {
        r.m[h] = mx;
        r.l[h] = sum;
    }
}

/* ---- pv: oi[h] = sum over blocks j of P[j, h] @ V[ids[j]] -------------------------------------- */
struct pu_pv_row {
    const pu_bf16* probs; /* [n, QT, BS] */
    const pu_bf16* vc;    /* [NB, BS, 1, D] */
    const int* ids;       /* [n] */
    float* oi;            /* [QT, D] */
    long long qt, dim, bs, n, nb; /* consts */
};

/* grid (ceil(D / PU_PV_COLS), 1, tasks), block (PU_PV_THREADS): CTA x computes columns
   [x * 16, x * 16 + 16) of oi. Warp w takes blocks w, w + 16, ...; per PU_PV_STEP tokens it stages
   its V rows' 16 columns in shared memory (16-byte loads), reads P fragments from global memory,
   and accumulates 16 x 8 tiles with mma (RT row tiles at once; more rows take more passes over
   V). The warps' partials are summed in shared memory, then written. 16 warps per 16 columns:
   a task of D = 128 is 4,096 threads, so a few dozen tasks fill the device. */
template <int RT>
static __device__ void pu_pv_body(const pu_pv_row& r) {
    const int QT = (int)r.qt, D = (int)r.dim, BS = (int)r.bs;
    if (blockDim.x != PU_PV_THREADS || blockDim.y != 1 || D > PU_MAX_DIM || QT > PU_MAX_QT) return;
    const int d0 = blockIdx.x * PU_PV_COLS;
    if (d0 >= D) return;
    __shared__ float acc[PU_MAX_QT * PU_PV_COLS];
    __shared__ pu_u4 vs_raw[PU_PV_WARPS * PU_PV_STEP * PU_PV_LD / 8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = threadIdx.x; i < QT * PU_PV_COLS; i += PU_PV_THREADS) acc[i] = 0.0f;
    __syncthreads();
    const int MT = (QT + 15) >> 4;
    const int cols = D - d0 < PU_PV_COLS ? D - d0 : PU_PV_COLS;
    const bool vec =
        cols == PU_PV_COLS && (D & 7) == 0 && (reinterpret_cast<unsigned long long>(r.vc) & 15ull) == 0;
    const bool p_pairs = (BS & 1) == 0 && (reinterpret_cast<unsigned long long>(r.probs) & 3ull) == 0;
    pu_bf16* my = reinterpret_cast<pu_bf16*>(vs_raw) + warp * PU_PV_STEP * PU_PV_LD;
    for (int mt0 = 0; mt0 < MT; mt0 += RT) {
        float c[RT][PU_PV_NT][4]; /* [row tile][column tile][fragment] */
#pragma unroll
        for (int a = 0; a < RT; ++a)
#pragma unroll
            for (int b = 0; b < PU_PV_NT; ++b)
#pragma unroll
                for (int e = 0; e < 4; ++e) c[a][b][e] = 0.0f;
        for (long long j = warp; j < r.n; j += PU_PV_WARPS) {
            const long long id = r.ids[j];
            if (id < 0 || id >= r.nb) continue; /* a block outside the cache: not read */
            const pu_bf16* vb = r.vc + id * BS * D + d0;
            const pu_bf16* pb = r.probs + j * QT * BS;
            for (int s0 = 0; s0 < BS; s0 += PU_PV_STEP) {
                __syncwarp();
                if (vec) {
                    /* PU_PV_STEP rows x 16 columns = 2 x 16 bytes per row */
#pragma unroll
                    for (int i = 0; i < PU_PV_STEP * 2 / 32; ++i) {
                        const int q = i * 32 + lane, rr = q >> 1, cc = (q & 1) << 3;
                        pu_u4 v = {0u, 0u, 0u, 0u};
                        const pu_bf16* src = vb + (long long)(s0 + rr) * D + cc;
                        if (s0 + rr < BS) v = *reinterpret_cast<const pu_u4*>(src);
                        *reinterpret_cast<pu_u4*>(my + rr * PU_PV_LD + cc) = v;
                    }
                } else {
                    for (int q = lane; q < PU_PV_STEP * PU_PV_COLS; q += 32) {
                        const int rr = q / PU_PV_COLS, cc = q - rr * PU_PV_COLS;
                        my[rr * PU_PV_LD + cc] =
                            (s0 + rr < BS && cc < cols) ? vb[(long long)(s0 + rr) * D + cc] : (pu_bf16)0;
                    }
                }
                __syncwarp();
                for (int k0 = 0; k0 < PU_PV_STEP && s0 + k0 < BS; k0 += 16) {
                    /* B[k][n] = V[s0 + k0 + k][d0 + 8 * nt + n], from the staged rows */
                    unsigned int b[PU_PV_NT][2];
#pragma unroll
                    for (int nt = 0; nt < PU_PV_NT; ++nt) {
                        const pu_bf16* bp = my + (k0 + 2 * t) * PU_PV_LD + nt * 8 + g;
                        b[nt][0] = pu_pack(bp[0], bp[PU_PV_LD]);
                        b[nt][1] = pu_pack(bp[8 * PU_PV_LD], bp[9 * PU_PV_LD]);
                    }
                    const int kk = s0 + k0 + 2 * t; /* this lane's first token of the step */
#pragma unroll
                    for (int a = 0; a < RT; ++a) {
                        const int mt = mt0 + a;
                        if (mt >= MT) break;
                        const int r0 = mt * 16 + g, r1 = r0 + 8;
                        unsigned int af[4];
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int row = (q & 1) ? r1 : r0, tok = kk + ((q & 2) ? 8 : 0);
                            const pu_bf16* pp = pb + (long long)row * BS + tok;
                            if (row >= QT) {
                                af[q] = 0u;
                            } else if (p_pairs && tok + 1 < BS) {
                                af[q] = pu_ld32(pp);
                            } else {
                                const pu_bf16 lo = tok < BS ? pp[0] : (pu_bf16)0;
                                af[q] = pu_pack(lo, tok + 1 < BS ? pp[1] : (pu_bf16)0);
                            }
                        }
#pragma unroll
                        for (int nt = 0; nt < PU_PV_NT; ++nt) pu_mma(c[a][nt], af, b[nt]);
                    }
                }
            }
        }
#pragma unroll
        for (int a = 0; a < RT; ++a) {
            const int mt = mt0 + a;
            if (mt >= MT) break;
#pragma unroll
            for (int nt = 0; nt < PU_PV_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = mt * 16 + g + (e >= 2 ? 8 : 0), col = nt * 8 + 2 * t + (e & 1);
                    if (row < QT) atomicAdd(&acc[row * PU_PV_COLS + col], c[a][nt][e]);
                }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < QT * PU_PV_COLS; i += PU_PV_THREADS) {
        const int row = i / PU_PV_COLS, col = i - row * PU_PV_COLS;
        if (col < cols) r.oi[(long long)row * D + d0 + col] = acc[i];
    }
}

/* Up to 64 query heads per pass (4 row tiles of accumulators in registers); more take more passes
   over V. */
extern "C" __global__ void __launch_bounds__(PU_PV_THREADS) pu_pv(const pu_pv_row* rows) {
    pu_pv_body<4>(rows[blockIdx.z]);
}

/* At most 16 query heads (one row tile): a quarter of the accumulators. */
extern "C" __global__ void __launch_bounds__(PU_PV_THREADS, 2) pu_pv_m16(const pu_pv_row* rows) {
    pu_pv_body<1>(rows[blockIdx.z]);
}

/* ---- update: merge a group into the running (max, sum, output); the last writes out ---------- */
struct pu_update_row {
    const float* m_g;  /* [QT] */
    const float* l_g;  /* [QT] */
    const float* oi_g; /* [QT, D] */
    float* m;          /* [QT] */
    float* l;          /* [QT] */
    float* acc;        /* [QT, D] */
    float* out;        /* [QT, D] */
    long long first, last;
    long long qt, dim; /* consts */
};

/* grid (QT, 1, tasks), block (bx): CTA h merges head row h; thread 0 replaces m[h] and l[h] after
   every thread has read them (__syncthreads). */
extern "C" __global__ void __launch_bounds__(PU_UPDATE_THREADS) pu_update(const pu_update_row* rows) {
    const pu_update_row& r = rows[blockIdx.z];
    if (gridDim.y != 1 || blockDim.y != 1 || blockDim.z != 1) return;
    const long long QT = r.qt, D = r.dim, h = blockIdx.x;
    if (h >= QT) return;
    const float mg = r.m_g[h], lg = r.l_g[h];
    const float* og = r.oi_g + h * D;
    float* acc = r.acc + h * D;
    float* out = r.out + h * D;
    float m_new = mg, l_new = lg, a_old = 0.0f, a_grp = 1.0f;
    if (r.first == 0) {
        const float m_old = r.m[h];
        m_new = fmaxf(m_old, mg);
        a_old = expf(m_old - m_new);
        a_grp = expf(mg - m_new);
        l_new = r.l[h] * a_old + lg * a_grp;
    }
    for (long long d = threadIdx.x; d < D; d += blockDim.x) {
        const float v = r.first != 0 ? og[d] : acc[d] * a_old + og[d] * a_grp;
        acc[d] = v;
        if (r.last != 0) out[d] = v / l_new;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        r.m[h] = m_new;
        r.l[h] = l_new;
    }
}
"""

#: The CUDA C++ source of the four entries (self-contained; compile with NVRTC).
SOURCE = (
    "/* simpler: unrolled paged attention (decode) device kernels; see "
    "simpler.workloads.paged_attention_unroll_cuda */\n" + _DEFINES + _BODY
)


# -- launch functions (one call per submit, with the shapes of the task's views) ------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _require(ok: bool, msg: str) -> None:
    """Refuses a submit the device code cannot run (an ``ArgumentError`` naming the entry)."""
    if not ok:
        raise sp.ArgumentError(msg)


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _tiles(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """(n, QT, BS) of a scores / probs view [1, n, QT, BS]."""
    s = _shape(shape)
    _require(len(s) == 4 and s[0] == 1 and min(s) >= 1, f"{entry}: {what} view {s} is not [1, n, QT, BS]")
    return s[1], s[2], s[3]


def _cache(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """(NB, BS, D) of a whole cache [NB, BS, 1, D]."""
    s = _shape(shape)
    _require(len(s) == 4 and s[2] == 1 and min(s) >= 1, f"{entry}: {what} {s} is not [NB, BS, 1, D]")
    return s[0], s[1], s[3]


def _rowmat(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int]:
    """(QT, D) of a [1, QT, D] view."""
    s = _shape(shape)
    _require(len(s) == 3 and s[0] == 1 and min(s) >= 1, f"{entry}: {what} view {s} is not [1, QT, D]")
    return s[1], s[2]


def _vec(entry: str, what: str, shape: Sequence[int], n: int) -> None:
    s = _shape(shape)
    _require(len(s) == 2 and s[0] == 1 and s[1] == n, f"{entry}: {what} view {s} is not [1, {n}]")


def _limits(entry: str, qt: int, dim: int) -> None:
    _require(
        dim <= MAX_HEAD_DIM,
        f"{entry}: head dimension D = {dim} is past the kernel's limit MAX_HEAD_DIM = {MAX_HEAD_DIM}",
    )
    _require(qt <= MAX_Q_TILE, f"{entry}: {qt} query heads per task are past MAX_Q_TILE = {MAX_Q_TILE}")


def qk_shared(qt: int, dim: int, block_size: int) -> int:
    """Dynamic shared bytes of ``pu_qk``: Q (rows padded to 16) and a K block (tokens padded to
    8), each row ``roundup(D, 16) + 8`` bf16."""
    ld = _cdiv(dim, 16) * 16 + 8
    return (_cdiv(qt, 16) * 16 + _cdiv(block_size, 8) * 8) * ld * 2


def qk_launch(q_shape, kc_shape, ids_shape, scores_shape) -> dict:
    """``pu_qk``: a CTA per block of the group, consts ``(QT, D, BS, n, NB)``."""
    qt, dim = _rowmat("pu_qk", "q", q_shape)
    nb, bs, k_dim = _cache("pu_qk", "key_cache", kc_shape)
    n, s_qt, s_bs = _tiles("pu_qk", "scores", scores_shape)
    _require(k_dim == dim, f"pu_qk: q {_shape(q_shape)} and key_cache {_shape(kc_shape)} differ in D")
    _require((s_qt, s_bs) == (qt, bs), f"pu_qk: scores view {_shape(scores_shape)} != [1, n, {qt}, {bs}]")
    _vec("pu_qk", "ids", ids_shape, n)
    _limits("pu_qk", qt, dim)
    shared = qk_shared(qt, dim, bs)
    _require(shared <= MAX_SHARED, f"pu_qk: {shared} bytes of shared memory are past {MAX_SHARED}")
    return {"grid": (n, 1, 1), "block": (QK_THREADS, 1, 1), "shared": shared, "consts": (qt, dim, bs, n, nb)}


def softmax_launch(scores_shape, probs_shape, m_shape, l_shape) -> dict:
    """``pu_softmax``: a CTA per head row, consts ``(QT, BS, n)``."""
    n, qt, bs = _tiles("pu_softmax", "scores", scores_shape)
    _require(
        _tiles("pu_softmax", "probs", probs_shape) == (n, qt, bs),
        f"pu_softmax: probs view {_shape(probs_shape)} != scores'",
    )
    _vec("pu_softmax", "m", m_shape, qt)
    _vec("pu_softmax", "l", l_shape, qt)
    _require(qt <= MAX_Q_TILE, f"pu_softmax: {qt} query heads per task are past MAX_Q_TILE = {MAX_Q_TILE}")
    return {"grid": (qt, 1, 1), "block": (ROW_THREADS, 1, 1), "shared": 0, "consts": (qt, bs, n)}


def pv_launch(probs_shape, vc_shape, ids_shape, oi_shape) -> dict:
    """``pu_pv``: a CTA per 16 columns of D, consts ``(QT, D, BS, n, NB)``."""
    n, qt, bs = _tiles("pu_pv", "probs", probs_shape)
    nb, v_bs, dim = _cache("pu_pv", "value_cache", vc_shape)
    _require(
        v_bs == bs, f"pu_pv: probs {_shape(probs_shape)} and value_cache {_shape(vc_shape)} differ in BS"
    )
    _require(
        _rowmat("pu_pv", "oi", oi_shape) == (qt, dim),
        f"pu_pv: oi view {_shape(oi_shape)} != [1, {qt}, {dim}]",
    )
    _vec("pu_pv", "ids", ids_shape, n)
    _limits("pu_pv", qt, dim)
    grid = (_cdiv(dim, PV_COLS), 1, 1)
    return {"grid": grid, "block": (PV_THREADS, 1, 1), "shared": 0, "consts": (qt, dim, bs, n, nb)}


def update_launch(mg_shape, lg_shape, oig_shape, m_shape, l_shape, acc_shape, out_shape) -> dict:
    """``pu_update``: a CTA per head row, consts ``(QT, D)``."""
    qt, dim = _rowmat("pu_update", "oi_g", oig_shape)
    for what, shape in (("m_g", mg_shape), ("l_g", lg_shape), ("m", m_shape), ("l", l_shape)):
        _vec("pu_update", what, shape, qt)
    for what, shape in (("acc", acc_shape), ("out", out_shape)):
        _require(
            _rowmat("pu_update", what, shape) == (qt, dim),
            f"pu_update: {what} view {_shape(shape)} != [1, {qt}, {dim}]",
        )
    bx = min(UPDATE_THREADS, _cdiv(dim, WARP) * WARP)
    return {"grid": (qt, 1, 1), "block": (bx, 1, 1), "shared": 0, "consts": (qt, dim)}


#: Entry name -> its entry, the kinds of its task scalars (in submit order) and its launch
#: function; the numpy kernel of ``pu_<name>`` is the kernel named ``<name>`` in
#: :mod:`simpler.workloads.paged_attention_unroll`.
KERNELS: dict[str, dict] = {
    "pu_qk": {"scalars": (), "launch": qk_launch},
    "pu_softmax": {"scalars": ("float64", "int64"), "launch": softmax_launch},
    "pu_pv": {"scalars": (), "launch": pv_launch},
    "pu_pv_m16": {"scalars": (), "launch": pv_launch},
    "pu_update": {"scalars": ("int64", "int64"), "launch": update_launch},
}


def cuda_code(entry: str) -> sp.CudaCode:
    """The :class:`simpler.CudaCode` of ``entry``: :data:`SOURCE` compiled with NVRTC, launched with
    the entry's launch function once per submit call; every view is read as dense row-major."""
    spec = KERNELS[entry]
    shape_launch = spec["launch"]

    def launch(*shapes: Sequence[int]) -> sp.Launch:
        d = shape_launch(*shapes)
        return sp.Launch(d["grid"], d["block"], d["shared"], d["consts"])

    launch.__name__ = f"{entry}_launch"
    return sp.CudaCode(SOURCE, entry=entry, launch=launch, scalars=spec["scalars"], contiguous=True)


# -- host implementations for the fake libcuda ------------------------------------------------------
#
# Each does what its entry does, task by task: it decodes the rows as the device code declares
# them, covers what the launch grid covers, writes nothing where the device code returns early,
# and checks that no two tasks of the launch touch the same bytes with one of them writing.

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def _bf16() -> np.dtype:
    return sp.np_dtype("bfloat16")


def _reference():
    """:mod:`simpler.workloads.paged_attention_unroll` (imported when first needed: it imports
    this module), whose numpy kernels the host implementations share their math with."""
    from . import paged_attention_unroll

    return paged_attention_unroll


def _ids(launch: Launch, at: int, n: int, nb: int) -> np.ndarray:
    return launch.array(at, (n,), _I32).astype(np.int64)


@fake_cuda.host_impl("pu_qk")
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


@fake_cuda.host_impl("pu_softmax")
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
        _reference()._softmax(
            launch.array(sc_at, (n, qt, bs), _F32),
            launch.array(pr_at, (n, qt, bs), _bf16()),
            launch.array(m_at, (qt,), _F32),
            launch.array(l_at, (qt,), _F32),
            scale,
            valid,
        )


@fake_cuda.host_impl("pu_pv")
@fake_cuda.host_impl("pu_pv_m16")
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


@fake_cuda.host_impl("pu_update")
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
        _reference()._update(m_g, l_g, oi_g, m, s, acc, out, first, last)
