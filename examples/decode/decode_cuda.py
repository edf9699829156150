"""The decode step's kernels as device code for the cuda platform, and their stand-ins on the fake
libcuda (a GPU-less machine: the fake runs each launch through these numpy host functions).

Every kernel is one task per launch over contiguous views: a row holds each view's device
address, then its scalars (``float64`` / ``int64``), then the shape constants its launch function
computes from the views' shapes. One block of 128 threads per task: a small model's
matrix-vector products, written for clarity rather than speed. On sim and ascend the same
kernels run their numpy host functions (:mod:`decode`), so every platform computes the same
model.
"""

from __future__ import annotations

import math

import numpy as np

import simpler as sp
from simpler.testing import fake_cuda

SOURCE = r"""
#define TPB 128

struct norm_row { const float* x; const float* w; float* y; double eps; long long h; };
extern "C" __global__ void dec_rmsnorm(const norm_row* rows) {
    const norm_row r = rows[blockIdx.z];
    __shared__ float part[TPB];
    float s = 0.f;
    for (long long i = threadIdx.x; i < r.h; i += blockDim.x) s += r.x[i] * r.x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = rsqrtf(part[0] / (float)r.h + (float)r.eps);
    for (long long i = threadIdx.x; i < r.h; i += blockDim.x) r.y[i] = r.x[i] * inv * r.w[i];
}

// y[j] = sum_i x[i] * w[i * n + j] for j < n.
__device__ void matvec(const float* x, const float* w, float* y, long long m, long long n) {
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        float acc = 0.f;
        for (long long i = 0; i < m; ++i) acc += x[i] * w[i * n + j];
        y[j] = acc;
    }
}

struct qkv_row {
    const float* h; const float* wq; const float* wk; const float* wv;
    float* q; float* k; float* v; long long hidden, q_dim, kv_dim;
};
extern "C" __global__ void dec_qkv(const qkv_row* rows) {
    const qkv_row r = rows[blockIdx.z];
    matvec(r.h, r.wq, r.q, r.hidden, r.q_dim);
    matvec(r.h, r.wk, r.k, r.hidden, r.kv_dim);
    matvec(r.h, r.wv, r.v, r.hidden, r.kv_dim);
}

struct rope_row {
    const float* q; const float* k; float* q_rot; float* k_slot;
    long long t; double theta; long long heads, kv_heads, dim;
};
__device__ void rotate(const float* x, float* y, long long n, long long d, long long t, double theta) {
    const long long half = d / 2;
    for (long long e = threadIdx.x; e < n * half; e += blockDim.x) {
        const long long row = e / half, i = e % half;
        const double ang = (double)t * pow(theta, -(double)(2 * i) / (double)d);
        const float c = (float)cos(ang), s = (float)sin(ang);
        const float x1 = x[row * d + i], x2 = x[row * d + half + i];
        y[row * d + i] = x1 * c - x2 * s;
        y[row * d + half + i] = x2 * c + x1 * s;
    }
}
extern "C" __global__ void dec_rope(const rope_row* rows) {
    const rope_row r = rows[blockIdx.z];
    rotate(r.q, r.q_rot, r.heads, r.dim, r.t, r.theta);
    rotate(r.k, r.k_slot, r.kv_heads, r.dim, r.t, r.theta);
}

struct attn_row {
    const float* q; const float* k; const float* v; float* out;
    double scale; long long heads, kv_heads, dim, len;
};
// One thread per head: softmax(q . k / sqrt(d)) . v over the cache positions 0..len-1.
extern "C" __global__ void dec_attention(const attn_row* rows) {
    const attn_row r = rows[blockIdx.z];
    const long long group = r.heads / r.kv_heads;
    for (long long h = threadIdx.x; h < r.heads; h += blockDim.x) {
        const float* q = r.q + h * r.dim;
        const long long kvh = h / group;
        float top = -INFINITY;
        for (long long s = 0; s < r.len; ++s) {
            const float* k = r.k + (s * r.kv_heads + kvh) * r.dim;
            float dot = 0.f;
            for (long long i = 0; i < r.dim; ++i) dot += q[i] * k[i];
            top = fmaxf(top, dot * (float)r.scale);
        }
        float sum = 0.f;
        for (long long i = 0; i < r.dim; ++i) r.out[h * r.dim + i] = 0.f;
        for (long long s = 0; s < r.len; ++s) {
            const float* k = r.k + (s * r.kv_heads + kvh) * r.dim;
            const float* v = r.v + (s * r.kv_heads + kvh) * r.dim;
            float dot = 0.f;
            for (long long i = 0; i < r.dim; ++i) dot += q[i] * k[i];
            const float p = expf(dot * (float)r.scale - top);
            sum += p;
            for (long long i = 0; i < r.dim; ++i) r.out[h * r.dim + i] += p * v[i];
        }
        for (long long i = 0; i < r.dim; ++i) r.out[h * r.dim + i] /= sum;
    }
}

struct oproj_row {
    const float* attn; const float* wo; const float* resid; float* y; long long q_dim, hidden;
};
extern "C" __global__ void dec_o_proj(const oproj_row* rows) {
    const oproj_row r = rows[blockIdx.z];
    for (long long j = threadIdx.x; j < r.hidden; j += blockDim.x) {
        float acc = r.resid[j];
        for (long long i = 0; i < r.q_dim; ++i) acc += r.attn[i] * r.wo[i * r.hidden + j];
        r.y[j] = acc;
    }
}

struct mlp_row {
    const float* h; const float* w_gate; const float* w_up; const float* w_down;
    const float* resid; float* y; long long hidden, ffn;
};
// The SiLU-gated activation in dynamic shared memory (ffn floats), then the down projection.
extern "C" __global__ void dec_mlp(const mlp_row* rows) {
    const mlp_row r = rows[blockIdx.z];
    extern __shared__ float act[];
    for (long long f = threadIdx.x; f < r.ffn; f += blockDim.x) {
        float g = 0.f, u = 0.f;
        for (long long i = 0; i < r.hidden; ++i) {
            g += r.h[i] * r.w_gate[i * r.ffn + f];
            u += r.h[i] * r.w_up[i * r.ffn + f];
        }
        act[f] = g / (1.f + expf(-g)) * u;
    }
    __syncthreads();
    for (long long j = threadIdx.x; j < r.hidden; j += blockDim.x) {
        float acc = r.resid[j];
        for (long long f = 0; f < r.ffn; ++f) acc += act[f] * r.w_down[f * r.hidden + j];
        r.y[j] = acc;
    }
}
"""

TPB = 128


def _code(entry: str, launch, scalars: tuple[str, ...] = ()) -> sp.CudaCode:
    return sp.CudaCode(SOURCE, entry=entry, launch=launch, scalars=scalars or None, contiguous=True)


def _numel(shape) -> int:
    return math.prod(shape)


#: The device code of each decode kernel, by the kernel's name in :mod:`decode`.
CODE = {
    "rmsnorm": _code("dec_rmsnorm", lambda x, w, y: sp.Launch(1, TPB, consts=(_numel(x),)), ("float64",)),
    "qkv": _code(
        "dec_qkv",
        lambda h, wq, wk, wv, q, k, v: sp.Launch(1, TPB, consts=(_numel(h), _numel(q), _numel(k))),
    ),
    "rope": _code(
        "dec_rope",
        lambda q, k, q_rot, k_slot: sp.Launch(1, TPB, consts=(q[0], k[0], q[1])),
        ("int64", "float64"),
    ),
    "attention": _code(
        "dec_attention",
        lambda q, k_hist, v_hist, attn: sp.Launch(1, TPB, consts=(q[0], k_hist[2], k_hist[3], k_hist[1])),
        ("float64",),
    ),
    "o_proj": _code(
        "dec_o_proj", lambda attn, wo, resid, y: sp.Launch(1, TPB, consts=(_numel(attn), _numel(y)))
    ),
    "mlp": _code(
        "dec_mlp",
        lambda h, wg, wu, wd, resid, y: sp.Launch(1, TPB, shared_bytes=4 * wg[1], consts=(_numel(h), wg[1])),
    ),
}


# -- the fake libcuda's stand-ins: each launch's rows, through the numpy kernels --------------

F32 = np.float32


def _arrays(launch: fake_cuda.Launch, row, shapes) -> list[np.ndarray]:
    return [launch.array(int(a), s, F32) for a, s in zip(row, shapes)]


def install_fakes(kernels) -> None:
    """Registers the fake libcuda's host implementations of :data:`CODE` over ``kernels`` (the
    numpy functions by name, from :mod:`decode`), for :func:`fake_cuda.install`."""

    @fake_cuda.host_impl("dec_rmsnorm")
    def _rmsnorm(launch):
        for r in launch.rows(5):
            h = launch.i64(r[4])
            x, w, y = _arrays(launch, r[:3], [(h,)] * 3)
            kernels["rmsnorm"](x, w, y, launch.f64(r[3]))

    @fake_cuda.host_impl("dec_qkv")
    def _qkv(launch):
        for r in launch.rows(10):
            hid, q_dim, kv = (launch.i64(v) for v in r[7:10])
            shapes = [(hid,), (hid, q_dim), (hid, kv), (hid, kv), (q_dim,), (kv,), (kv,)]
            kernels["qkv"](*_arrays(launch, r[:7], shapes))

    @fake_cuda.host_impl("dec_rope")
    def _rope(launch):
        for r in launch.rows(9):
            nh, nkv, d = (launch.i64(v) for v in r[6:9])
            q, k, q_rot, k_slot = _arrays(launch, r[:4], [(nh, d), (nkv, d), (nh, d), (nkv, d)])
            kernels["rope"](q, k, q_rot, k_slot, launch.i64(r[4]), launch.f64(r[5]))

    @fake_cuda.host_impl("dec_attention")
    def _attention(launch):
        for r in launch.rows(9):
            nh, nkv, d, n = (launch.i64(v) for v in r[5:9])
            shapes = [(nh, d), (1, n, nkv, d), (1, n, nkv, d), (1, nh * d)]
            kernels["attention"](*_arrays(launch, r[:4], shapes), launch.f64(r[4]))

    @fake_cuda.host_impl("dec_o_proj")
    def _o_proj(launch):
        for r in launch.rows(6):
            q_dim, hid = launch.i64(r[4]), launch.i64(r[5])
            shapes = [(1, q_dim), (q_dim, hid), (1, hid), (1, hid)]
            kernels["o_proj"](*_arrays(launch, r[:4], shapes))

    @fake_cuda.host_impl("dec_mlp")
    def _mlp(launch):
        for r in launch.rows(8):
            hid, ffn = launch.i64(r[6]), launch.i64(r[7])
            shapes = [(1, hid), (hid, ffn), (hid, ffn), (ffn, hid), (1, hid), (1, hid)]
            kernels["mlp"](*_arrays(launch, r[:6], shapes))
