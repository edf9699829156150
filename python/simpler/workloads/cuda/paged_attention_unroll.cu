/* simpler: the CUDA device code of simpler.workloads.paged_attention_unroll (see paged_attention_unroll_cuda.py, which
 * prepends the #defines this file uses, from its Python constants, and compiles it with NVRTC). */
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
