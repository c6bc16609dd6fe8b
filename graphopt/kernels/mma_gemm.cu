// Tiled tensor-core GEMM with a fused epilogue; one source serves GemmAct and CBR (implicit GEMM).
//
//   Y[z] = act(alpha * A[z] . B[z] + beta * bias + R)        A: [M][K] row-major (K contiguous)
//
// MODE 0: B is [K][N] (N contiguous, ldb)           -- MatMul / Gemm(transB=0)
// MODE 1: B is [N][K] (K contiguous, ldb)           -- Gemm(transB=1), nn.Linear weights
// MODE 3: like MODE 2 but the input is NHWC and K runs over (r, s, c) (A is the weight reordered
//         to [M][KH][KW][C/G]); with C/G a multiple of BK each K tile lies in one filter tap, so a
//         B chunk is one 16-byte load of 8 (fp16) / 4 (fp32) channels of one input pixel.
// MODE 2: B is the implicit im2col matrix of an NCHW input, gathered on the fly: K runs over
//         (c, r, s) -- the order of an ONNX Conv weight [M][C/G][KH][KW], which is therefore A
//         as it is -- and N runs over output pixels (n, oh, ow). The output is written NCHW
//         directly, so this lowering needs no layout conversion at all. z is the group.
//
// fp16 (T = half_t): mma.sync m16n8k16 with ldmatrix, fp32 accumulation.
// fp32 (T = float) : mma.sync m16n8k8 tf32 (operands rounded to tf32), fp32 accumulation.
// STAGES == 2: global -> register -> shared double buffering (one barrier per BK step). avec / bvec
// (uniform kernel arguments) select 16-byte global loads when rows are 16-byte aligned, else scalar
// loads.
// STAGES >= 3 (MODE 0, 1, 3; both operands in 16-byte chunks, which the host guarantees): a
// STAGES-deep cp.async pipeline straight from global to shared memory (Ampere-style multistage
// main loop: STAGES-1 tiles in flight while one is consumed, one barrier per BK step, no staging
// registers). Out-of-bounds chunks use cp.async's zero-fill (source size 0).
// splits > 1: serial split-K inside one launch. Each split writes its fp32 partial tile to a
// workspace; the last CTA of a tile to arrive (atomic counter) sums the partials in split order
// (deterministic), resets the counter for the next launch and runs the epilogue.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void mma_f16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// 16-byte global -> shared copy that bypasses L1; valid == false writes 16 zero bytes (src-size 0).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
__device__ __forceinline__ unsigned to_tf32(float f) {
    unsigned r;
    asm("{ cvt.rna.tf32.f32 %0, %1; }" : "=r"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ void mma_tf32(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename T> struct Tile;
template <> struct Tile<half_t> { enum { VEC = 8, PADA = 8, PADB_KN = 8, IS_HALF = 1 }; };
template <> struct Tile<float>  { enum { VEC = 4, PADA = 4, PADB_KN = 8, IS_HALF = 0 }; };

union Vec16 { uint4 u; half_t h[8]; float f[4]; };

template <typename T, int MODE, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int SEPI, int STAGES = 2>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
mma_gemm(const T* __restrict__ A, const T* __restrict__ Bm, const T* __restrict__ bias,
         const T* __restrict__ R, T* __restrict__ Y,
         float* __restrict__ ws, int* __restrict__ counters, const int2* __restrict__ ktab,
         int M, int N, int K, int splits, int avec, int bvec,
         long long sA, long long sB, long long sY, int ldb,
         int C, int H, int W, int OHW, int OW, int sh, int sw, int ph, int pw, int Mtot,
         float alpha, float beta,
         long long bias_sb, int bias_sr, int bias_sc,
         long long res_sb, int res_sr, int res_sc,
         int act, float act_alpha, float act_beta, float lo, float hi,
         int KWd, int dh, int dw, int Cg)
{
    constexpr int NT = WARPS_M * WARPS_N * 32;
    constexpr int VEC = Tile<T>::VEC;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int LDA = BK + Tile<T>::PADA;                                   // A smem: [BM][LDA]
    constexpr bool B_NK = (MODE == 1 || MODE == 3);                                       // B smem [BN][BK] else [BK][BN]
    constexpr int LDB = B_NK ? (BK + Tile<T>::PADA) : (BN + Tile<T>::PADB_KN);
    constexpr int A_ELEMS = BM * LDA, B_ELEMS = B_NK ? BN * LDB : BK * LDB;
    constexpr int A_CHUNKS = BM * BK / VEC / NT;                              // 16-byte chunks per thread
    constexpr int B_CHUNKS = BN * BK / VEC / NT;
    constexpr int G_ROWS = NT / BN, G_ELEMS = BK * BN / NT;                   // MODE 2 gather
    static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0, "warp tile");
    static_assert(A_CHUNKS * VEC * NT == BM * BK, "A chunks");
    static_assert(MODE != 2 || (NT % BN == 0 && G_ELEMS * NT == BK * BN), "gather split");
    static_assert(MODE == 2 || B_CHUNKS * VEC * NT == BN * BK, "B chunks");
    constexpr bool PIPE = STAGES >= 3;
    constexpr int NBUF = PIPE ? STAGES : 2;
    static_assert(!PIPE || MODE != 2, "the NCHW gather mode has no cp.async pipeline");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* As = reinterpret_cast<T*>(smem_raw);
    T* Bs = As + NBUF * A_ELEMS;
    int2* Ks = reinterpret_cast<int2*>(Bs + NBUF * B_ELEMS);   // MODE 2: this CTA's k offsets

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int zb = blockIdx.z / splits, ks = blockIdx.z % splits;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    A += zb * sA;
    Bm += zb * sB;

    const int nkt_all = (K + BK - 1) / BK;
    const int per = (nkt_all + splits - 1) / splits;
    const int kt_begin = ks * per;
    const int kt_end = min(nkt_all, kt_begin + per);
    const int nkt = max(0, kt_end - kt_begin);

    // MODE 2: this thread's fixed output pixel (column) of the B tile.
    int g_ih0 = -(1 << 29), g_iw0 = 0, g_base = 0;
    if (MODE == 2) {
        const int j = n0 + tid % BN;
        if (j < N) {
            const int n = j / OHW, p = j % OHW;
            const int oh = p / OW, ow = p % OW;
            g_ih0 = oh * sh - ph;
            g_iw0 = ow * sw - pw;
            g_base = n * C * H * W + g_ih0 * W + g_iw0;
        }
    }

    if constexpr (MODE == 2) {
        // Stage the per-k gather offsets of this split in shared memory once, so each B element
        // costs one global load instead of two dependent ones.
        for (int i = tid; i < nkt * BK; i += NT) Ks[i] = ktab[kt_begin * BK + i];
        __syncthreads();
    }

    // MODE 3: the output pixel of each of this thread's B chunks (fixed across K tiles).
    int p_base[MODE == 3 ? B_CHUNKS : 1], p_ih0[MODE == 3 ? B_CHUNKS : 1], p_iw0[MODE == 3 ? B_CHUNKS : 1];
    if constexpr (MODE == 3) {
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int j = n0 + (tid + i * NT) / (BK / VEC);
            p_ih0[i] = -(1 << 29); p_iw0[i] = 0; p_base[i] = 0;
            if (j < N) {
                const int n = j / OHW, p = j % OHW;
                const int oh = p / OW, ow = p % OW;
                p_ih0[i] = oh * sh - ph;
                p_iw0[i] = ow * sw - pw;
                p_base[i] = n * H * W * C;
            }
        }
    }

    Vec16 a_reg[A_CHUNKS];
    Vec16 b_reg[MODE == 2 ? 1 : B_CHUNKS];
    T g_reg[MODE == 2 ? G_ELEMS : 1];

    auto load_tiles = [&](int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * NT;
            const int r = c / (BK / VEC), kc = (c % (BK / VEC)) * VEC;
            const int gm = m0 + r, gk = k0 + kc;
            if (avec) {
                if (gm < M && gk < K) a_reg[i].u = *reinterpret_cast<const uint4*>(A + (long long)gm * K + gk);
                else a_reg[i].u = make_uint4(0, 0, 0, 0);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    T v = T(0);
                    if (gm < M && gk + e < K) v = A[(long long)gm * K + gk + e];
                    if (Tile<T>::IS_HALF) a_reg[i].h[e] = *reinterpret_cast<half_t*>(&v);
                    else a_reg[i].f[e] = *reinterpret_cast<float*>(&v);
                }
            }
        }
        if constexpr (MODE == 2) {
#pragma unroll
            for (int i = 0; i < G_ELEMS; ++i) {
                const int kr = tid / BN + i * G_ROWS;
                const int2 kt2 = Ks[k0 - kt_begin * BK + kr];
                const int ih = g_ih0 + (kt2.y & 0xffff), iw = g_iw0 + ((unsigned)kt2.y >> 16);
                T v = T(0);
                if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) v = Bm[g_base + kt2.x];
                g_reg[i] = v;
            }
        } else if constexpr (MODE == 3) {
            const int rs = k0 / Cg, c0 = k0 - rs * Cg;
            const int r = rs / KWd, s = rs - r * KWd;
#pragma unroll
            for (int i = 0; i < B_CHUNKS; ++i) {
                const int kc = ((tid + i * NT) % (BK / VEC)) * VEC;
                const int ih = p_ih0[i] + r * dh, iw = p_iw0[i] + s * dw;
                if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
                    b_reg[i].u = *reinterpret_cast<const uint4*>(Bm + p_base[i] + (ih * W + iw) * C + c0 + kc);
                else
                    b_reg[i].u = make_uint4(0, 0, 0, 0);
            }
        } else {
#pragma unroll
            for (int i = 0; i < B_CHUNKS; ++i) {
                const int c = tid + i * NT;
                int gr, gc;  // row / column in global B
                if (B_NK) { const int r = c / (BK / VEC); gr = n0 + r; gc = k0 + (c % (BK / VEC)) * VEC; }
                else      { const int r = c / (BN / VEC); gr = k0 + r; gc = n0 + (c % (BN / VEC)) * VEC; }
                const int rlim = B_NK ? N : K, clim = B_NK ? K : N;
                if (bvec) {
                    if (gr < rlim && gc < clim) b_reg[i].u = *reinterpret_cast<const uint4*>(Bm + (long long)gr * ldb + gc);
                    else b_reg[i].u = make_uint4(0, 0, 0, 0);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        T v = T(0);
                        if (gr < rlim && gc + e < clim) v = Bm[(long long)gr * ldb + gc + e];
                        if (Tile<T>::IS_HALF) b_reg[i].h[e] = *reinterpret_cast<half_t*>(&v);
                        else b_reg[i].f[e] = *reinterpret_cast<float*>(&v);
                    }
                }
            }
        }
    };

    auto store_tiles = [&](int buf) {
        T* as = As + buf * A_ELEMS;
        T* bs = Bs + buf * B_ELEMS;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * NT;
            const int r = c / (BK / VEC), kc = (c % (BK / VEC)) * VEC;
            *reinterpret_cast<uint4*>(as + r * LDA + kc) = a_reg[i].u;
        }
        if constexpr (MODE == 2) {
#pragma unroll
            for (int i = 0; i < G_ELEMS; ++i) {
                const int kr = tid / BN + i * G_ROWS;
                bs[kr * LDB + tid % BN] = g_reg[i];
            }
        } else {
#pragma unroll
            for (int i = 0; i < B_CHUNKS; ++i) {
                const int c = tid + i * NT;
                int r, cc;
                if (B_NK) { r = c / (BK / VEC); cc = (c % (BK / VEC)) * VEC; }
                else      { r = c / (BN / VEC); cc = (c % (BN / VEC)) * VEC; }
                *reinterpret_cast<uint4*>(bs + r * LDB + cc) = b_reg[i].u;
            }
        }
    };

    // STAGES >= 3: one K tile straight into pipeline buffer `buf` with cp.async (16-byte chunks).
    auto issue_tiles = [&](int kt, int buf) {
        const int k0 = kt * BK;
        T* as = As + buf * A_ELEMS;
        T* bs = Bs + buf * B_ELEMS;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * NT;
            const int r = c / (BK / VEC), kc = (c % (BK / VEC)) * VEC;
            const int gm = m0 + r, gk = k0 + kc;
            const bool ok = gm < M && gk < K;
            cp_async16(smem_u32(as + r * LDA + kc), ok ? A + (long long)gm * K + gk : A, ok);
        }
        if constexpr (MODE == 3) {
            const int rs = k0 / Cg, c0 = k0 - rs * Cg;
            const int r = rs / KWd, s = rs - r * KWd;
#pragma unroll
            for (int i = 0; i < B_CHUNKS; ++i) {
                const int c = tid + i * NT;
                const int row = c / (BK / VEC), kc = (c % (BK / VEC)) * VEC;
                const int ih = p_ih0[i] + r * dh, iw = p_iw0[i] + s * dw;
                const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
                cp_async16(smem_u32(bs + row * LDB + kc), ok ? Bm + p_base[i] + (ih * W + iw) * C + c0 + kc : Bm, ok);
            }
        } else if constexpr (MODE != 2) {
#pragma unroll
            for (int i = 0; i < B_CHUNKS; ++i) {
                const int c = tid + i * NT;
                int r, cc, gr, gc;
                if (B_NK) { r = c / (BK / VEC); cc = (c % (BK / VEC)) * VEC; gr = n0 + r; gc = k0 + cc; }
                else      { r = c / (BN / VEC); cc = (c % (BN / VEC)) * VEC; gr = k0 + r; gc = n0 + cc; }
                const bool ok = gr < (B_NK ? N : K) && gc < (B_NK ? K : N);
                cp_async16(smem_u32(bs + r * LDB + cc), ok ? Bm + (long long)gr * ldb + gc : Bm, ok);
            }
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    auto compute = [&](int buf) {
        const T* as = As + buf * A_ELEMS;
        const T* bs = Bs + buf * B_ELEMS;
        const int g = lane >> 2, t = lane & 3;
        if constexpr (Tile<T>::IS_HALF != 0) {
            static_assert(Tile<T>::IS_HALF == 0 || NI % 2 == 0, "fp16 needs an even NI");
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                unsigned af[MI][4], bf[NI][2];
                const int q = lane >> 3, r8 = lane & 7;
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    const int row = wm * WTM + mi * 16 + (q & 1) * 8 + r8;
                    const int col = kk + (q >> 1) * 8;
                    ldsm_x4(smem_u32(as + row * LDA + col), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
                }
#pragma unroll
                for (int nj = 0; nj < NI / 2; ++nj) {
                    if constexpr (B_NK) {
                        const int nrow = wn * WTN + nj * 16 + (q >> 1) * 8 + r8;
                        const int kcol = kk + (q & 1) * 8;
                        ldsm_x4(smem_u32(bs + nrow * LDB + kcol), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1]);
                    } else {
                        const int krow = kk + (q & 1) * 8 + r8;
                        const int ncol = wn * WTN + nj * 16 + (q >> 1) * 8;
                        ldsm_x4_t(smem_u32(bs + krow * LDB + ncol), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1]);
                    }
                }
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        mma_f16(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[ni][0], bf[ni][1]);
            }
        } else {
            const float* fa = reinterpret_cast<const float*>(as);
            const float* fb = reinterpret_cast<const float*>(bs);
#pragma unroll
            for (int kk = 0; kk < BK; kk += 8) {
                unsigned af[MI][4], bf[NI][2];
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    const int row = wm * WTM + mi * 16 + g;
                    af[mi][0] = to_tf32(fa[row * LDA + kk + t]);
                    af[mi][1] = to_tf32(fa[(row + 8) * LDA + kk + t]);
                    af[mi][2] = to_tf32(fa[row * LDA + kk + t + 4]);
                    af[mi][3] = to_tf32(fa[(row + 8) * LDA + kk + t + 4]);
                }
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    const int col = wn * WTN + ni * 8 + g;
                    if constexpr (B_NK) {
                        bf[ni][0] = to_tf32(fb[col * LDB + kk + t]);
                        bf[ni][1] = to_tf32(fb[col * LDB + kk + t + 4]);
                    } else {
                        bf[ni][0] = to_tf32(fb[(kk + t) * LDB + col]);
                        bf[ni][1] = to_tf32(fb[(kk + t + 4) * LDB + col]);
                    }
                }
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        mma_tf32(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[ni][0], bf[ni][1]);
            }
        }
    };

    if constexpr (PIPE) {
        if (nkt > 0) {
#pragma unroll
            for (int st = 0; st < STAGES - 1; ++st) {
                if (st < nkt) issue_tiles(kt_begin + st, st);
                cp_async_commit();
            }
            for (int it = 0; it < nkt; ++it) {
                cp_async_wait<STAGES - 2>();   // tile `it` has landed (for this thread's copies)
                __syncthreads();               // ... for every thread's; and buffer (it-1) is free
                const int nx = it + STAGES - 1;
                if (nx < nkt) issue_tiles(kt_begin + nx, nx % STAGES);
                cp_async_commit();
                compute(it % STAGES);
            }
            cp_async_wait<0>();
        }
    } else if (nkt > 0) {
        load_tiles(kt_begin);
        store_tiles(0);
        __syncthreads();
        for (int it = 0; it < nkt; ++it) {
            const bool more = it + 1 < nkt;
            if (more) load_tiles(kt_begin + it + 1);
            compute(it & 1);
            if (more) store_tiles((it + 1) & 1);
            __syncthreads();
        }
    }

    if (splits > 1) {
        constexpr int PER_T = MI * NI * 4;
        const int tile = (zb * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        float* part = ws + ((long long)tile * splits + ks) * PER_T * NT;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[((mi * NI + ni) * 4 + e) * NT + tid] = acc[mi][ni][e];
        __threadfence();
        __syncthreads();
        __shared__ int s_last;
        if (tid == 0) s_last = (atomicAdd(counters + tile, 1) == splits - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        const float* base = ws + (long long)tile * splits * PER_T * NT;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float s = 0.0f;
                    for (int q = 0; q < splits; ++q) s += ld_cg(base + (long long)q * PER_T * NT + ((mi * NI + ni) * 4 + e) * NT + tid);
                    acc[mi][ni][e] = s;
                }
        if (tid == 0) counters[tile] = 0;   // ready for the next launch on this stream
    }

    // Fused epilogue.
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    const int g = lane >> 2, t = lane & 3;
    if constexpr (SEPI != 0) {
        // Staged epilogue: the fp32 tile goes through shared memory (which the main loop no longer
        // needs) and each thread then finishes two adjacent columns of one row, so a warp reads the
        // residual and writes the output as 64 consecutive columns (coalesced, paired stores).
        constexpr int LDC = BN + 4;
        float* Cs = reinterpret_cast<float*>(smem_raw);
        __syncthreads();
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    Cs[(wm * WTM + mi * 16 + g + (e >> 1) * 8) * LDC + wn * WTN + ni * 8 + 2 * t + (e & 1)] = acc[mi][ni][e];
        __syncthreads();
        for (int idx = tid; idx < BM * BN / 2; idx += NT) {
            const int r = idx / (BN / 2), c = (idx % (BN / 2)) * 2;
            const int row = m0 + r, col = n0 + c;
            if (row >= M || col >= N) continue;
            const bool two = col + 1 < N;
            float v0 = alpha * Cs[r * LDC + c], v1 = alpha * Cs[r * LDC + c + 1];
            long long y0, y1, r0, r1;
            if constexpr (MODE >= 2) {
                const int mg = zb * M + row;
                if (bias) { const float b = Num<T>::load(bias + mg); v0 += b; v1 += b; }
                const int n = col / OHW, p = col - n * OHW;
                y0 = (long long)n * Mtot * OHW + (long long)mg * OHW + p;
                r0 = (long long)n * res_sb + (long long)mg * res_sr + (long long)p * res_sc;
                if (p + 1 < OHW) { y1 = y0 + 1; r1 = r0 + res_sc; }
                else { y1 = (long long)(n + 1) * Mtot * OHW + (long long)mg * OHW; r1 = (long long)(n + 1) * res_sb + (long long)mg * res_sr; }
            } else {
                if (bias) {
                    const long long b0 = zb * bias_sb + (long long)row * bias_sr + (long long)col * bias_sc;
                    v0 += beta * Num<T>::load(bias + b0);
                    if (two) v1 += beta * Num<T>::load(bias + b0 + bias_sc);
                }
                y0 = zb * sY + (long long)row * N + col; y1 = y0 + 1;
                r0 = zb * res_sb + (long long)row * res_sr + (long long)col * res_sc; r1 = r0 + res_sc;
            }
            if (R) { v0 += Num<T>::load(R + r0); if (two) v1 += Num<T>::load(R + r1); }
            v0 = apply_act_inline(v0, ap);
            v1 = apply_act_inline(v1, ap);
            if (two && y1 == y0 + 1 && (y0 & 1) == 0) {
                if constexpr (Tile<T>::IS_HALF != 0) {
                    const unsigned packed = (unsigned)f2h(v0) | ((unsigned)f2h(v1) << 16);
                    *reinterpret_cast<unsigned*>(Y + y0) = packed;
                } else {
                    *reinterpret_cast<float2*>(Y + y0) = make_float2(v0, v1);
                }
            } else {
                Y[y0] = Num<T>::from_f(v0);
                if (two) Y[y1] = Num<T>::from_f(v1);
            }
        }
        return;
    }
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int col0 = n0 + wn * WTN + ni * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int col = col0 + h;
            if (col >= N) continue;
            long long ybase, rbase;
            int pcol = col;
            if (MODE >= 2) {
                const int n = col / OHW; pcol = col % OHW;
                ybase = (long long)n * Mtot * OHW + pcol;
                rbase = (long long)n * res_sb + (long long)pcol * res_sc;
            } else {
                ybase = zb * sY + col;
                rbase = zb * res_sb + (long long)col * res_sc;
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int row = m0 + wm * WTM + mi * 16 + g + hr * 8;
                    if (row >= M) continue;
                    float v = alpha * acc[mi][ni][hr * 2 + h];
                    if (MODE >= 2) {
                        const int mg = zb * M + row;
                        if (bias) v += Num<T>::load(bias + mg);
                        if (R) v += Num<T>::load(R + rbase + (long long)mg * res_sr);
                        Y[ybase + (long long)mg * OHW] = Num<T>::from_f(apply_act(v, ap));
                    } else {
                        if (bias) v += beta * Num<T>::load(bias + zb * bias_sb + (long long)row * bias_sr + (long long)col * bias_sc);
                        if (R) v += Num<T>::load(R + rbase + (long long)row * res_sr);
                        Y[ybase + (long long)row * N] = Num<T>::from_f(apply_act(v, ap));
                    }
                }
            }
        }
    }
}
