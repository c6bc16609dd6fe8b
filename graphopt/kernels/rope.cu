// RoPE: Y = X * cos + rotate(X) * sin over the last axis (length D, even) of X; one thread per
// rotated pair (lo, hi): the halves j and j + D/2 (INTERLEAVED 0, rotate_half) or the neighbours
// 2i and 2i + 1 (INTERLEAVED 1, GPT-J):
//   y[lo] = x[lo] * cos[lo] - x[hi] * sin[lo]
//   y[hi] = x[hi] * cos[hi] + x[lo] * sin[hi]
// Y is C-contiguous; X's rows (D contiguous elements each) may lie elsewhere: the op's x_bshd=1 reads
// X [B, S, H, D] for Y [B, H, S, D]. cos and sin broadcast to Y: ``meta`` (int32, device) holds Y's NLEAD
// leading dims, then cos's stride of each leading dim (0 where it broadcasts), then sin's, then X's
// (its rows' strides), then cos's and sin's stride of the last axis.
// Arithmetic in fp32. The host guarantees every tensor holds fewer than 2**31 elements.

template <typename T, int INTERLEAVED>
__global__ void __launch_bounds__(256) rope(
    const T* __restrict__ X, const T* __restrict__ cosv, const T* __restrict__ sinv, T* __restrict__ Y,
    int pairs, int D, int nlead, const int* __restrict__ meta)
{
    const int half = D >> 1;
    const int cl = meta[4 * nlead], sl = meta[4 * nlead + 1];
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += gridDim.x * blockDim.x) {
        const int row = p / half;
        const int i = p - row * half;
        int r = row, co = 0, so = 0, xo = 0;
        for (int k = nlead - 1; k >= 0; --k) {
            const int d = meta[k];
            const int q = r / d;
            const int idx = r - q * d;
            r = q;
            co += idx * meta[nlead + k];
            so += idx * meta[2 * nlead + k];
            xo += idx * meta[3 * nlead + k];
        }
        const int lo = INTERLEAVED ? 2 * i : i;
        const int hi = INTERLEAVED ? 2 * i + 1 : i + half;
        const long long base = (long long)row * D;
        const float xl = Num<T>::to_f(X[xo + lo]);
        const float xh = Num<T>::to_f(X[xo + hi]);
        const float cL = Num<T>::to_f(cosv[co + lo * cl]), cH = Num<T>::to_f(cosv[co + hi * cl]);
        const float sL = Num<T>::to_f(sinv[so + lo * sl]), sH = Num<T>::to_f(sinv[so + hi * sl]);
        Y[base + lo] = Num<T>::from_f(xl * cL - xh * sL);
        Y[base + hi] = Num<T>::from_f(xh * cH + xl * sH);
    }
}

// The same with 16-byte loads: each thread takes VEC consecutive elements of a row: VEC pairs of the
// halves (INTERLEAVED 0: VEC elements at j and at j + D/2) or VEC/2 neighbour pairs (INTERLEAVED 1).
// The host guarantees contiguous last axes of cos and sin (stride 1), D/2 % VEC == 0 (halves) or
// D % VEC == 0 (pairs), and 16-byte aligned X, Y, cos and sin.
template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) RopeVec {
    T v[VEC];
};

template <typename T, int INTERLEAVED, int VEC>
__global__ void __launch_bounds__(256) rope_vec(
    const T* __restrict__ X, const T* __restrict__ cosv, const T* __restrict__ sinv, T* __restrict__ Y,
    int units, int D, int nlead, const int* __restrict__ meta)
{
    static_assert(VEC % 2 == 0, "an even number of elements per load");
    typedef RopeVec<T, VEC> V;
    const int half = D >> 1;
    const int per_row = INTERLEAVED ? D / VEC : half / VEC;
    for (int u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
        const int row = u / per_row;
        const int j = (u - row * per_row) * VEC;
        int r = row, co = 0, so = 0, xo = 0;
        for (int k = nlead - 1; k >= 0; --k) {
            const int d = meta[k];
            const int q = r / d;
            const int idx = r - q * d;
            r = q;
            co += idx * meta[nlead + k];
            so += idx * meta[2 * nlead + k];
            xo += idx * meta[3 * nlead + k];
        }
        const long long base = (long long)row * D + j;
        const int xj = xo + j;
        if (INTERLEAVED) {
            const V x = *reinterpret_cast<const V*>(X + xj);
            const V c = *reinterpret_cast<const V*>(cosv + co + j);
            const V s = *reinterpret_cast<const V*>(sinv + so + j);
            V o;
#pragma unroll
            for (int k = 0; k < VEC; k += 2) {
                const float xl = Num<T>::to_f(x.v[k]), xh = Num<T>::to_f(x.v[k + 1]);
                o.v[k] = Num<T>::from_f(xl * Num<T>::to_f(c.v[k]) - xh * Num<T>::to_f(s.v[k]));
                o.v[k + 1] = Num<T>::from_f(xh * Num<T>::to_f(c.v[k + 1]) + xl * Num<T>::to_f(s.v[k + 1]));
            }
            *reinterpret_cast<V*>(Y + base) = o;
        } else {
            const V xl = *reinterpret_cast<const V*>(X + xj);
            const V xh = *reinterpret_cast<const V*>(X + xj + half);
            const V cl = *reinterpret_cast<const V*>(cosv + co + j);
            const V ch = *reinterpret_cast<const V*>(cosv + co + j + half);
            const V sl = *reinterpret_cast<const V*>(sinv + so + j);
            const V sh = *reinterpret_cast<const V*>(sinv + so + j + half);
            V ol, oh;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float a = Num<T>::to_f(xl.v[k]), b = Num<T>::to_f(xh.v[k]);
                ol.v[k] = Num<T>::from_f(a * Num<T>::to_f(cl.v[k]) - b * Num<T>::to_f(sl.v[k]));
                oh.v[k] = Num<T>::from_f(b * Num<T>::to_f(ch.v[k]) + a * Num<T>::to_f(sh.v[k]));
            }
            *reinterpret_cast<V*>(Y + base) = ol;
            *reinterpret_cast<V*>(Y + base + half) = oh;
        }
    }
}
