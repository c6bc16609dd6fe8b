// CBR lowering: depthwise convolution (groups == C == M) in NHWC, fp32 accumulation, bias and
// activation fused. One thread computes VEC consecutive channels of one output pixel: threads walk
// the output in memory order (channels fastest), so each window tap is one coalesced 16-byte load of X
// per thread and the store one 16-byte store of Y (VEC == 1: any channel count). The weights stay in
// their ONNX order [C][1][KH][KW] (read through the read-only cache). In NHWC a MobileNet or
// EfficientNet block needs no layout conversion around its depthwise layer, where graphopt's NCHW
// `direct_k3` made the tuner alternate layouts (33 conversions in MobileNetV2 at bs32) and cuDNN's
// NHWC depthwise plans were 11x slower (bench/NOTES_e2e.md).
template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) DwVec {
    T v[VEC];
};

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
depthwise_nhwc(const T* __restrict__ X, const T* __restrict__ Wt, const T* __restrict__ Bias, T* __restrict__ Y,
               int N, int C, int H, int W, int OH, int OW, int KH, int KW, int sh, int sw, int ph, int pw,
               int dh, int dw, int act, float act_alpha, float act_beta, float lo, float hi)
{
    const int CV = C / VEC;
    const long long total = (long long)N * OH * OW * CV;
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int cv = (int)(idx % CV);
        long long rest = idx / CV;
        const int ow = (int)(rest % OW); rest /= OW;
        const int oh = (int)(rest % OH);
        const int n = (int)(rest / OH);
        const int c = cv * VEC;
        float acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = 0.0f;
        const int ih0 = oh * sh - ph, iw0 = ow * sw - pw;
        for (int r = 0; r < KH; ++r) {
            const int ih = ih0 + r * dh;
            if ((unsigned)ih >= (unsigned)H) continue;
            for (int s = 0; s < KW; ++s) {
                const int iw = iw0 + s * dw;
                if ((unsigned)iw >= (unsigned)W) continue;
                const DwVec<T, VEC> xv = *reinterpret_cast<const DwVec<T, VEC>*>(
                    X + (((long long)n * H + ih) * W + iw) * C + c);
                const T* wp = Wt + (long long)c * KH * KW + r * KW + s;
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[v] += Num<T>::to_f(xv.v[v]) * Num<T>::load(wp + v * KH * KW);
            }
        }
        DwVec<T, VEC> out;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const float b = Bias ? Num<T>::load(Bias + c + v) : 0.0f;
            out.v[v] = Num<T>::from_f(apply_act_inline(acc[v] + b, ap));
        }
        *reinterpret_cast<DwVec<T, VEC>*>(Y + (((long long)n * OH + oh) * OW + ow) * C + c) = out;
    }
}
