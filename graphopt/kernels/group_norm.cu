// GroupNorm: Y = act((X - mean) * rstd * scale[c] + bias[c]) over X [N, C, HW...] in groups of cpg
// channels. One CTA of WARPS warps per (n, group): the group's cpg * HW elements are contiguous.
//
// Pass 1 reads the group once in VEC-element vectors (16-byte loads when VEC * sizeof(T) == 16):
// each vector's mean and centred sum of squares are exact in registers, merged into the thread's
// running (count, mean, M2) with Chan's formula, then across the CTA the same way (warp shuffles,
// then one triple per warp through shared memory). No E[x^2] - E[x]^2 cancellation; fp32 throughout.
// Pass 2 reads the group again (mostly from L2) and writes Y. The host guarantees HW % VEC == 0
// (a vector never straddles two channels) and 16-byte aligned tensors for VEC > 1.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) GnVec {
    T v[VEC];
};

__device__ __forceinline__ void chan_merge(float& n, float& mean, float& m2, float nb, float mb, float m2b) {
    const float tot = n + nb;
    if (nb == 0.0f) return;
    const float delta = mb - mean;
    const float f = nb / tot;
    mean += delta * f;
    m2 += m2b + delta * delta * n * f;
    n = tot;
}

template <typename T, int VEC, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) group_norm(
    const T* __restrict__ X, const T* __restrict__ scale, const T* __restrict__ bias, T* __restrict__ Y,
    int groups, int cpg, int HW, float eps, int act, float alpha, float beta, float lo, float hi)
{
    typedef GnVec<T, VEC> V;
    __shared__ float sh[3][32];
    __shared__ float stats[2];
    const int L = cpg * HW;
    const int nv = L / VEC;
    const long long base = (long long)blockIdx.x * L;
    const int c0 = (blockIdx.x % groups) * cpg;
    const V* xv = reinterpret_cast<const V*>(X + base);

    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int j = threadIdx.x; j < nv; j += WARPS * 32) {
        const V a = xv[j];
        float x[VEC];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) { x[k] = Num<T>::to_f(a.v[k]); s += x[k]; }
        const float mb = s * (1.0f / VEC);
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) { const float d = x[k] - mb; q += d * d; }
        chan_merge(n, mean, m2, (float)VEC, mb, q);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float nb = __shfl_xor_sync(0xffffffffu, n, o);
        const float mb = __shfl_xor_sync(0xffffffffu, mean, o);
        const float qb = __shfl_xor_sync(0xffffffffu, m2, o);
        chan_merge(n, mean, m2, nb, mb, qb);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sh[0][warp] = n; sh[1][warp] = mean; sh[2][warp] = m2; }
    __syncthreads();
    if (warp == 0) {
        n = lane < WARPS ? sh[0][lane] : 0.0f;
        mean = lane < WARPS ? sh[1][lane] : 0.0f;
        m2 = lane < WARPS ? sh[2][lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float nb = __shfl_xor_sync(0xffffffffu, n, o);
            const float mb = __shfl_xor_sync(0xffffffffu, mean, o);
            const float qb = __shfl_xor_sync(0xffffffffu, m2, o);
            chan_merge(n, mean, m2, nb, mb, qb);
        }
        if (lane == 0) { stats[0] = mean; stats[1] = rsqrtf(m2 / (float)L + eps); }
    }
    __syncthreads();
    const float mu = stats[0], rstd = stats[1];
    ActParams ap; ap.kind = act; ap.alpha = alpha; ap.beta = beta; ap.lo = lo; ap.hi = hi;
    V* yv = reinterpret_cast<V*>(Y + base);
    for (int j = threadIdx.x; j < nv; j += WARPS * 32) {
        const int c = c0 + (j * VEC) / HW;
        const float g = Num<T>::to_f(scale[c]) * rstd;
        const float b = Num<T>::to_f(bias[c]) - mu * g;
        const V a = xv[j];
        float v[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = Num<T>::to_f(a.v[k]) * g + b;
        apply_act_n<VEC>(v, ap);  // one dispatch for the vector, not one a value
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = Num<T>::from_f(v[k]);
        yv[j] = o;
    }
}
