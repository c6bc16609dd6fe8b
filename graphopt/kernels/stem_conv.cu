// CBR lowering for convolutions with few input channels (C <= 4, groups 1): the image stems of CNNs
// (3 channels in, 3x3 or 7x7, stride 2). fp32 accumulation, bias and activation fused, X read in NCHW
// (the graph input's own layout), Y written NHWC (Y_NHWC = 1: 16-byte stores of MV channels) or NCHW.
//
// Why: a stem's K = C*KH*KW is 27 (3x3) to 147 (7x7), too short for a tensor-core tile and an odd
// row for a GEMM, so implicit GEMM and cuDNN ran MobileNetV2's 3x3 stem at bs32 in 88 us on the H200
// where its bytes need ~8 us and its 0.35 GFMA ~10 us on the CUDA cores; cuDNN offered one 550 us plan
// for its Clip form (bench/NOTES_e2e.md). Here a thread computes MV output channels of one pixel: it
// reads the pixel's C*KH*KW inputs once and takes every weight from shared memory, where the block
// staged all M x K of them as fp32 [k][m] (a warp's threads share their channel group, so each weight
// read is one broadcast 16-byte load). Threads walk pixels fastest, so a warp's input reads are
// neighbouring columns. With Y in NHWC the channel group varies fastest instead, so a warp's stores
// are one contiguous run (its input loads broadcasts). Index arithmetic is 32-bit: the launcher's
// geometry keeps every tensor under 2^31 elements. KS > 0: a KS x KS window known at compile time, its
// taps unrolled, so a thread issues all of a channel's input loads before its first FMA (the first
// version, KH and KW at run time and a branch per tap, ran MobileNetV2's bs32 stem in 58-97 us on the
// H100; unrolled, 55.4 us: not latency but shared memory bound, see PX); KS = 0: any window, at run time.
// PX: horizontally adjacent output pixels a thread computes, each weight it loads from shared memory
// used PX times. Shared memory delivers 128 B a clock to an SM's registers, broadcast or not, and
// every output needs its K weights delivered: with PX = 1 MobileNetV2's bs32 stem moves 1.4 GB that
// way, a ~47 us floor on the H100 that the measured 55 us sits on (bench/NOTES_e2e.md); PX = 4 cuts
// it to a quarter.
template <typename T, int MV>
struct __align__(sizeof(T) * MV < 16 ? sizeof(T) * MV : 16) StemOut {
    T v[MV];
};

template <typename T, int MV, int KS, int PX>
__global__ void __launch_bounds__(256)
stem_conv(const T* __restrict__ X, const T* __restrict__ Wt, const T* __restrict__ Bias, T* __restrict__ Y,
          int N, int C, int H, int W, int M, int OH, int OW, int KH, int KW, int sh, int sw, int ph, int pw,
          int dh, int dw, int y_nhwc, int act, float act_alpha, float act_beta, float lo, float hi)
{
    extern __shared__ __align__(16) float stem_smem[];  // [K][M] weights, then [M] bias
    const int K = C * KH * KW;
    {   // stage: Wt is [M][K] (OIHW); up to 8 loads in flight per thread before their stores
        constexpr int STAGE = 8;
        const int total = M * K;
        for (int i0 = threadIdx.x; i0 < total; i0 += STAGE * blockDim.x) {
            float w[STAGE];
#pragma unroll
            for (int b = 0; b < STAGE; ++b) {
                const int i = i0 + b * blockDim.x;
                w[b] = i < total ? Num<T>::load(Wt + i) : 0.0f;
            }
#pragma unroll
            for (int b = 0; b < STAGE; ++b) {
                const int i = i0 + b * blockDim.x;
                if (i < total) {
                    const int m = i / K, k = i - m * K;
                    stem_smem[k * M + m] = w[b];
                }
            }
        }
        for (int m = threadIdx.x; m < M; m += blockDim.x) stem_smem[K * M + m] = Bias ? Num<T>::load(Bias + m) : 0.0f;
    }
    __syncthreads();
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    const int OWG = (OW + PX - 1) / PX;  // pixel slots per output row: PX adjacent pixels each
    const unsigned slots = (unsigned)N * OH * OWG, groups = M / MV;
    const unsigned total = slots * groups;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
        const unsigned q = y_nhwc ? idx / groups : idx % slots;
        const int m0 = (int)(y_nhwc ? idx % groups : idx / slots) * MV;
        const int ow0 = (int)(q % OWG) * PX;
        const unsigned rest = q / OWG;
        const int oh = (int)(rest % OH);
        const int n = (int)(rest / OH);
        float acc[PX][MV];
#pragma unroll
        for (int i = 0; i < PX; ++i)
#pragma unroll
            for (int j = 0; j < MV; ++j) acc[i][j] = stem_smem[K * M + m0 + j];
        const int ih0 = oh * sh - ph, iw0 = ow0 * sw - pw;
        const int kh = KS > 0 ? KS : KH, kw = KS > 0 ? KS : KW;
        int k = 0;
        for (int c = 0; c < C; ++c) {
            const T* xc = X + ((long long)n * C + c) * H * W;
#pragma unroll
            for (int r = 0; r < kh; ++r) {  // kh, kw: compile-time constants when KS > 0, fully unrolled
                const int ih = ih0 + r * dh;
                const bool row_in = (unsigned)ih < (unsigned)H;
#pragma unroll
                for (int s = 0; s < kw; ++s, ++k) {
                    // outside the image (or past the row's last pixel slot): a zero input, no branch
                    float x[PX];
#pragma unroll
                    for (int i = 0; i < PX; ++i) {
                        const int iw = iw0 + i * sw + s * dw;
                        x[i] = row_in && (unsigned)iw < (unsigned)W ? Num<T>::load(xc + ih * W + iw) : 0.0f;
                    }
                    const float4* wk = reinterpret_cast<const float4*>(stem_smem + k * M + m0);
#pragma unroll
                    for (int j = 0; j < MV / 4; ++j) {
                        const float4 w4 = wk[j];  // one shared load, PX pixels' FMAs
#pragma unroll
                        for (int i = 0; i < PX; ++i) {
                            acc[i][4 * j] += x[i] * w4.x; acc[i][4 * j + 1] += x[i] * w4.y;
                            acc[i][4 * j + 2] += x[i] * w4.z; acc[i][4 * j + 3] += x[i] * w4.w;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < PX; ++i) {
            const int ow = ow0 + i;
            if (ow >= OW) break;  // the row's last slot may hold fewer than PX pixels
            apply_act_n<MV>(acc[i], ap);  // one dispatch for the pixel's MV channels, not one a channel
            const unsigned p = ((unsigned)n * OH + oh) * OW + ow;
            if (y_nhwc) {
                StemOut<T, MV> out;
#pragma unroll
                for (int j = 0; j < MV; ++j) out.v[j] = Num<T>::from_f(acc[i][j]);
                *reinterpret_cast<StemOut<T, MV>*>(Y + (long long)p * M + m0) = out;
            } else {
                T* yp = Y + ((long long)n * M + m0) * OH * OW + (long long)oh * OW + ow;
#pragma unroll
                for (int j = 0; j < MV; ++j) yp[(long long)j * OH * OW] = Num<T>::from_f(acc[i][j]);
            }
        }
    }
}
