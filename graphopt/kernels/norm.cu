// LayerNorm / SkipLayerNorm / RMSNorm over the last axis: one row per WARPS warps, ROWS rows per CTA
// (ROWS > 1 only with WARPS == 1: a warp per row, reductions by shuffles alone, no barrier).
//
// Each thread keeps ITEMS vectors of VEC elements of its row in registers, so the row is read from
// memory once (16-byte loads when VEC * sizeof(T) == 16) and the statistics are a mean and then a
// centred sum of squares over the registers (as exact as a two-pass algorithm; no E[x^2] - E[x]^2
// cancellation). Accumulation is fp32 for fp16 and fp32 data. Reductions: warp shuffles, then one
// float per warp through shared memory.
//
// MODE 0: LayerNorm  y = (s - mean) * rsqrt(var + eps) * scale [+ bias]
// MODE 1: RMSNorm    y = s * rsqrt(mean(s^2) + eps) * scale
// with s = X [+ skip [+ skip_bias]]; S (when not null) receives s (SkipLayerNorm's sum output).
// skip holds skip_rows rows reused cyclically (row % skip_rows): X's shape, or a suffix of it
// broadcast over the leading dims (position embeddings [1, S, D] added to [B, S, D]).
// The host guarantees D % VEC == 0, D <= ITEMS * VEC * WARPS * 32 and 16-byte aligned rows for VEC > 1.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) VecT {
    T v[VEC];
};

template <int WARPS>
__device__ __forceinline__ float block_sum(float v, float* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (WARPS == 1) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous reduction's readers are done with sh
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < WARPS ? sh[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

template <typename T, int VEC, int WARPS, int ITEMS, int MODE, int ROWS>
__global__ void __launch_bounds__(WARPS * 32 * ROWS) norm_rows(
    const T* __restrict__ X, const T* __restrict__ skip, const T* __restrict__ skip_bias,
    const T* __restrict__ scale, const T* __restrict__ bias, T* __restrict__ Y, T* __restrict__ S,
    int rows, int D, float eps, int skip_rows)
{
    static_assert(WARPS >= 1 && WARPS <= 32, "1..32 warps per row");
    static_assert(ITEMS >= 1 && ITEMS <= 16, "1..16 vectors per thread");
    static_assert(ROWS == 1 || WARPS == 1, "several rows per CTA only with a warp per row");
    static_assert(ROWS >= 1 && ROWS <= 32, "1..32 rows per CTA");
    typedef VecT<T, VEC> V;
    __shared__ float sh[32];
    const int nv = D / VEC;
    const float inv_d = 1.0f / (float)D;
    const int tid = (int)threadIdx.x % (WARPS * 32);  // the thread's place in its row's group
    for (int row = blockIdx.x * ROWS + (int)threadIdx.x / (WARPS * 32); row < rows; row += gridDim.x * ROWS) {
        const long long base = (long long)row * D;
        const V* xr = reinterpret_cast<const V*>(X + base);
        const V* kr = skip ? reinterpret_cast<const V*>(skip + (long long)(row % skip_rows) * D) : nullptr;
        const V* br = reinterpret_cast<const V*>(skip_bias);
        float x[ITEMS][VEC];
        float sum = 0.0f;
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
            const int j = it * WARPS * 32 + tid;
#pragma unroll
            for (int k = 0; k < VEC; ++k) x[it][k] = 0.0f;
            if (j < nv) {
                const V a = xr[j];
#pragma unroll
                for (int k = 0; k < VEC; ++k) x[it][k] = Num<T>::to_f(a.v[k]);
                if (kr) {
                    const V b = kr[j];
#pragma unroll
                    for (int k = 0; k < VEC; ++k) x[it][k] += Num<T>::to_f(b.v[k]);
                    if (br) {
                        const V c = br[j];
#pragma unroll
                        for (int k = 0; k < VEC; ++k) x[it][k] += Num<T>::to_f(c.v[k]);
                    }
                }
                if (S) {
                    V o;
#pragma unroll
                    for (int k = 0; k < VEC; ++k) o.v[k] = Num<T>::from_f(x[it][k]);
                    reinterpret_cast<V*>(S + base)[j] = o;
                }
#pragma unroll
                for (int k = 0; k < VEC; ++k) sum += x[it][k];
            }
        }
        const float mean = MODE == 0 ? block_sum<WARPS>(sum, sh) * inv_d : 0.0f;
        float sq = 0.0f;
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
            if (it * WARPS * 32 + tid < nv) {
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float d = x[it][k] - mean;
                    sq += d * d;
                }
            }
        }
        const float rstd = rsqrtf(block_sum<WARPS>(sq, sh) * inv_d + eps);
        const V* sr = reinterpret_cast<const V*>(scale);
        const V* bb = reinterpret_cast<const V*>(bias);
        V* yr = reinterpret_cast<V*>(Y + base);
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
            const int j = it * WARPS * 32 + tid;
            if (j < nv) {
                const V g = sr[j];
                V o;
                if (MODE == 0 && bb) {
                    const V h = bb[j];
#pragma unroll
                    for (int k = 0; k < VEC; ++k)
                        o.v[k] = Num<T>::from_f((x[it][k] - mean) * rstd * Num<T>::to_f(g.v[k]) + Num<T>::to_f(h.v[k]));
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k)
                        o.v[k] = Num<T>::from_f((x[it][k] - mean) * rstd * Num<T>::to_f(g.v[k]));
                }
                yr[j] = o;
            }
        }
    }
}
