// CBR lowering: depthwise convolution (groups == C == M) in NHWC, fp32 accumulation, bias and
// activation fused. In NHWC a MobileNet or EfficientNet block needs no layout conversion around its
// depthwise layer, where graphopt's NCHW `direct_k3` made the tuner alternate layouts (33 conversions
// in MobileNetV2 at bs32) and cuDNN's NHWC depthwise plans were 11x slower (bench/NOTES_e2e.md).
//
// A block owns a tile of TCV channel vectors (VEC consecutive channels each, 16 bytes when VEC > 1)
// and walks output pixels: thread (tx, ty) = (threadIdx.x % TCV, threadIdx.x / TCV) computes channel
// vector tx of pixels ty, ty + PY, ... (PY = blockDim.x / TCV; grid-stride over blockIdx.x), so a
// warp's loads of X are consecutive 16-byte vectors of one or a few neighbouring pixels. The block
// first copies its tile's weights from their ONNX order [C][1][KH][KW] into shared memory as fp32
// (weight_slot's layout: a row a tap), so every tap's weights for a thread's VEC channels are 16-byte shared loads
// (broadcast across ty) that need no conversion: converting them at every use was 72 of a 3x3
// fp16 output vector's ~200 instructions, and at bs32 the kernel is instruction-bound as much as
// memory-bound (bench/NOTES_kernels.md). KH_ and KW_ fixed at compile time (3x3, 5x5) unroll the
// window (the compiled code still issues one tap's load, then its arithmetic, then the next tap's: loading
// the whole window first was slower, bench/NOTES_kernels.md, sixteenth session). Small layers are latency-bound: a chain of dependent memory
// round trips per thread sets their time (the first version, a runtime window loop with scalar
// weight loads: 7 us for every 3x3 and 15 us for every 5x5 layer at bs1 on the H100 whatever its size,
// against 3-5 us for cuDNN; see the staging below for the second). KH_ == 0: the window comes from
// KH, KW at run time (any size).
//
// RY > 1 (unrolled windows, vertical stride and dilation 1): a thread computes RY vertically adjacent
// outputs of its channel vector. Their windows share all but one input row each, so it reads the
// RY + KH - 1 input rows of its column once and converts each input vector once, where one output
// at a time read KH rows per output (the rows above and below coming from L2, read by other blocks).
template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) DwVec {
    T v[VEC];
};

// Where channel ch of the block's tile (tap `tap`) sits in the shared fp32 weight tile. VEC a multiple of 4
// (fp16 / bf16: 8, fp32: 4): [tap][plane][vector][4], plane q holding channels 4q..4q+3 of every channel
// vector, so a thread's loads of a tap's VEC weights are VEC / 4 16-byte loads, each next to its
// neighbour's (thread tx reads float4 q * TCV + tx of the tap's row). A warp's 16-byte shared loads are
// served a quarter-warp (8 threads) at a time: neighbouring float4s are on distinct banks, so a quarter
// conflicts only where it spans two pixels (TCV over 8 and not a multiple of 8: 20 of 64 quarters at 144
// channels). The first layout, [tap][channel] at VEC = 8, put neighbouring threads' loads 32 bytes apart:
// a quarter's eight threads on 16 banks twice, a two-way conflict on 62 of 64 quarters, on 18 of the 27
// loads an output vector of a 3x3 window makes (bench/NOTES_kernels.md, sixteenth session). At VEC = 4
// the two layouts are the same. Otherwise (one channel a thread): [tap][channel].
template <int VEC>
__device__ __forceinline__ int weight_slot(int ch, int tap, int TCW) {
    if constexpr (VEC % 4 == 0) {
        const int cvl = ch / VEC, v = ch - cvl * VEC;
        return tap * TCW + ((v >> 2) * (TCW / VEC) + cvl) * 4 + (v & 3);
    } else {
        return tap * TCW + ch;
    }
}

// A tap's fp32 weights for thread tx's VEC channels from the shared tile's row of that tap (weight_slot's
// layout; TCV channel vectors a tile).
template <int VEC>
__device__ __forceinline__ void tap_weights(const float* tap_row, int tx, int TCV, float (&wv)[VEC]) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q) {
            const float4 f = reinterpret_cast<const float4*>(tap_row)[q * TCV + tx];
            wv[4 * q] = f.x; wv[4 * q + 1] = f.y; wv[4 * q + 2] = f.z; wv[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) wv[v] = tap_row[tx * VEC + v];
    }
}

// One output vector: the sums plus the bias, the activation dispatched once for the vector (apply_act_n;
// once a channel cost ~8 dispatches an output, bench/NOTES_kernels.md, sixteenth session), one 16-byte store.
template <typename T, int VEC>
__device__ __forceinline__ void store_output(T* y, const float (&acc)[VEC], const float (&bias)[VEC], const ActParams& ap) {
    float o[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) o[v] = acc[v] + bias[v];
    apply_act_n<VEC>(o, ap);
    DwVec<T, VEC> out;
#pragma unroll
    for (int v = 0; v < VEC; ++v) out.v[v] = Num<T>::from_f(o[v]);
    *reinterpret_cast<DwVec<T, VEC>*>(y) = out;
}

// The block's weight tile from ONNX order [C][1][KH][KW] into shared memory as fp32, TCW channels a tap
// (weight_slot's layout). The tile's weights are contiguous in Wt: tile_c * KK elements from c0 * KK, a whole
// number of VEC vectors aligned to VEC elements (C and c0 are multiples of VEC). Each thread loads up to
// STAGE vectors before it stores any, so the block waits for about one memory round trip here; one load
// and its store per iteration (the first tiled version) chained 9 round trips for a 3x3 tile of 256
// channels and 25 for a 5x5 one, 5-13 us at bs1 on the H200 (bench/NOTES_e2e.md).
template <typename T, int VEC>
__device__ __forceinline__ void stage_weights(const T* __restrict__ Wt, float* sw_, int c0, int tile_c, int KK, int TCW) {
    constexpr int STAGE = 4;
    const DwVec<T, VEC>* wsrc = reinterpret_cast<const DwVec<T, VEC>*>(Wt + (long long)c0 * KK);
    const int nvec = tile_c * KK / VEC;
    for (int j0 = threadIdx.x; j0 < nvec; j0 += STAGE * blockDim.x) {
        DwVec<T, VEC> w[STAGE];
#pragma unroll
        for (int b = 0; b < STAGE; ++b) {
            const int j = j0 + b * blockDim.x;
            if (j < nvec) w[b] = wsrc[j];
        }
#pragma unroll
        for (int b = 0; b < STAGE; ++b) {
            const int j = j0 + b * blockDim.x;
            if (j >= nvec) break;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const int i = j * VEC + v, ch = i / KK, tap = i - ch * KK;
                sw_[weight_slot<VEC>(ch, tap, TCW)] = Num<T>::to_f(w[b].v[v]);
            }
        }
    }
}

template <typename T, int VEC, int KH_, int KW_, int RY>
__global__ void __launch_bounds__(256)
depthwise_nhwc(const T* __restrict__ X, const T* __restrict__ Wt, const T* __restrict__ Bias, T* __restrict__ Y,
               int N, int C, int H, int W, int OH, int OW, int KH, int KW, int sh, int sw, int ph, int pw,
               int dh, int dw, int TCV, unsigned ow_mul, int ow_shr, unsigned ohg_mul, int ohg_shr,
               int act, float act_alpha, float act_beta, float lo, float hi)
{
    extern __shared__ __align__(16) unsigned char dw_smem[];
    float* sw_ = reinterpret_cast<float*>(dw_smem);  // KH * KW rows of TCV * VEC, converted to fp32 once here
    if (KH_ > 0) { KH = KH_; KW = KW_; }
    const int KK = KH * KW;
    const int CV = C / VEC;
    const int TCW = TCV * VEC;                 // channels of a full tile
    const int c0 = blockIdx.y * TCW;           // this tile's first channel
    const int tile_c = min(TCW, C - c0);
    stage_weights<T, VEC>(Wt, sw_, c0, tile_c, KK, TCW);
    __syncthreads();
    const int PY = blockDim.x / TCV;
    const int tx = threadIdx.x % TCV, ty = threadIdx.x / TCV;
    const int cv = blockIdx.y * TCV + tx;
    if (ty >= PY || cv >= CV) return;          // the block's spare threads; no barrier follows
    const int c = cv * VEC;
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    float bias[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) bias[v] = Bias ? Num<T>::load(Bias + c + v) : 0.0f;
    const int OHG = (OH + RY - 1) / RY;  // groups of RY output rows
    const unsigned groups = (unsigned)N * OHG * OW;  // under 2^31: the launcher's geometry caps every tensor
    for (unsigned p = blockIdx.x * PY + ty; p < groups; p += gridDim.x * PY) {
        // p = (n * OHG + row group) * OW + ow, split by OW and OHG's fast divisors (the launcher's)
        const unsigned rest = fast_div(p, ow_mul, ow_shr);
        const int ow = (int)(p - rest * OW);
        const unsigned n_ = fast_div(rest, ohg_mul, ohg_shr);
        const int oh0 = (int)(rest - n_ * OHG) * RY;
        const int n = (int)n_;
        float acc[RY][VEC];
#pragma unroll
        for (int i = 0; i < RY; ++i)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[i][v] = 0.0f;
        const int iw0 = ow * sw - pw;
        const T* xn = X + (long long)n * H * W * C + c;
        if constexpr (RY == 1) {
            const int ih0 = oh0 * sh - ph;
            auto tap = [&](const T* xp, const float* tap_row) {  // one tap's input vector into the sums
                const DwVec<T, VEC> xv = *reinterpret_cast<const DwVec<T, VEC>*>(xp);
                float wv[VEC];
                tap_weights<VEC>(tap_row, tx, TCV, wv);
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[0][v] += Num<T>::to_f(xv.v[v]) * wv[v];
            };
            // An unrolled window wholly inside the image (all but the border outputs): a row's taps at a
            // fixed step from its first, no bounds check a tap (a tap was ~40 instructions, ~20 of them its
            // index arithmetic and checks; bench/NOTES_kernels.md, sixteenth session). The rows are not
            // unrolled, so a thread has one row's loads in flight, not the window's: loading all nine first
            // took 74 registers (this form: 61, the checked loop alone: 48) and was slower (regs=x, same
            // notes). Same sums, same order.
            const bool inside = KH_ > 0 && ih0 >= 0 && ih0 + (KH - 1) * dh < H && iw0 >= 0 && iw0 + (KW - 1) * dw < W;
            if (inside) {
                const T* xrow = xn + ((long long)ih0 * W + iw0) * C;
                const long long rstep = (long long)dh * W * C;
                const int sstep = dw * C;
#pragma unroll 1
                for (int r = 0; r < KH; ++r, xrow += rstep) {
#pragma unroll
                    for (int s = 0; s < (KW_ > 0 ? KW_ : 1); ++s) tap(xrow + s * sstep, sw_ + (r * KW + s) * TCW);
                }
            } else {
#pragma unroll
                for (int r = 0; r < (KH_ > 0 ? KH_ : KH); ++r) {
                    const int ih = ih0 + r * dh;
                    if ((unsigned)ih >= (unsigned)H) continue;
#pragma unroll
                    for (int s = 0; s < (KW_ > 0 ? KW_ : KW); ++s) {
                        const int iw = iw0 + s * dw;
                        if ((unsigned)iw >= (unsigned)W) continue;
                        tap(xn + ((long long)ih * W + iw) * C, sw_ + (r * KW + s) * TCW);
                    }
                }
            }
        } else {  // sh == dh == 1 (the launcher's condition): input row t serves output i with tap row t - i
            static_assert(RY == 1 || KH_ > 0, "row groups need an unrolled window");
            const int ih0 = oh0 - ph;
#pragma unroll
            for (int t = 0; t < RY + KH_ - 1; ++t) {
                const int ih = ih0 + t;
                if ((unsigned)ih >= (unsigned)H) continue;
#pragma unroll
                for (int s = 0; s < KW_; ++s) {
                    const int iw = iw0 + s * dw;
                    if ((unsigned)iw >= (unsigned)W) continue;
                    const DwVec<T, VEC> xv = *reinterpret_cast<const DwVec<T, VEC>*>(xn + ((long long)ih * W + iw) * C);
                    float xf[VEC];
#pragma unroll
                    for (int v = 0; v < VEC; ++v) xf[v] = Num<T>::to_f(xv.v[v]);
#pragma unroll
                    for (int i = 0; i < RY; ++i) {
                        const int r = t - i;
                        if (r < 0 || r >= KH_) continue;  // resolved at compile time
                        float wv[VEC];
                        tap_weights<VEC>(sw_ + (r * KW_ + s) * TCW, tx, TCV, wv);
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[i][v] += xf[v] * wv[v];
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RY; ++i) {
            if (oh0 + i >= OH) break;
            store_output<T, VEC>(Y + (((long long)n * OH + oh0 + i) * OW + ow) * C + c, acc[i], bias, ap);
        }
    }
}

// Spatially tiled form: a block computes a TH x TW tile of output pixels (of one image) for a tile of TCV
// channel vectors. It first copies the tile's input window, (TH - 1) * sh + (KH - 1) * dh + 1 rows by
// (TW - 1) * sw + (KW - 1) * dw + 1 columns of TCV vectors (zeros outside the image: the padding), into
// shared memory with consecutive threads on consecutive 16-byte vectors, then every thread computes its
// channel vector of outputs ty, ty + P, ... of the tile from shared memory. The per-pixel form above reads
// each input vector KH * KW times through L1 / L2 (the rows above and below from other blocks): at bs32 on
// the H100 it moved MobileNetV2's depthwise layers at 0.18-0.55 of the copy rate (cbr_layers_h100.md,
// 2026-12-07). Here each input vector is read from DRAM / L2 once per tile it falls in (1.2-1.6 times for
// 3x3 windows on 8x8 to 16x16 tiles) and the window's reuse comes from shared memory.
template <typename T, int VEC, int KH_, int KW_>
__global__ void __launch_bounds__(256)
depthwise_nhwc_tiled(const T* __restrict__ X, const T* __restrict__ Wt, const T* __restrict__ Bias, T* __restrict__ Y,
                     int N, int C, int H, int W, int OH, int OW, int KH, int KW, int sh, int sw, int ph, int pw,
                     int dh, int dw, int TCV, int TH, int TW, int act, float act_alpha, float act_beta, float lo, float hi)
{
    extern __shared__ __align__(16) unsigned char dw_smem[];
    if (KH_ > 0) { KH = KH_; KW = KW_; }
    const int KK = KH * KW;
    const int TCW = TCV * VEC;
    const int c0 = blockIdx.y * TCW;
    const int tcv_here = min(TCW, C - c0) / VEC;   // the tile's channel vectors (the last tile may hold fewer)
    const int IHT = (TH - 1) * sh + (KH - 1) * dh + 1, IWT = (TW - 1) * sw + (KW - 1) * dw + 1;
    float* sw_ = reinterpret_cast<float*>(dw_smem);  // KK rows of TCW fp32 (weight_slot's layout), then the input window
    DwVec<T, VEC>* sx = reinterpret_cast<DwVec<T, VEC>*>(dw_smem + (size_t)KK * TCW * sizeof(float));  // [IHT * IWT][TCV]
    stage_weights<T, VEC>(Wt, sw_, c0, tcv_here * VEC, KK, TCW);
    const int tiles_w = (OW + TW - 1) / TW, tiles_h = (OH + TH - 1) / TH;
    const int tw_i = blockIdx.x % tiles_w, th_n = blockIdx.x / tiles_w;
    const int th_i = th_n % tiles_h, n = th_n / tiles_h;
    const int oh0 = th_i * TH, ow0 = tw_i * TW;
    const int ih0 = oh0 * sh - ph, iw0 = ow0 * sw - pw;
    const T* xn = X + (long long)n * H * W * C + c0;
    // Each thread loads up to XSTAGE window vectors before it stores any (as stage_weights does): one load
    // and its store per iteration would chain the block's ceil(IHT * IWT * TCV / 256) memory round trips.
    constexpr int XSTAGE = 4;
    const int nvec = IHT * IWT * TCV;
    for (int k0 = threadIdx.x; k0 < nvec; k0 += XSTAGE * blockDim.x) {
        DwVec<T, VEC> v[XSTAGE];
#pragma unroll
        for (int b = 0; b < XSTAGE; ++b) {
            const int k = k0 + b * blockDim.x;
            const int cvl = k % TCV, pix = k / TCV;
            const int iy = pix / IWT, ix = pix - iy * IWT;
            const int ih = ih0 + iy, iw = iw0 + ix;
            if (k < nvec && cvl < tcv_here && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W) {
                v[b] = *reinterpret_cast<const DwVec<T, VEC>*>(xn + ((long long)ih * W + iw) * C + cvl * VEC);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[b].v[e] = Num<T>::from_f(0.0f);
            }
        }
#pragma unroll
        for (int b = 0; b < XSTAGE; ++b) {
            const int k = k0 + b * blockDim.x;
            if (k >= nvec) break;
            sx[k] = v[b];
        }
    }
    __syncthreads();
    const int P = blockDim.x / TCV;
    const int tx = threadIdx.x % TCV, ty = threadIdx.x / TCV;
    if (ty >= P || tx >= tcv_here) return;      // the block's spare threads; no barrier follows
    const int c = c0 + tx * VEC;
    ActParams ap; ap.kind = act; ap.alpha = act_alpha; ap.beta = act_beta; ap.lo = lo; ap.hi = hi;
    float bias[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) bias[v] = Bias ? Num<T>::load(Bias + c + v) : 0.0f;
    for (int j = ty; j < TH * TW; j += P) {
        const int oy = j / TW, ox = j - oy * TW;
        const int oh = oh0 + oy, ow = ow0 + ox;
        if (oh >= OH || ow >= OW) continue;
        float acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = 0.0f;
        const DwVec<T, VEC>* xrow = sx + ((oy * sh) * IWT + ox * sw) * TCV + tx;
#pragma unroll
        for (int r = 0; r < (KH_ > 0 ? KH_ : KH); ++r) {
#pragma unroll
            for (int s = 0; s < (KW_ > 0 ? KW_ : KW); ++s) {
                const DwVec<T, VEC> xv = xrow[(r * dh * IWT + s * dw) * TCV];
                float wv[VEC];
                tap_weights<VEC>(sw_ + (r * KW + s) * TCW, tx, TCV, wv);
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[v] += Num<T>::to_f(xv.v[v]) * wv[v];
            }
        }
        store_output<T, VEC>(Y + (((long long)n * OH + oh) * OW + ow) * C + c, acc, bias, ap);
    }
}
