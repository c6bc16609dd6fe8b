// Attention: Y = softmax(Q . K^T * scale [+ mask] [causal]) . V, per (b, h) of a [B, H, S, D] layout.
//
// Two lowerings share the masking code (mask_value_at):
// - attn_softmax: the fused scale-free mask / causal / softmax / nan_to_zero kernel that runs in place
//   on the scores between two cuBLAS batched GEMMs (graphopt/kernels/attention.py, ``cublas_softmax``).
//   One row per CTA of WARPS warps: pass 1 keeps a running (max, sum of exp) per thread (online
//   softmax), one block reduction combines them, pass 2 writes exp(x - max) / sum.
// - flash_attn: one fused kernel (``flash``), online softmax over key tiles of 32 held in shared
//   memory, fp32 everywhere in registers (SIMT: no tensor cores yet). A CTA of WARPS warps takes BM
//   query rows of one (b, h); each warp owns BM / WARPS rows. Per key tile, lane j computes the score
//   of key j for each of its warp's rows, a warp max / sum updates the row's running max and
//   denominator, and each lane accumulates its DMAX / 32 output columns from V's tile.
//
// Masks (MASK): 0 none; 1 additive (T values); 2 bool (bytes, nonzero = attend; a masked score gets
// mask_value added, -inf by default). The mask is read through four element strides over
// (b, h, query i, key j), 0 where it broadcasts. causal masks key j > query i (top-left aligned).
// Fully masked rows give NaN, as the ONNX Softmax does, or 0 with nan_to_zero.

#define ATTN_NEG_INF (__int_as_float(0xff800000))

struct AttnMask {
    const void* ptr;
    long long sb, sh, si, sj;
    float value;   // bool masks: added where the mask is false
    int causal;
};

// Kernel arguments (scalars: CuPy passes no structs) and the struct the device code uses.
#define ATTN_MASK_ARGS const void* mptr, long long msb, long long msh, long long msi, long long msj, float mvalue, int causal

__device__ __forceinline__ AttnMask make_mask(const void* p, long long sb, long long sh, long long si, long long sj,
                                              float value, int causal) {
    AttnMask m;
    m.ptr = p; m.sb = sb; m.sh = sh; m.si = si; m.sj = sj; m.value = value; m.causal = causal;
    return m;
}

template <typename T, int MASK>
__device__ __forceinline__ float masked_score(float x, const AttnMask& m, int b, int h, int i, int j) {
    if (m.causal && j > i) return ATTN_NEG_INF;
    if (MASK == 0) return x;
    const long long off = (long long)b * m.sb + (long long)h * m.sh + (long long)i * m.si + (long long)j * m.sj;
    if (MASK == 1) return x + Num<T>::load(reinterpret_cast<const T*>(m.ptr) + off);
    return reinterpret_cast<const unsigned char*>(m.ptr)[off] ? x : x + m.value;
}

// Running (max, sum of exp(x - max)) pairs: combine b into a.
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == ATTN_NEG_INF) return;  // both empty
    s = (m == ATTN_NEG_INF ? 0.0f : s * expf(m - mx)) + (m2 == ATTN_NEG_INF ? 0.0f : s2 * expf(m2 - mx));
    m = mx;
}

template <int WARPS>
__device__ __forceinline__ void block_max_sum(float& m, float& s, float* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
    if (WARPS == 1) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous row's readers are done with sh
    if (lane == 0) { sh[warp] = m; sh[32 + warp] = s; }
    __syncthreads();
    m = lane < WARPS ? sh[lane] : ATTN_NEG_INF;
    s = lane < WARPS ? sh[32 + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
}

// In place on P = the scaled scores, [Z = B*H][Sq][Skv] contiguous.
template <typename T, int WARPS, int MASK>
__global__ void __launch_bounds__(WARPS * 32) attn_softmax(
    T* __restrict__ P, long long rows, int Sq, int Skv, int H, ATTN_MASK_ARGS, int nan_to_zero)
{
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    __shared__ float sh[64];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const int i = (int)(row % Sq);
        const long long z = row / Sq;
        const int h = (int)(z % H), b = (int)(z / H);
        T* pr = P + row * Skv;
        float m = ATTN_NEG_INF, s = 0.0f;
        for (int j = threadIdx.x; j < Skv; j += WARPS * 32) {
            const float x = masked_score<T, MASK>(Num<T>::to_f(pr[j]), mask, b, h, i, j);
            ms_combine(m, s, x, 1.0f);
        }
        block_max_sum<WARPS>(m, s, sh);
        const bool empty = m == ATTN_NEG_INF;
        const float nan = __int_as_float(0x7fc00000);
        const float inv = 1.0f / s;
        for (int j = threadIdx.x; j < Skv; j += WARPS * 32) {
            float p;
            if (empty) {
                p = nan_to_zero ? 0.0f : nan;
            } else {
                const float x = masked_score<T, MASK>(Num<T>::to_f(pr[j]), mask, b, h, i, j);
                p = x == ATTN_NEG_INF ? 0.0f : expf(x - m) * inv;
            }
            pr[j] = Num<T>::from_f(p);
        }
    }
}

// Fused attention. Q [Z][Sq][D], K [Z][Skv][D] (kt = 0) or [Z][D][Skv] (kt = 1), V [Z][Skv][Dv],
// Y [Z][Sq][Dv], all contiguous; D, Dv <= DMAX. Grid (ceil(Sq / BM), Z); dynamic shared memory
// (BM * DMAX + 32 * (DMAX + 1) + 32 * DMAX) floats.
template <typename T, int DMAX, int BM, int WARPS, int MASK>
__global__ void __launch_bounds__(WARPS * 32) flash_attn(
    const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ Y,
    int Sq, int Skv, int D, int Dv, int H, int kt, float scale, ATTN_MASK_ARGS, int nan_to_zero)
{
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    static_assert(DMAX % 32 == 0 && DMAX >= 32 && DMAX <= 256, "DMAX: a multiple of 32 up to 256");
    static_assert(BM % WARPS == 0, "BM rows split evenly over the warps");
    constexpr int R = BM / WARPS;        // rows per warp
    constexpr int C = DMAX / 32;         // output columns per lane
    constexpr int KS = DMAX + 1;         // padded K row: lane j reads K[j][d] without bank conflicts
    extern __shared__ float smem[];
    float* qs = smem;                    // [BM][DMAX], pre-scaled
    float* ks = qs + BM * DMAX;          // [32][KS]
    float* vs = ks + 32 * KS;            // [32][DMAX]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int z = blockIdx.y, h = z % H, b = z / H;
    const int row0 = blockIdx.x * BM;
    const long long qz = (long long)z * Sq * D, kz = (long long)z * Skv * D, vz = (long long)z * Skv * Dv;

    for (int e = threadIdx.x; e < BM * DMAX; e += WARPS * 32) {
        const int r = e / DMAX, d = e % DMAX;
        qs[e] = (row0 + r < Sq && d < D) ? Num<T>::to_f(Q[qz + (long long)(row0 + r) * D + d]) * scale : 0.0f;
    }
    float o[R][C], mrow[R], lrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        mrow[r] = ATTN_NEG_INF;
        lrow[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) o[r][c] = 0.0f;
    }
    // With a causal mask, key tiles past the CTA's last row are fully masked: skip them.
    const int kv_end = mask.causal ? min(Skv, row0 + BM) : Skv;
    for (int t0 = 0; t0 < kv_end; t0 += 32) {
        __syncthreads();  // the previous tile's readers are done
        // Coalesced loads: consecutive threads read consecutive addresses of K (along d, or along
        // the keys when K comes transposed) and of V; the padded K rows keep either store order
        // free of bank conflicts.
        for (int e = threadIdx.x; e < 32 * DMAX; e += WARPS * 32) {
            const int j = kt ? e % 32 : e / DMAX, d = kt ? e / 32 : e % DMAX, key = t0 + j;
            float kv = 0.0f;
            if (key < Skv && d < D) kv = Num<T>::to_f(kt ? K[kz + (long long)d * Skv + key] : K[kz + (long long)key * D + d]);
            ks[j * KS + d] = kv;
        }
        for (int e = threadIdx.x; e < 32 * DMAX; e += WARPS * 32) {
            const int j = e / DMAX, d = e % DMAX, key = t0 + j;
            vs[e] = (key < Skv && d < Dv) ? Num<T>::to_f(V[vz + (long long)key * Dv + d]) : 0.0f;
        }
        __syncthreads();
        const int key = t0 + lane;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int lr = warp * R + r, i = row0 + lr;
            if (i >= Sq) break;  // warp-uniform
            const float* q = qs + lr * DMAX;
            float sc = 0.0f;
            for (int d = 0; d < D; ++d) sc += q[d] * ks[lane * KS + d];
            sc = key < Skv ? masked_score<T, MASK>(sc, mask, b, h, i, key) : ATTN_NEG_INF;
            float tmax = sc;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float mnew = fmaxf(mrow[r], tmax);
            if (mnew == ATTN_NEG_INF) continue;  // nothing to attend to yet (warp-uniform)
            const float p = sc == ATTN_NEG_INF ? 0.0f : expf(sc - mnew);
            const float alpha = mrow[r] == ATTN_NEG_INF ? 0.0f : expf(mrow[r] - mnew);
            float psum = p;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
            lrow[r] = lrow[r] * alpha + psum;
            mrow[r] = mnew;
#pragma unroll
            for (int c = 0; c < C; ++c) o[r][c] *= alpha;
            for (int jj = 0; jj < 32; ++jj) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int c = 0; c < C; ++c) o[r][c] += pj * vs[jj * DMAX + c * 32 + lane];
            }
        }
    }
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = row0 + warp * R + r;
        if (i >= Sq) break;
        const bool empty = mrow[r] == ATTN_NEG_INF;
        const float inv = empty ? 0.0f : 1.0f / lrow[r];
        T* yr = Y + ((long long)z * Sq + i) * Dv;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int d = c * 32 + lane;
            if (d < Dv) yr[d] = Num<T>::from_f(empty ? (nan_to_zero ? 0.0f : nan) : o[r][c] * inv);
        }
    }
}
