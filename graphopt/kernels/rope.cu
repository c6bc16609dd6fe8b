// RoPE: Y = X * cos + rotate(X) * sin over the last axis (length D, even) of X; one thread per
// rotated pair (lo, hi): the halves j and j + D/2 (INTERLEAVED 0, rotate_half) or the neighbours
// 2i and 2i + 1 (INTERLEAVED 1, GPT-J):
//   y[lo] = x[lo] * cos[lo] - x[hi] * sin[lo]
//   y[hi] = x[hi] * cos[hi] + x[lo] * sin[hi]
// cos and sin broadcast to X: ``meta`` (int32, device) holds X's NLEAD leading dims, then cos's stride
// of each leading dim (0 where it broadcasts), then sin's, then cos's and sin's stride of the last axis.
// Arithmetic in fp32. The host guarantees every tensor holds fewer than 2**31 elements.

template <typename T, int INTERLEAVED>
__global__ void __launch_bounds__(256) rope(
    const T* __restrict__ X, const T* __restrict__ cosv, const T* __restrict__ sinv, T* __restrict__ Y,
    int pairs, int D, int nlead, const int* __restrict__ meta)
{
    const int half = D >> 1;
    const int cl = meta[3 * nlead], sl = meta[3 * nlead + 1];
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += gridDim.x * blockDim.x) {
        const int row = p / half;
        const int i = p - row * half;
        int r = row, co = 0, so = 0;
        for (int k = nlead - 1; k >= 0; --k) {
            const int d = meta[k];
            const int q = r / d;
            const int idx = r - q * d;
            r = q;
            co += idx * meta[nlead + k];
            so += idx * meta[2 * nlead + k];
        }
        const int lo = INTERLEAVED ? 2 * i : i;
        const int hi = INTERLEAVED ? 2 * i + 1 : i + half;
        const long long base = (long long)row * D;
        const float xl = Num<T>::to_f(X[base + lo]);
        const float xh = Num<T>::to_f(X[base + hi]);
        const float cL = Num<T>::to_f(cosv[co + lo * cl]), cH = Num<T>::to_f(cosv[co + hi * cl]);
        const float sL = Num<T>::to_f(sinv[so + lo * sl]), sH = Num<T>::to_f(sinv[so + hi * sl]);
        Y[base + lo] = Num<T>::from_f(xl * cL - xh * sL);
        Y[base + hi] = Num<T>::from_f(xh * cH + xl * sH);
    }
}
