// 2-D max / average pooling over any strides, so one kernel serves NCHW and NHWC storage (the layout
// is a property of the strides; the output is written in the input's layout, and a CNN region stays
// NHWC through its pooling). One thread per output element; threads walk the output in its memory
// order (channels fastest for NHWC), so both the loads and the store are coalesced.
//
// MODE 0: max (NaN propagates, as numpy.maximum); 1: average over the cells inside the input
// (count_include_pad = 0); 2: average over the cells inside the padded input (count_include_pad = 1:
// explicit pads count, the ceil-mode overhang does not). fp32 accumulation.
// Global pooling is the window H x W with stride 1 and no pads.

template <typename T, int MODE>
__global__ void pool2d(const T* __restrict__ x, T* __restrict__ y, int N, int C, int H, int W,
                       long long sxn, long long sxc, long long sxh, long long sxw,
                       int OH, int OW, long long syn, long long syc, long long syh, long long syw,
                       int KH, int KW, int SH, int SW, int DH, int DW, int PT, int PL, int PB, int PR,
                       int c_fastest) {
    const long long total = (long long)N * C * OH * OW;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int n, c, oh, ow;
        long long r = idx;
        if (c_fastest) {
            c = (int)(r % C); r /= C; ow = (int)(r % OW); r /= OW; oh = (int)(r % OH); n = (int)(r / OH);
        } else {
            ow = (int)(r % OW); r /= OW; oh = (int)(r % OH); r /= OH; c = (int)(r % C); n = (int)(r / C);
        }
        const T* xb = x + n * sxn + c * sxc;
        const int h0 = oh * SH - PT, w0 = ow * SW - PL;
        float acc = MODE == 0 ? -__int_as_float(0x7f800000) : 0.0f;  // -inf (no math headers under NVRTC)
        int cnt = 0;
        for (int i = 0; i < KH; ++i) {
            const int h = h0 + i * DH;
            if (h < 0 || h >= H) continue;
            for (int j = 0; j < KW; ++j) {
                const int w = w0 + j * DW;
                if (w < 0 || w >= W) continue;
                const float v = Num<T>::load(xb + h * sxh + w * sxw);
                if (MODE == 0) {
                    if (v > acc || v != v) acc = (acc != acc) ? acc : v;  // a NaN, once seen, stays
                } else {
                    acc += v;
                }
                ++cnt;
            }
        }
        if (MODE == 1) acc = cnt ? acc / (float)cnt : 0.0f;
        if (MODE == 2) {  // window cells inside the padded input [-PT, H + PB) x [-PL, W + PR)
            int hc = 0, wc = 0;
            for (int i = 0; i < KH; ++i) hc += (h0 + i * DH >= -PT && h0 + i * DH < H + PB);
            for (int j = 0; j < KW; ++j) wc += (w0 + j * DW >= -PL && w0 + j * DW < W + PR);
            acc = hc * wc ? acc / (float)(hc * wc) : 0.0f;
        }
        y[n * syn + c * syc + oh * syh + ow * syw] = Num<T>::from_f(acc);
    }
}
