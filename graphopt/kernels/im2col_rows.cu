// cuBLASLt's im2col variant for image stems (graphopt/providers/cublaslt.py, ``cublaslt_im2col``): the
// packing launch before its matmul. Its own file, so that adding it left every other kernel's source
// hash (and so the tuning cache's entries) unchanged.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) I2cVec {
    T v[VEC];
};

// im2col into GEMM rows (cuBLASLt's im2col variant, image stems): cols[(n*OH + oh)*OW + ow][k] =
// X[n][c][oh*sh - ph + r*dh][ow*sw - pw + s*dw] for k = (c*KH + r)*KW + s < K (0 outside the image), 0 for
// K <= k < Kp, with Kp a multiple of VEC (16-byte rows: the heuristic's aligned algorithms). A thread
// writes one VEC-wide vector, adjacent threads adjacent vectors (coalesced 16-byte stores; the gathers
// read X, a few MB, through L2). The threads after the rows pad the weights the same way:
// Wp[m][k] = Wt[m][k] for k < K, 0 after (the GEMM's other operand, K padded like cols).
// int indices: the provider admits only sizes whose vector count fits (cublaslt_problem.im2col_reason).
template <typename T, int VEC>
__global__ void __launch_bounds__(256) im2col_rows(const T* __restrict__ X, const T* __restrict__ Wt,
                                                   T* __restrict__ cols, T* __restrict__ Wp,
                                                   int C, int H, int W, int KH, int KW, int sh, int sw, int ph,
                                                   int pw, int dh, int dw, int OH, int OW, int rows, int K, int Kp, int M)
{
    typedef I2cVec<T, VEC> V;
    const int chunks = Kp / VEC;
    const int col_vecs = rows * chunks;
    const int total = col_vecs + M * chunks;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        V v;
        if (i < col_vecs) {
            const int row = i / chunks, k0 = (i - row * chunks) * VEC;
            const int ow = row % OW, t = row / OW;
            const int oh = t % OH, n = t / OH;
            int s = k0 % KW, r = (k0 / KW) % KH, c = k0 / (KW * KH);  // (c, r, s) of k0, then stepped
            const T* xn = X + (long long)n * C * H * W;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                T x = T(0);
                const int ih = oh * sh - ph + r * dh, iw = ow * sw - pw + s * dw;
                if (k0 + j < K && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
                    x = xn[((long long)c * H + ih) * W + iw];
                v.v[j] = x;
                if (++s == KW) { s = 0; if (++r == KH) { r = 0; ++c; } }
            }
            reinterpret_cast<V*>(cols)[i] = v;
        } else {
            const int j0 = i - col_vecs, m = j0 / chunks, k0 = (j0 - m * chunks) * VEC;
#pragma unroll
            for (int j = 0; j < VEC; ++j) v.v[j] = k0 + j < K ? Wt[(long long)m * K + k0 + j] : T(0);
            reinterpret_cast<V*>(Wp)[j0] = v;
        }
    }
}
