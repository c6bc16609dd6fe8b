// 2-D max / average pooling over any strides, so one kernel serves NCHW and NHWC storage (the layout
// is a property of the strides; the output is written in the input's layout, and a CNN region stays
// NHWC through its pooling). One thread per output element (VEC == 1), or per VEC consecutive channels
// when channels are contiguous in both tensors (NHWC, 16-byte aligned: one vector load per window
// cell). Threads walk the output in its memory order (channels fastest for NHWC), so the loads and the
// store are coalesced. Indices are 32-bit: the host only launches tensors under 2^31 elements.
//
// MODE 0: max (NaN propagates, as numpy.maximum); 1: average over the cells inside the input
// (count_include_pad = 0); 2: average over the cells inside the padded input (count_include_pad = 1:
// explicit pads count, the ceil-mode overhang does not). fp32 accumulation.
// Global pooling is the window H x W with stride 1 and no pads.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) PoolVec {
    T v[VEC];
};

template <typename T, int MODE, int VEC>
__global__ void pool2d(const T* __restrict__ x, T* __restrict__ y, int N, int C, int H, int W,
                       int sxn, int sxc, int sxh, int sxw, int OH, int OW, int syn, int syc, int syh, int syw,
                       int KH, int KW, int SH, int SW, int DH, int DW, int PT, int PL, int PB, int PR,
                       int c_fastest) {
    const int CV = C / VEC;  // channel groups (C % VEC == 0 when VEC > 1)
    const int total = N * CV * OH * OW;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
        int n, c, oh, ow, r = idx;
        if (c_fastest) {
            c = (r % CV) * VEC; r /= CV; ow = r % OW; r /= OW; oh = r % OH; n = r / OH;
        } else {
            ow = r % OW; r /= OW; oh = r % OH; r /= OH; c = (r % CV) * VEC; n = r / CV;
        }
        const T* xb = x + (long long)n * sxn + (long long)c * sxc;
        const int h0 = oh * SH - PT, w0 = ow * SW - PL;
        float acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = MODE == 0 ? -__int_as_float(0x7f800000) : 0.0f;  // -inf
        int cnt = 0;
        for (int i = 0; i < KH; ++i) {
            const int h = h0 + i * DH;
            if (h < 0 || h >= H) continue;
            for (int j = 0; j < KW; ++j) {
                const int w = w0 + j * DW;
                if (w < 0 || w >= W) continue;
                const PoolVec<T, VEC> pv = *reinterpret_cast<const PoolVec<T, VEC>*>(xb + (long long)h * sxh + (long long)w * sxw);
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const float f = Num<T>::to_f(pv.v[v]);
                    if (MODE == 0) {
                        if (f > acc[v] || f != f) acc[v] = (acc[v] != acc[v]) ? acc[v] : f;  // a NaN, once seen, stays
                    } else {
                        acc[v] += f;
                    }
                }
                ++cnt;
            }
        }
        float div = 1.0f;
        if (MODE == 1) div = (float)cnt;
        if (MODE == 2) {  // window cells inside the padded input [-PT, H + PB) x [-PL, W + PR)
            int hc = 0, wc = 0;
            for (int i = 0; i < KH; ++i) hc += (h0 + i * DH >= -PT && h0 + i * DH < H + PB);
            for (int j = 0; j < KW; ++j) wc += (w0 + j * DW >= -PL && w0 + j * DW < W + PR);
            div = (float)(hc * wc);
        }
        PoolVec<T, VEC> out;
#pragma unroll
        for (int v = 0; v < VEC; ++v) out.v[v] = Num<T>::from_f(MODE == 0 ? acc[v] : (div > 0.0f ? acc[v] / div : 0.0f));
        *reinterpret_cast<PoolVec<T, VEC>*>(y + (long long)n * syn + (long long)c * syc + (long long)oh * syh + (long long)ow * syw) = out;
    }
}

// Global pooling (the window is the whole H x W: GlobalAveragePool, GlobalMaxPool, or a pool whose
// window covers its input). pool2d above gives each output one thread that walks every cell of its
// window: an EfficientNet-B0 squeeze-excite pool over 1 x 32 x 112 x 112 was 4 threads walking 12,544
// cells each, and the model's 16 such pools took most of its 5.8 ms at bs1 on the H100
// (bench/results/e2e_h100.json). Here a block serves (n, a tile of blockDim.x channel groups, a slice of
// the positions): threadIdx.x walks channel groups (NHWC: neighbouring 16-byte vectors, coalesced;
// NCHW: blockDim.x == 1 and the positions, contiguous, go across the warp), threadIdx.y strides over
// the slice's positions, fp32 accumulation, and the block reduces over threadIdx.y in shared memory
// (blockDim.y a power of two). One slice (gridDim.y == 1): row 0 writes y. Several (average only): row 0
// writes the slice's sums to part[slice][n][c] (fp32) and global_pool_finish adds the slices in order
// and scales into y: deterministic, unlike atomics, and nothing to zero first.
// MODE 0: max (a NaN, once seen, stays); 1: average.
template <typename T, int MODE, int VEC>
__global__ void global_pool(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ part, int N, int C,
                            int H, int W, int sxn, int sxc, int sxh, int sxw, int syn, int syc, int per_slice) {
    extern __shared__ float red[];  // blockDim.x * blockDim.y * VEC
    const int CV = C / VEC;
    const int tiles = (CV + blockDim.x - 1) / blockDim.x;
    const int n = blockIdx.x / tiles;
    const int cv = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    const int HW = H * W;
    const int p0 = blockIdx.y * per_slice;
    const int p1 = min(HW, p0 + per_slice);
    float a[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) a[v] = MODE == 0 ? -__int_as_float(0x7f800000) : 0.0f;  // -inf
    if (n < N && cv < CV) {
        const T* xb = x + (long long)n * sxn + (long long)cv * VEC * sxc;
        for (int p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
            const int h = p / W, w = p - h * W;
            const PoolVec<T, VEC> pv = *reinterpret_cast<const PoolVec<T, VEC>*>(xb + (long long)h * sxh + (long long)w * sxw);
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const float f = Num<T>::to_f(pv.v[v]);
                if (MODE == 0) {
                    if (f > a[v] || f != f) a[v] = (a[v] != a[v]) ? a[v] : f;
                } else {
                    a[v] += f;
                }
            }
        }
    }
    const int me = (threadIdx.y * blockDim.x + threadIdx.x) * VEC;
#pragma unroll
    for (int v = 0; v < VEC; ++v) red[me + v] = a[v];
    __syncthreads();
    for (int s = blockDim.y / 2; s > 0; s >>= 1) {
        if (threadIdx.y < s) {
            const int other = me + s * blockDim.x * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const float f = red[other + v];
                if (MODE == 0) {
                    const float m = red[me + v];
                    if (f > m || f != f) red[me + v] = (m != m) ? m : f;
                } else {
                    red[me + v] += f;
                }
            }
        }
        __syncthreads();
    }
    if (threadIdx.y == 0 && n < N && cv < CV) {
        const int c = cv * VEC;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const float f = red[me + v];
            if (gridDim.y == 1) {
                y[(long long)n * syn + (long long)(c + v) * syc] = Num<T>::from_f(MODE == 0 ? f : f / (float)HW);
            } else {
                part[((long long)blockIdx.y * N + n) * C + c + v] = f;
            }
        }
    }
}

template <typename T>
__global__ void global_pool_finish(const float* __restrict__ part, T* __restrict__ y, int N, int C, int S, int syn,
                                   int syc, float scale) {
    const int total = N * C;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
        const int n = idx / C, c = idx - n * C;
        float sum = 0.0f;
        for (int s = 0; s < S; ++s) sum += part[(long long)s * total + idx];
        y[(long long)n * syn + (long long)c * syc] = Num<T>::from_f(sum * scale);
    }
}
