// CBR lowering (a): direct convolution, NCHW in and out, fp32 accumulation.
// One thread computes OPT consecutive output columns of one (n, m, oh) row, looping over the
// group's input channels and the filter window. Good for depthwise and small channel counts, where
// a GEMM formulation wastes its tiles. Bias, residual and activation are fused.

// KWF = 3 specialises for a 3-wide window with dilation 1 and stride SWF (1 or 2) along W: each
// input row segment the OPT outputs need is loaded once into registers and reused by all taps.
// KWF = 0 is the generic loop (any window, stride and dilation).
template <typename T, int OPT, int KWF, int SWF>
__global__ void __launch_bounds__(256)
direct_conv(const T* __restrict__ X, const T* __restrict__ Wt, const T* __restrict__ Bias,
            const T* __restrict__ R, T* __restrict__ Y,
            int N, int C, int H, int W, int M, int OH, int OW, int KH, int KW,
            int sh, int sw, int ph, int pw, int dh, int dw, int G,
            int rs_n, int rs_m, int rs_p,
            int act, float act_alpha, float act_beta, float lo, float hi)
{
    const int OWT = (OW + OPT - 1) / OPT;
    const long long total = (long long)N * M * OH * OWT;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int owt = (int)(idx % OWT);
    long long rest = idx / OWT;
    const int oh = (int)(rest % OH); rest /= OH;
    const int m = (int)(rest % M);
    const int n = (int)(rest / M);
    const int Cg = C / G, Mg = M / G, g = m / Mg;
    const int ow0 = owt * OPT;

    float acc[OPT];
#pragma unroll
    for (int j = 0; j < OPT; ++j) acc[j] = 0.0f;

    const T* xg = X + ((long long)n * C + (long long)g * Cg) * H * W;
    const T* wm = Wt + (long long)m * Cg * KH * KW;
    const int ih0 = oh * sh - ph;
    for (int c = 0; c < Cg; ++c) {
        const T* xc = xg + (long long)c * H * W;
        const T* wc = wm + c * KH * KW;
        for (int r = 0; r < KH; ++r) {
            const int ih = ih0 + r * dh;
            if ((unsigned)ih >= (unsigned)H) continue;
            const T* xr = xc + (long long)ih * W;
            if constexpr (KWF == 3) {
                constexpr int WIN = (OPT - 1) * SWF + 3;
                float xin[WIN];
                const int iw0 = ow0 * SWF - pw;
#pragma unroll
                for (int q = 0; q < WIN; ++q) {
                    const int iw = iw0 + q;
                    xin[q] = ((unsigned)iw < (unsigned)W) ? Num<T>::load(xr + iw) : 0.0f;
                }
                const float w0 = Num<T>::load(wc + r * 3), w1 = Num<T>::load(wc + r * 3 + 1), w2 = Num<T>::load(wc + r * 3 + 2);
#pragma unroll
                for (int j = 0; j < OPT; ++j)
                    acc[j] += w0 * xin[j * SWF] + w1 * xin[j * SWF + 1] + w2 * xin[j * SWF + 2];
            } else {
                for (int s = 0; s < KW; ++s) {
                    const float wv = Num<T>::load(wc + r * KW + s);
#pragma unroll
                    for (int j = 0; j < OPT; ++j) {
                        const int iw = (ow0 + j) * sw - pw + s * dw;
                        if ((unsigned)iw < (unsigned)W) acc[j] += wv * Num<T>::load(xr + iw);
                    }
                }
            }
        }
    }

    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    const float bv = Bias ? Num<T>::load(Bias + m) : 0.0f;
    const long long obase = (((long long)n * M + m) * OH + oh) * OW;
    float v[OPT];
#pragma unroll
    for (int j = 0; j < OPT; ++j) {
        const int ow = ow0 + j;
        v[j] = acc[j] + bv;
        if (R && ow < OW) v[j] += Num<T>::load(R + (long long)n * rs_n + (long long)m * rs_m + (long long)(oh * OW + ow) * rs_p);
    }
    apply_act_n<OPT>(v, ap);  // one dispatch for the thread's OPT outputs, not one an output
#pragma unroll
    for (int j = 0; j < OPT; ++j) {
        const int ow = ow0 + j;
        if (ow >= OW) break;
        Y[obase + ow] = Num<T>::from_f(v[j]);
    }
}
