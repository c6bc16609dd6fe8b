// Helpers for the cuBLAS lowerings and the timer: fused epilogues run in place after a
// cupy.matmul, im2col for the general-convolution GEMM, and a spin kernel.
// The epilogues apply the activation inlined (apply_act_inline): one activation per element loaded,
// memory-bound, where apply_act's out-of-line call for Gelu / SiLU / Sigmoid costs more than the
// function (cublaslt_act's erf Gelu after BERT's 4096x3072 GEMM took ~39 us on the H100, twice the
// ~17 us its 50 MB of traffic need).

// CBR after a GEMM that wrote Y as NCHW: Y = act(Y + bias[m] + R), in place.
template <typename T>
__global__ void epilogue_nchw(T* __restrict__ Y, const T* __restrict__ bias, const T* __restrict__ R,
                              long long total, int M, int HW, int rs_n, int rs_m, int rs_p,
                              int act, float act_alpha, float act_beta, float lo, float hi)
{
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int p = (int)(i % HW);
        const long long nm = i / HW;
        const int m = (int)(nm % M);
        const int n = (int)(nm / M);
        float v = Num<T>::to_f(Y[i]);
        if (bias) v += Num<T>::load(bias + m);
        if (R) v += Num<T>::load(R + (long long)n * rs_n + (long long)m * rs_m + (long long)p * rs_p);
        Y[i] = Num<T>::from_f(apply_act_inline(v, ap));
    }
}

// GemmAct after a GEMM that wrote Y as [batch][M][N]: Y = act(alpha * Y + beta * bias), in place;
// bias is addressed through strides so any broadcast of it costs nothing.
template <typename T>
__global__ void epilogue_gemm(T* __restrict__ Y, const T* __restrict__ bias, long long total, int M, int N,
                              long long bias_sb, int bias_sr, int bias_sc, float alpha, float beta,
                              int act, float act_alpha, float act_beta, float lo, float hi)
{
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    const long long MN = (long long)M * N;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long b = i / MN;
        const long long rc = i % MN;
        const int r = (int)(rc / N), c = (int)(rc % N);
        float v = alpha * Num<T>::to_f(Y[i]);
        if (bias) v += beta * Num<T>::load(bias + b * bias_sb + (long long)r * bias_sr + (long long)c * bias_sc);
        Y[i] = Num<T>::from_f(apply_act_inline(v, ap));
    }
}

// The common case of the one above, as fast as the memory allows: Y [rows][N] with a bias of N
// values (or none), VEC elements per thread through 16-byte loads and 32-bit indexing. The host
// guarantees N % VEC == 0, 16-byte aligned Y and bias, and total < 2**31. (A local vector type, as
// in glu.cu: one in common.cuh would change the hash, so the cached kernels, of every source.)
template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) EpiVec {
    T v[VEC];
};

// erf-GELU for 16-bit outputs: x Phi(x) = x (1 - h) for x >= 0 and x h below, where h = erfc(|x| / sqrt2) / 2
// = 2^(P(z) - z^2 log2 e), z = |x| / sqrt2, and P a degree-7 fit of log2(erfc(z) / 2) + z^2 log2 e on [0, 4.5]
// (z clamped there: past it h < 1e-10 and the clamped P keeps h's exp(-z^2) decay). One ex2 and eight FMAs:
// relative error of h ~1e-5 (bench/NOTES_kernels.md, eighteenth session: within one fp16 ulp of the exact
// GELU everywhere, absolute error under 7e-7 on [-12, 12]), and h keeps its relative accuracy in the negative
// tail, which an erf computed as 1 - erfc would not. Why not A&S 7.1.26 (a reciprocal, an exponential and a
// degree-5 polynomial; ~27 SASS instructions a value against ~17 here): on the H200 (4.2 TB/s, an H100's
// arithmetic) that pass was issue-bound at 0.76 of a same-size copy on 50 MB (805f74b), the tanh form (~13)
// at 0.91. erff (~24 PTX operations, per-range coefficients, an exp tail behind a branch) was slower still.
// +inf gives +inf; -inf gives -inf * 0 = NaN, as x Phi(x) computed directly does. fp32 outputs keep erff
// (apply_act_inline).
__device__ __forceinline__ float gelu_erf_16bit(float x)
{
    const float z = fabsf(x) * 0.70710678118654752f;
    const float zc = fminf(z, 4.5f);
    float p = fmaf(zc, -2.04339559e-05f, 0.000487860044f);
    p = fmaf(p, zc, -0.00523426097f);
    p = fmaf(p, zc, 0.0339423096f);
    p = fmaf(p, zc, -0.15248035f);
    p = fmaf(p, zc, 0.52565324f);
    p = fmaf(p, zc, -1.62807639f);
    p = fmaf(p, zc, -0.999998866f);
    const float h = ex2_ftz(fmaf(-z * z, 1.4426950408889634f, p));  // erfc(z) / 2
    return x * (x >= 0.0f ? 1.0f - h : h);
}

// tanh-GELU for 16-bit outputs: 0.5 x (1 + tanh(u)) = x * sigmoid(2 u) = x / (1 + exp(-2 u)),
// u = sqrt(2 / pi) (x + 0.044715 x^3), with the fast exponential and division (relative error ~1e-6,
// a hundredth of an fp16 ulp; a huge exp gives x * 0 = -0 where the value is under 1e-30). Why not
// tanhf: the same H200 count as the erf form's (tanhf's range-split polynomial and its exp tail
// against ~7 operations here). fp32 outputs keep tanhf (apply_act_inline).
__device__ __forceinline__ float gelu_tanh_16bit(float x)
{
    const float minus_2u = x * fmaf(-0.0713548162726f, x * x, -1.5957691216057308f);  // -2 u
    return __fdividef(x, 1.0f + __expf(minus_2u));
}

// The activation of the vector pass: apply_act_inline's, except the two GELUs into a 16-bit type.
template <typename T, int ACT>
__device__ __forceinline__ float epilogue_act(float v, const ActParams& ap)
{
    if (ACT == ACT_GELU && sizeof(T) == 2) return gelu_erf_16bit(v);
    if (ACT == ACT_GELUTANH && sizeof(T) == 2) return gelu_tanh_16bit(v);
    return apply_act_inline(v, ap);
}

// One pass of the loop below with the activation ``ACT`` fixed at compile time (ACT < 0: read from
// ap.kind per element). The kind is uniform per launch, so the kernel picks the pass once: inlined
// per element, apply_act_inline's switch was a chain of compares and branches around every value
// (2,177 PTX instructions for the 8-wide fp16 kernel, 281 of them setp and 227 bra). A thread issues
// LOADS vectors' loads (a grid step apart) before it computes any of them: more bytes in flight a
// thread where one 16-byte load a thread at full occupancy is near what a fast memory needs.
template <typename T, int VEC, int ACT, int LOADS>
__device__ __forceinline__ void epilogue_vec_pass(T* __restrict__ Y, const T* __restrict__ bias, int nv, int row_v,
                                                  float alpha, float beta, ActParams ap)
{
    typedef EpiVec<T, VEC> V;
    if (ACT >= 0) ap.kind = ACT;  // a constant the compiler folds the switch with
    V* yv = reinterpret_cast<V*>(Y);
    const V* bv = reinterpret_cast<const V*>(bias);
    const int step = gridDim.x * blockDim.x;
    const int rv = row_v > 0 ? row_v : 1;  // no bias row read when there is none (N may then be anything)
    const int step_col = step % rv;
    int col = (blockIdx.x * blockDim.x + threadIdx.x) % rv;  // j % row_v, advanced without a division a vector
    for (int j0 = blockIdx.x * blockDim.x + threadIdx.x; j0 < nv; j0 += LOADS * step) {
        V y[LOADS], b[LOADS];
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            if (j0 + u * step < nv) {  // the host bounds nv below 2**31 / VEC: no overflow
                y[u] = yv[j0 + u * step];
                if (bias) b[u] = bv[col];
            }
            if (bias) {
                col += step_col;
                if (col >= rv) col -= rv;
            }
        }
#pragma unroll
        for (int u = 0; u < LOADS; ++u) {
            if (j0 + u * step >= nv) break;
            if (bias) {
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    y[u].v[k] = Num<T>::from_f(epilogue_act<T, ACT>(alpha * Num<T>::to_f(y[u].v[k]) + beta * Num<T>::to_f(b[u].v[k]), ap));
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) y[u].v[k] = Num<T>::from_f(epilogue_act<T, ACT>(alpha * Num<T>::to_f(y[u].v[k]), ap));
            }
            yv[j0 + u * step] = y[u];
        }
    }
}

template <typename T, int VEC, int LOADS>
__global__ void __launch_bounds__(256) epilogue_gemm_vec(T* __restrict__ Y, const T* __restrict__ bias, int total, int N,
                                                         float alpha, float beta, int act, float act_alpha,
                                                         float act_beta, float lo, float hi)
{
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    const int nv = total / VEC, row_v = N / VEC;
    switch (act) {  // the GEMM epilogues' activations get their own pass; the rarer ones share one
        case ACT_NONE: epilogue_vec_pass<T, VEC, ACT_NONE, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
        case ACT_RELU: epilogue_vec_pass<T, VEC, ACT_RELU, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
        case ACT_GELU: epilogue_vec_pass<T, VEC, ACT_GELU, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
        case ACT_GELUTANH: epilogue_vec_pass<T, VEC, ACT_GELUTANH, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
        case ACT_SILU: epilogue_vec_pass<T, VEC, ACT_SILU, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
        default: epilogue_vec_pass<T, VEC, -1, LOADS>(Y, bias, nv, row_v, alpha, beta, ap); break;
    }
}

// cols[n][(c, r, s)][oh * OW + ow] = X[n][c][oh*sh - ph + r*dh][ow*sw - pw + s*dw] (0 outside).
template <typename T>
__global__ void im2col(const T* __restrict__ X, T* __restrict__ cols, int N, int C, int H, int W,
                       int KH, int KW, int sh, int sw, int ph, int pw, int dh, int dw, int OH, int OW)
{
    const long long OHW = (long long)OH * OW;
    const long long total = (long long)N * C * KH * KW * OHW;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int p = (int)(i % OHW);
        long long rest = i / OHW;
        const int s = (int)(rest % KW); rest /= KW;
        const int r = (int)(rest % KH); rest /= KH;
        const int c = (int)(rest % C);
        const int n = (int)(rest / C);
        const int oh = p / OW, ow = p % OW;
        const int ih = oh * sh - ph + r * dh, iw = ow * sw - pw + s * dw;
        T v = T(0);
        if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) v = X[(((long long)n * C + c) * H + ih) * W + iw];
        cols[i] = v;
    }
}

// X [N][C][HW] -> Y [N][HW][C] (NCHW to NHWC), 32x32 tiles through shared memory; block (32, 8).
template <typename T>
__global__ void nchw_to_nhwc(const T* __restrict__ X, T* __restrict__ Y, int C, int HW)
{
    __shared__ T tile[32][33];
    const long long off = (long long)blockIdx.z * C * HW;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = c0 + i, p = p0 + threadIdx.x;
        if (c < C && p < HW) tile[i][threadIdx.x] = X[off + (long long)c * HW + p];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int p = p0 + i, c = c0 + threadIdx.x;
        if (c < C && p < HW) Y[off + (long long)p * C + c] = tile[threadIdx.x][i];
    }
}

// Conv weight [M][Cg][KHW] -> [M][KHW][Cg] (the K order (r, s, c) of the NHWC implicit GEMM).
template <typename T>
__global__ void weight_to_rsc(const T* __restrict__ Wt, T* __restrict__ Wr, int M, int Cg, int KHW)
{
    const long long total = (long long)M * Cg * KHW;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % Cg);
        const long long t = i / Cg;
        const int rs = (int)(t % KHW);
        const long long m = t / KHW;
        Wr[i] = Wt[(m * Cg + c) * KHW + rs];
    }
}

// X [N][C][HW] -> Y [N][HW][Cp] with channels C..Cp-1 zero (Cp > C): the channel padding of the
// cudnn_cpad lowering (graphopt/providers/cudnn_cpad.py), for activations and OIHW weights alike.
// One thread per pixel writes its Cp channels contiguously; the reads of one channel are coalesced
// across the threads of a warp (consecutive pixels).
template <typename T>
__global__ void pad_channels_nhwc(const T* __restrict__ X, T* __restrict__ Y, long long pixels, int C, int Cp, int HW)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / HW;
        const int p = (int)(i % HW);
        const T* x = X + n * C * HW + p;
        T* y = Y + i * Cp;
        for (int c = 0; c < Cp; ++c) y[c] = c < C ? x[(long long)c * HW] : T(0);
    }
}

// Keeps the GPU busy for about `cycles` SM clocks, so the host can queue timed work behind it.
extern "C" __global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
