// cuBLASLt's im2col variant for image stems (graphopt/providers/cublaslt.py, ``cublaslt_im2col``): the
// packing launch before its matmul. Its own file, so that adding it left every other kernel's source
// hash (and so the tuning cache's entries) unchanged.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) I2cVec {
    T v[VEC];
};

// The stride, in vectors, of a tile row in shared memory: the row's vectors, made odd so that the eight
// lanes of a quarter-warp, each writing one 16-byte vector of its own row, hit eight different 16-byte
// bank groups (an even stride put two lanes on one group; 19, ResNet-50's stem, is odd already).
__host__ __device__ __forceinline__ int im2col_tile_stride(int chunks) { return chunks | 1; }

// One k of a GEMM row, the same for every pixel: X's offset from the pixel's window origin
// (c*H*W + r*dh*W + s*dw) and the window position (r*dh, s*dw) the bounds test adds to the origin's; 0s
// past K (the zero padding to Kp, which the gather tests by k itself).
struct __align__(16) I2cTap {
    int off, r, s, pad;
};

// im2col into GEMM rows: cols[(n*OH + oh)*OW + ow][k] = X[n][c][oh*sh - ph + r*dh][ow*sw - pw + s*dw]
// for k = (c*KH + r)*KW + s < K (0 outside the image), 0 for K <= k < Kp, with Kp a multiple of VEC
// (16-byte rows: cuBLASLt's heuristic offers its aligned kernels). Shared memory (dynamic, sized by the
// host's cublaslt_problem.im2col_smem_bytes): Kp taps, then a tile of 32 rows.
// - The taps: (c, r, s) of every k, computed once per block, so the gathers need no per-value index
//   arithmetic (the stepping form spent ~40 PTX operations a value: divisions, 64-bit offsets, nested
//   wrap-around). A warp's lanes read the same tap (one broadcast).
// - Blocks of (32, 8) threads take 32 pixels (rows) at a time: threadIdx.x is the pixel, so a warp's
//   gathers of one k read 32 neighbouring pixels of one image row (a cache line or two: a stem's X is read
//   ~KH*KW/(sh*sw) times over, from L1 / L2), and threadIdx.y strides over the row's VEC-wide vectors.
// - The 32 rows' vectors go to the tile first (rows at im2col_tile_stride vectors), then the block writes
//   the tile, one contiguous span of cols (32 * Kp elements), consecutive threads on consecutive 16-byte
//   vectors: whole lines a warp. Writing each thread's vector straight to its row put a warp's 32 stores
//   2 * Kp bytes apart, 32 half-filled sectors a store instruction; ResNet-50's stem at bs32 packed in
//   234.9 us on the H100 that way (bench/results/stem_breakdown_h100_34c2a8f.md, against ~35 us for its
//   122 MB). A first version gave each thread one vector of a row and adjacent threads adjacent vectors:
//   its warps' gathers touched ~20 lines each (bench/NOTES_kernels.md, eleventh session).
// Then the weights: Wp[m][k] = Wt[m][k] for k < K, 0 after (the GEMM's other operand, K padded like
// cols), over the grid's flat thread index.
// int indices: the provider admits only sizes whose element counts fit (cublaslt_problem.im2col_reason:
// cols, Y, and every window origin and tap offset within an image, padding and dilation included).
template <typename T, int VEC>
__global__ void __launch_bounds__(256) im2col_rows(const T* __restrict__ X, const T* __restrict__ Wt,
                                                   T* __restrict__ cols, T* __restrict__ Wp,
                                                   int C, int H, int W, int KH, int KW, int sh, int sw, int ph,
                                                   int pw, int dh, int dw, int OH, int OW, int rows, int K, int Kp, int M)
{
    typedef I2cVec<T, VEC> V;
    extern __shared__ __align__(16) unsigned char im2col_smem[];
    I2cTap* taps = reinterpret_cast<I2cTap*>(im2col_smem);
    V* tile_s = reinterpret_cast<V*>(taps + Kp);
    const int chunks = Kp / VEC;
    const int stride = im2col_tile_stride(chunks);
    const int tiles = (rows + 31) / 32;
    const int flat = threadIdx.y * 32 + threadIdx.x;
    for (int k = flat; k < Kp; k += 256) {
        const int s = k % KW, r = (k / KW) % KH, c = k / (KW * KH);
        const bool real = k < K;  // past K, c runs past C: no offset is formed (it could overflow)
        I2cTap tp;
        tp.off = real ? (c * H + r * dh) * W + s * dw : 0;
        tp.r = real ? r * dh : 0;
        tp.s = real ? s * dw : 0;
        tp.pad = 0;
        taps[k] = tp;
    }
    // the store loop's (row, vector) of index flat, and how far 256 indices move them
    const int q0 = flat / chunks, r0 = flat % chunks, dq = 256 / chunks, dr = 256 % chunks;
    __syncthreads();
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int row0 = tile * 32;
        const int row = row0 + threadIdx.x;
        if (row < rows) {
            const int ow = row % OW, t = row / OW;
            const int ih0 = (t % OH) * sh - ph, iw0 = ow * sw - pw;
            const T* xn = X + (long long)(t / OH) * C * H * W;
            const int origin = ih0 * W + iw0;  // the window's origin in the image, maybe negative; origin + off is
                                               // an element of the image wherever the tap lands inside
            for (int ch = threadIdx.y; ch < chunks; ch += blockDim.y) {
                V v;
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    const int k = ch * VEC + j;
                    const I2cTap tp = taps[k];
                    const bool inside = k < K && (unsigned)(ih0 + tp.r) < (unsigned)H && (unsigned)(iw0 + tp.s) < (unsigned)W;
                    v.v[j] = inside ? xn[origin + tp.off] : T(0);
                }
                tile_s[threadIdx.x * stride + ch] = v;
            }
        }
        __syncthreads();
        const int n = (rows - row0 < 32 ? rows - row0 : 32) * chunks;  // the tile's vectors, contiguous in cols
        V* out = reinterpret_cast<V*>(cols + (long long)row0 * Kp);
        int q = q0, rem = r0;  // i = q * chunks + rem
        for (int i = flat; i < n; i += 256) {
            out[i] = tile_s[q * stride + rem];
            q += dq;
            rem += dr;
            if (rem >= chunks) { rem -= chunks; ++q; }
        }
        __syncthreads();  // the next tile's gathers overwrite tile_s
    }
    const int threads = gridDim.x * blockDim.x * blockDim.y;
    for (int j0 = (blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x; j0 < M * chunks; j0 += threads) {
        const int m = j0 / chunks, k0 = (j0 - m * chunks) * VEC;
        V v;
#pragma unroll
        for (int j = 0; j < VEC; ++j) v.v[j] = k0 + j < K ? Wt[(long long)m * K + k0 + j] : T(0);
        reinterpret_cast<V*>(Wp)[j0] = v;
    }
}
