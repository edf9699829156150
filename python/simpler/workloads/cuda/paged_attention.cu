/* simpler: the CUDA device code of simpler.workloads.paged_attention (see paged_attention_cuda.py, which
 * prepends the #defines this file uses, from its Python constants, and compiles it with NVRTC). */
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
