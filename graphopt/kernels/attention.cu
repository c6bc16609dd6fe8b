// Attention: Y = softmax(Q . K^T * scale [+ mask] [causal]) . V, per (b, h) of a [B, H, S, D] layout.
//
// Two lowerings share the masking code (mask_value_at):
// - attn_softmax: the fused scale-free mask / causal / softmax / nan_to_zero kernel that runs in place
//   on the scores between two cuBLAS batched GEMMs (graphopt/kernels/attention_cublas.py, ``cublas_softmax``).
//   One row per CTA of WARPS warps, VEC scores per load: pass 1 keeps a running (max, sum of exp)
//   per thread (online softmax, ms_push), one block reduction combines them, pass 2 writes
//   exp(x - max) / sum. attn_softmax_rows: the same for short rows, LANES lanes a row, many rows a CTA.
// - flash_attn: one fused kernel (``flash``), online softmax over key tiles of 32 held in shared
//   memory, fp32 everywhere in registers (SIMT: no tensor cores yet). A CTA of WARPS warps takes BM
//   query rows of one (b, h); each warp owns BM / WARPS rows. Per key tile, lane j computes the score
//   of key j for each of its warp's rows, a warp max / sum updates the row's running max and
//   denominator, and each lane accumulates its DMAX / 32 output columns from V's tile.
//
// Masks (MASK): 0 none; 1 additive (T values); 2 bool (bytes, nonzero = attend; a masked score gets
// mask_value added, -inf by default). The mask is read through four element strides over
// (b, h, query i, key j), 0 where it broadcasts. causal masks key j > query i (top-left aligned).
// Fully masked rows give NaN, as the ONNX Softmax does, or 0 with nan_to_zero.

#define ATTN_NEG_INF (__int_as_float(0xff800000))

struct AttnMask {
    const void* ptr;
    long long sb, sh, si, sj;
    float value;   // bool masks: added where the mask is false
    int causal;
};

// Kernel arguments (scalars: CuPy passes no structs) and the struct the device code uses.
#define ATTN_MASK_ARGS const void* mptr, long long msb, long long msh, long long msi, long long msj, float mvalue, int causal

__device__ __forceinline__ AttnMask make_mask(const void* p, long long sb, long long sh, long long si, long long sj,
                                              float value, int causal) {
    AttnMask m;
    m.ptr = p; m.sb = sb; m.sh = sh; m.si = si; m.sj = sj; m.value = value; m.causal = causal;
    return m;
}

template <typename T, int MASK>
__device__ __forceinline__ float masked_score(float x, const AttnMask& m, int b, int h, int i, int j) {
    if (m.causal && j > i) return ATTN_NEG_INF;
    if (MASK == 0) return x;
    const long long off = (long long)b * m.sb + (long long)h * m.sh + (long long)i * m.si + (long long)j * m.sj;
    if (MASK == 1) return x + Num<T>::load(reinterpret_cast<const T*>(m.ptr) + off);
    return reinterpret_cast<const unsigned char*>(m.ptr)[off] ? x : x + m.value;
}

#define ATTN_NAN (__int_as_float(0x7fc00000))

// Running (max, sum of exp(x - max)) pairs: combine b into a. A NaN max (a NaN score seen) makes the
// pair NaN for good, as a NaN score makes the reference's row max NaN (fmaxf alone would drop it).
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) { m = s = ATTN_NAN; return; }
    const float mx = fmaxf(m, m2);
    if (mx == ATTN_NEG_INF) return;  // both empty
    s = (m == ATTN_NEG_INF ? 0.0f : s * expf(m - mx)) + (m2 == ATTN_NEG_INF ? 0.0f : s2 * expf(m2 - mx));
    m = mx;
}

template <int WARPS>
__device__ __forceinline__ void block_max_sum(float& m, float& s, float* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
    if (WARPS == 1) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous row's readers are done with sh
    if (lane == 0) { sh[warp] = m; sh[32 + warp] = s; }
    __syncthreads();
    m = lane < WARPS ? sh[lane] : ATTN_NEG_INF;
    s = lane < WARPS ? sh[32 + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
}

// One score into a thread's running (max, sum): ms_combine(m, s, x, 1) with one exp per score
// instead of two (the second only when the max grows). Same results for every input: a -inf score
// adds nothing, a NaN score makes the pair NaN for good (also as the first score seen), and a +inf
// score gives exp(inf - inf) = NaN (hence the expf(x - x), 1 for finite x), as ms_combine does.
__device__ __forceinline__ void ms_push(float& m, float& s, float x) {
    if (x != x) {
        m = s = ATTN_NAN;
    } else if (x > m) {
        s = (m == ATTN_NEG_INF ? 0.0f : s * expf(m - x)) + expf(x - x);
        m = x;
    } else if (m != ATTN_NEG_INF && x != ATTN_NEG_INF) {
        s += expf(x - m);
    }
}

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) SoftmaxVec {
    T v[VEC];
};

// One output probability of a row whose running (max, sum) is (m, 1 / inv), as the reference computes
// it: NaN for a row with nothing attended and for every score of a row whose sum is NaN (a NaN or +inf
// score), 0 for a masked score otherwise; nan_to_zero turns every NaN probability into 0 (the
// reference's elementwise IsNaN / Where). The strided forms' pass 2.
template <typename T, int MASK>
__device__ __forceinline__ float softmax_prob(T raw, const AttnMask& mask, int b, int h, int i, int j, float m,
                                              float inv, bool empty, int nan_to_zero) {
    float p = ATTN_NAN;
    if (!empty && inv == inv) {
        const float x = masked_score<T, MASK>(Num<T>::to_f(raw), mask, b, h, i, j);
        p = x == ATTN_NEG_INF ? 0.0f : expf(x - m) * inv;
    }
    return (nan_to_zero && p != p) ? 0.0f : p;
}

// One short row, a lane's vectors strided (jv = lane, lane + LANES, ...): pass 1 keeps a running
// (max, sum of exp) (ms_push), the group combines them, pass 2 re-reads and writes the probabilities.
template <typename T, int LANES, int MASK, int VEC>
__device__ __forceinline__ void softmax_row_strided(SoftmaxVec<T, VEC>* pr, int nv, int lane, bool live,
                                                    const AttnMask& mask, int b, int h, int i, int nan_to_zero) {
    float m = ATTN_NEG_INF, s = 0.0f;
    if (live) {
        for (int jv = lane; jv < nv; jv += LANES) {
            const SoftmaxVec<T, VEC> a = pr[jv];
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                ms_push(m, s, masked_score<T, MASK>(Num<T>::to_f(a.v[k]), mask, b, h, i, jv * VEC + k));
        }
    }
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
    if (!live) return;
    const bool empty = m == ATTN_NEG_INF;
    const float inv = 1.0f / s;
    for (int jv = lane; jv < nv; jv += LANES) {  // the row re-read (on the H100 a version holding a
        const SoftmaxVec<T, VEC> a = pr[jv];     // lane's loads in fixed register slots was slower)
        SoftmaxVec<T, VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            o.v[k] = Num<T>::from_f(softmax_prob<T, MASK>(a.v[k], mask, b, h, i, jv * VEC + k, m, inv, empty, nan_to_zero));
        pr[jv] = o;
    }
}

// Rows held in registers (LOADS > 0 in both softmax kernels), torch's warp-softmax order: a thread
// issues its LOADS loads of the row before any arithmetic (the strided loops wait on each load before
// the next), the row max is reduced, then exp(x - max) once per score, kept for the sum's reduction and
// the scaled store: one exp a score (the strided forms take up to three) and no re-read. NaN-propagating
// max (nan_max): a NaN score makes its row NaN, as the reference's max does; a +inf score too
// (exp(inf - inf)); a row with nothing attended gives NaN, or 0 with nan_to_zero. torch takes 16.1 us
// on BERT-base's bs32 scores on the H100, the strided short-row form 24.0.
// max.NaN (sm_80+) is one instruction where the compare-and-select form takes three or four: the held
// forms run it once a score (the twelfth session's instruction count, NOTES_kernels 2026-12-07).
__device__ __forceinline__ float nan_max(float a, float b) {
#if __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (a != a || b != b) ? ATTN_NAN : fmaxf(a, b);
#endif
}

// A thread's LOADS vectors of a row (vector first + t * stride), all loaded first, as masked scores in
// x; returns their max (NaN if one is NaN, -inf for none attended or a thread past the rows). Without a
// mask and causal (uniform per launch) the scores are taken as they are: no per-score mask test.
template <typename T, int MASK, int VEC, int LOADS>
__device__ __forceinline__ float held_load(const SoftmaxVec<T, VEC>* pr, int first, int stride, bool live,
                                           const AttnMask& mask, int b, int h, int i, float (&x)[LOADS * VEC]) {
    float m = ATTN_NEG_INF;
    if (!live) {
#pragma unroll
        for (int j = 0; j < LOADS * VEC; ++j) x[j] = ATTN_NEG_INF;
        return m;
    }
    SoftmaxVec<T, VEC> raw[LOADS];
#pragma unroll
    for (int t = 0; t < LOADS; ++t) raw[t] = pr[first + t * stride];
    if (MASK == 0 && !mask.causal) {
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                x[t * VEC + k] = Num<T>::to_f(raw[t].v[k]);
                m = nan_max(m, x[t * VEC + k]);
            }
        }
        return m;
    }
#pragma unroll
    for (int t = 0; t < LOADS; ++t) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            x[t * VEC + k] = masked_score<T, MASK>(Num<T>::to_f(raw[t].v[k]), mask, b, h, i, (first + t * stride) * VEC + k);
            m = nan_max(m, x[t * VEC + k]);
        }
    }
    return m;
}

// x = exp(x - m) in place as 2^((x - m) * log2(e)): the hardware's ex2 alone (exp2f's rescaling and
// the masked-score tests left out, NOTES_kernels 2026-12-07); relative error about |x - m| * 4e-8 more
// than expf, under 2e-6 for scores 40 apart. The difference comes first: a row whose scores all equal a
// huge finite fill (finfo.min, a fully masked row of an HF or BERT mask) gives x - m = 0 exactly, where
// x * log2(e) - m * log2(e) left the rounding of a 1e38 product (or an overflow) and made the row NaN.
// The special values need no test: a masked score (-inf) gives 2^-inf = 0; a row with nothing attended
// (m = -inf) takes m as 0, so its -inf scores give 0 too; a NaN max, or a +inf one (inf - inf), makes
// the row's exps and sum NaN. Returns the sum. exp2f was 4-12 % faster than expf on the H100
// (2026-12-06, fifth session); the fp32 gate (1e-5) held.
template <int N>
__device__ __forceinline__ float held_exp(float (&x)[N], float m) {
    const float log2e = 1.4426950408889634f;
    const float mm = m == ATTN_NEG_INF ? 0.0f : m;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        x[j] = ex2_ftz((x[j] - mm) * log2e);
        s += x[j];
    }
    return s;
}

// The probabilities x / s stored where held_load read them: NaN for a row with nothing attended
// (m == -inf: its exps are 0, times a NaN inverse) and, through s, for every score of a row with a NaN
// or +inf score; nan_to_zero turns every NaN probability into 0 (the reference's elementwise IsNaN /
// Where) as fmaxf(p, 0): fmaxf returns its non-NaN operand and a probability is never negative; without
// nan_to_zero the floor is NaN, which fmaxf passes over. One instruction a score instead of the tests.
template <typename T, int VEC, int LOADS>
__device__ __forceinline__ void held_store(SoftmaxVec<T, VEC>* pr, int first, int stride, const float (&x)[LOADS * VEC],
                                           float m, float s, int nan_to_zero) {
    const float inv = m == ATTN_NEG_INF ? ATTN_NAN : 1.0f / s;
    const float floor = nan_to_zero ? 0.0f : ATTN_NAN;
#pragma unroll
    for (int t = 0; t < LOADS; ++t) {
        SoftmaxVec<T, VEC> o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = Num<T>::from_f(fmaxf(x[t * VEC + k] * inv, floor));
        pr[first + t * stride] = o;
    }
}

// max (nan_max) or sum over each aligned group of LANES lanes
template <int LANES, bool MAX>
__device__ __forceinline__ float group_reduce(float v) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? nan_max(v, w) : v + w;
    }
    return v;
}

// max (nan_max) or sum over a CTA of WARPS warps, every thread gets it (sh: WARPS floats, reused by the
// next call once every thread has read it)
template <int WARPS, bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* sh) {
    v = group_reduce<32, MAX>(v);
    if (WARPS == 1) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous reduction's readers are done with sh
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < WARPS ? sh[lane] : (MAX ? ATTN_NEG_INF : 0.0f);
    return group_reduce<32, MAX>(v);
}

// In place on P = the scaled scores, [Z = B*H][Sq][Skv] contiguous. VEC scores per load (16 bytes
// when VEC > 1: the host guarantees Skv % VEC == 0 and a 16-byte aligned P). LOADS > 0: rows of exactly
// WARPS * 32 * LOADS vectors held in registers (held_load / held_exp / held_store, block_reduce).
template <typename T, int WARPS, int MASK, int VEC, int LOADS>
__global__ void __launch_bounds__(WARPS * 32) attn_softmax(
    T* __restrict__ P, long long rows, int Sq, int Skv, int H, ATTN_MASK_ARGS, int nan_to_zero)
{
    typedef SoftmaxVec<T, VEC> V;
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    __shared__ float sh[64];
    const int nv = Skv / VEC;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const int i = (int)(row % Sq);
        const long long z = row / Sq;
        const int h = (int)(z % H), b = (int)(z / H);
        V* pr = reinterpret_cast<V*>(P + row * Skv);
        if (LOADS > 0) {
            constexpr int L = LOADS > 0 ? LOADS : 1;
            float x[L * VEC];
            const float m = block_reduce<WARPS, true>(held_load<T, MASK, VEC, L>(pr, threadIdx.x, WARPS * 32, true, mask, b, h, i, x), sh);
            const float s = block_reduce<WARPS, false>(held_exp(x, m), sh);
            held_store<T, VEC, L>(pr, threadIdx.x, WARPS * 32, x, m, s, nan_to_zero);
            continue;
        }
        float m = ATTN_NEG_INF, s = 0.0f;
        for (int jv = threadIdx.x; jv < nv; jv += WARPS * 32) {
            const V a = pr[jv];
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                ms_push(m, s, masked_score<T, MASK>(Num<T>::to_f(a.v[k]), mask, b, h, i, jv * VEC + k));
        }
        block_max_sum<WARPS>(m, s, sh);
        const bool empty = m == ATTN_NEG_INF;
        const float inv = 1.0f / s;
        for (int jv = threadIdx.x; jv < nv; jv += WARPS * 32) {
            const V a = pr[jv];
            V o;
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                o.v[k] = Num<T>::from_f(softmax_prob<T, MASK>(a.v[k], mask, b, h, i, jv * VEC + k, m, inv, empty, nan_to_zero));
            pr[jv] = o;
        }
    }
}

// One short row of exactly LANES * LOADS vectors held in registers, its reductions inside the group.
template <typename T, int LANES, int MASK, int VEC, int LOADS>
__device__ __forceinline__ void softmax_row_held(SoftmaxVec<T, VEC>* pr, int lane, bool live, const AttnMask& mask,
                                                 int b, int h, int i, int nan_to_zero) {
    float x[LOADS * VEC];
    const float m = group_reduce<LANES, true>(held_load<T, MASK, VEC, LOADS>(pr, lane, LANES, live, mask, b, h, i, x));
    const float s = group_reduce<LANES, false>(held_exp(x, m));
    if (live) held_store<T, VEC, LOADS>(pr, lane, LANES, x, m, s, nan_to_zero);
}

// Short rows: LANES (8, 16 or 32) lanes a row, 256 / LANES rows a CTA, the row's reductions done by
// shuffles inside each aligned group of LANES lanes (no shared memory, no barrier). attn_softmax gives
// a row a whole CTA, so a row of 128 scores ran one warp's latency chain per CTA: 48 us for BERT-base's
// 25 MB of bs32 scores on the H100, 0.17 of copy bandwidth (bench/results/transformer_kernels_h100.md).
// Every lane of a warp runs the same trips (a group past the last row loads and stores nothing but
// joins the shuffles), so the full-mask shuffles are defined. LOADS == 0: any row length, a lane's
// vectors strided (softmax_row_strided); LOADS > 0: rows of exactly LANES * LOADS vectors held in
// registers (softmax_row_held; the host guarantees Skv == LANES * LOADS * VEC).
template <typename T, int LANES, int MASK, int VEC, int LOADS>
__global__ void __launch_bounds__(256) attn_softmax_rows(
    T* __restrict__ P, long long rows, int Sq, int Skv, int H, ATTN_MASK_ARGS, int nan_to_zero)
{
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    const int lane = threadIdx.x % LANES;
    const long long per_cta = 256 / LANES;
    const long long warp_row0 = (threadIdx.x & ~31) / LANES;  // the first row of this warp's groups within the CTA
    for (long long base = (long long)blockIdx.x * per_cta; base < rows; base += (long long)gridDim.x * per_cta) {
        if (base + warp_row0 >= rows) continue;  // the whole warp is past the end (warp-uniform)
        const long long row = base + threadIdx.x / LANES;
        const bool live = row < rows;
        int i = 0, h = 0, b = 0;
        if (live && (MASK != 0 || mask.causal)) {  // only masks and causal read (b, h, i)
            i = (int)(row % Sq);
            const long long z = row / Sq;
            h = (int)(z % H); b = (int)(z / H);
        }
        SoftmaxVec<T, VEC>* pr = reinterpret_cast<SoftmaxVec<T, VEC>*>(P + (live ? row : 0) * Skv);
        if (LOADS == 0)
            softmax_row_strided<T, LANES, MASK, VEC>(pr, Skv / VEC, lane, live, mask, b, h, i, nan_to_zero);
        else
            softmax_row_held<T, LANES, MASK, VEC, (LOADS > 0 ? LOADS : 1)>(pr, lane, live, mask, b, h, i, nan_to_zero);
    }
}

// cublas_softmax over [B, S, H, D] operands (qkv_bshd / y_bshd / qkv_packed): the pointer arrays of its
// two cublasGemmBatchedEx calls, ptrs[k * Z + z] = base_k + off[k * Z + z] elements for k = Q, K, V, Y,
// rewritten on the stream before each call (capturable; the bases may change between runs). The
// offsets are computed once on the host (graphopt/kernels/attention_cublas.py, batch_offsets).
template <typename T>
__global__ void attn_batch_ptrs(unsigned long long* __restrict__ ptrs, const long long* __restrict__ off, int Z,
                                unsigned long long q, unsigned long long k, unsigned long long v, unsigned long long y)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 4 * Z) return;
    const int which = i / Z;
    const unsigned long long base = which == 0 ? q : which == 1 ? k : which == 2 ? v : y;
    ptrs[i] = base + (unsigned long long)(off[i] * (long long)sizeof(T));
}

// Where the (b, h) slice of Q, K, V and Y starts and how far apart its rows are: contiguous
// [Z][S][D] (K^T [Z][D][Skv] starts at the same place), or [B][S][H][D] (rows H * D apart): bit 0 of
// bshd for Q, K and V (graphopt.Attention's qkv_bshd), bit 1 for Y (y_bshd). Bit 2 (qkv_packed, with
// bit 0): Q, K and V are the thirds of one [B][S][3][H][D] tensor (the caller passes K and V at
// offsets H * D and 2 * H * D of Q), so their rows are 3 * H * D apart.
struct AttnRows { long long qz, kz, vz, yz, qs, ks, vs, ys; };
__device__ __forceinline__ AttnRows attn_rows(int b, int h, int z, int H, int Sq, int Skv, int D, int Dv, int bshd) {
    AttnRows r;
    if (bshd & 2) {
        r.yz = ((long long)b * Sq * H + h) * Dv; r.ys = (long long)H * Dv;
    } else {
        r.yz = (long long)z * Sq * Dv; r.ys = Dv;
    }
    if (bshd & 1) {
        const long long HP = (bshd & 4) ? 3LL * H : (long long)H;  // row stride in heads
        r.qz = ((long long)b * Sq * HP + h) * D;
        r.kz = ((long long)b * Skv * HP + h) * D;
        r.vz = ((long long)b * Skv * HP + h) * Dv;
        r.qs = HP * D; r.ks = HP * D; r.vs = HP * Dv;
    } else {
        r.qz = (long long)z * Sq * D; r.kz = (long long)z * Skv * D; r.vz = (long long)z * Skv * Dv;
        r.qs = D; r.ks = D; r.vs = Dv;
    }
    return r;
}

// Fused attention. Q [Z][Sq][D], K [Z][Skv][D] (kt = 0) or [Z][D][Skv] (kt = 1), V [Z][Skv][Dv],
// Y [Z][Sq][Dv], all contiguous; or (bshd = 1, kt = 0) Q, K, V as [B][S][H][D] (graphopt.Attention's
// qkv_bshd: the head's rows H * D apart), Y as before. D, Dv <= DMAX. Grid (ceil(Sq / BM), Z); dynamic shared memory
// (BM * DMAX + 32 * (DMAX + 1) + 32 * DMAX) floats.
template <typename T, int DMAX, int BM, int WARPS, int MASK>
__global__ void __launch_bounds__(WARPS * 32) flash_attn(
    const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ Y,
    int Sq, int Skv, int D, int Dv, int H, int kt, float scale, ATTN_MASK_ARGS, int nan_to_zero, int bshd)
{
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    static_assert(DMAX % 32 == 0 && DMAX >= 32 && DMAX <= 256, "DMAX: a multiple of 32 up to 256");
    static_assert(BM % WARPS == 0, "BM rows split evenly over the warps");
    constexpr int R = BM / WARPS;        // rows per warp
    constexpr int C = DMAX / 32;         // output columns per lane
    constexpr int KS = DMAX + 1;         // padded K row: lane j reads K[j][d] without bank conflicts
    extern __shared__ float smem[];
    float* qs = smem;                    // [BM][DMAX], pre-scaled
    float* ks = qs + BM * DMAX;          // [32][KS]
    float* vs = ks + 32 * KS;            // [32][DMAX]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int z = blockIdx.y, h = z % H, b = z / H;
    const int row0 = blockIdx.x * BM;
    const AttnRows ar = attn_rows(b, h, z, H, Sq, Skv, D, Dv, bshd);

    for (int e = threadIdx.x; e < BM * DMAX; e += WARPS * 32) {
        const int r = e / DMAX, d = e % DMAX;
        qs[e] = (row0 + r < Sq && d < D) ? Num<T>::to_f(Q[ar.qz + (long long)(row0 + r) * ar.qs + d]) * scale : 0.0f;
    }
    float o[R][C], mrow[R], lrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        mrow[r] = ATTN_NEG_INF;
        lrow[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) o[r][c] = 0.0f;
    }
    // With a causal mask, key tiles past the CTA's last row are fully masked: skip them.
    const int kv_end = mask.causal ? min(Skv, row0 + BM) : Skv;
    for (int t0 = 0; t0 < kv_end; t0 += 32) {
        __syncthreads();  // the previous tile's readers are done
        // Coalesced loads: consecutive threads read consecutive addresses of K (along d, or along
        // the keys when K comes transposed) and of V; the padded K rows keep either store order
        // free of bank conflicts.
        for (int e = threadIdx.x; e < 32 * DMAX; e += WARPS * 32) {
            const int j = kt ? e % 32 : e / DMAX, d = kt ? e / 32 : e % DMAX, key = t0 + j;
            float kv = 0.0f;
            if (key < Skv && d < D) kv = Num<T>::to_f(kt ? K[ar.kz + (long long)d * Skv + key] : K[ar.kz + (long long)key * ar.ks + d]);
            ks[j * KS + d] = kv;
        }
        for (int e = threadIdx.x; e < 32 * DMAX; e += WARPS * 32) {
            const int j = e / DMAX, d = e % DMAX, key = t0 + j;
            vs[e] = (key < Skv && d < Dv) ? Num<T>::to_f(V[ar.vz + (long long)key * ar.vs + d]) : 0.0f;
        }
        __syncthreads();
        const int key = t0 + lane;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int lr = warp * R + r, i = row0 + lr;
            if (i >= Sq) break;  // warp-uniform
            const float* q = qs + lr * DMAX;
            float sc = 0.0f;
            for (int d = 0; d < D; ++d) sc += q[d] * ks[lane * KS + d];
            sc = key < Skv ? masked_score<T, MASK>(sc, mask, b, h, i, key) : ATTN_NEG_INF;
            float tmax = sc;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float mnew = fmaxf(mrow[r], tmax);
            if (mnew == ATTN_NEG_INF) continue;  // nothing to attend to yet (warp-uniform)
            const float p = sc == ATTN_NEG_INF ? 0.0f : expf(sc - mnew);
            const float alpha = mrow[r] == ATTN_NEG_INF ? 0.0f : expf(mrow[r] - mnew);
            float psum = p;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
            lrow[r] = lrow[r] * alpha + psum;
            mrow[r] = mnew;
#pragma unroll
            for (int c = 0; c < C; ++c) o[r][c] *= alpha;
            for (int jj = 0; jj < 32; ++jj) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int c = 0; c < C; ++c) o[r][c] += pj * vs[jj * DMAX + c * 32 + lane];
            }
        }
    }
    const float nan = ATTN_NAN;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = row0 + warp * R + r;
        if (i >= Sq) break;
        // nothing attended, or a NaN sum (a NaN or +inf score): the reference's probabilities are NaN,
        // 0 with nan_to_zero, as the cublas_softmax forms give them
        const bool empty = mrow[r] == ATTN_NEG_INF || lrow[r] != lrow[r];
        const float inv = empty ? 0.0f : 1.0f / lrow[r];
        T* yr = Y + ar.yz + (long long)i * ar.ys;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int d = c * 32 + lane;
            if (d < Dv) yr[d] = Num<T>::from_f(empty ? (nan_to_zero ? 0.0f : nan) : o[r][c] * inv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// flash_mma: the tensor-core flash attention for fp16 (FlashAttention-2 style forward).
// A CTA of 4 warps takes BM = 64 query rows of one (b, h); warp w owns rows 16w..16w+15. Q's
// fragments stay in registers; per key tile of BN keys, K and V are staged in shared memory
// (rows padded by 16 bytes: ldmatrix without bank conflicts), S = Q . K^T by mma.sync m16n8k16
// (fp32 accumulation), the online softmax runs on the accumulator fragments (a row's values live in
// the 4 lanes of a quad: two shuffles), and P (rounded to fp16) is reused as the A operand of
// O += P . V without going through shared memory. K is [Skv][D] (KT = 0) or K^T [D][Skv] (KT = 1,
// as the exports compute it; its B fragments come from ldmatrix.trans), or, with bshd = 1, Q, K and V
// as [B][S][H][D] (rows H * D apart: attn_rows). D = Dv = HD (64 or 128);
// Q, K and V tiles move in 16-byte chunks (D % 8 == 0), except K^T tiles when Skv % 8 != 0.
// Shared memory: BM * (HD + 8) halves for Q, then STAGES x (K: BN * (HD + 8) or HD * (BN + 8); V: BN * (HD + 8)).

__device__ __forceinline__ unsigned attn_smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void attn_ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void attn_ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void attn_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned attn_pack(float lo, float hi) {
    return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
}

// Copy a rows x cols fp16 tile (row stride ld in global, rows beyond nrows zero) into shared
// memory with row stride lds, in 16-byte chunks. cols % 8 == 0.
template <int NT>
__device__ __forceinline__ void attn_tile_load(half_t* dst, int lds, const half_t* src, long long ld, int rows, int cols,
                                               int nrows, int ncols) {
    const int chunks = cols / 8;
    for (int e = threadIdx.x; e < rows * chunks; e += NT) {
        const int r = e / chunks, c = (e % chunks) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < nrows && c < ncols) v = *reinterpret_cast<const uint4*>(src + (long long)r * ld + c);
        *reinterpret_cast<uint4*>(dst + r * lds + c) = v;
    }
}

// The same with 2-byte loads, for K^T rows whose length (Skv) is not a multiple of 8.
template <int NT>
__device__ __forceinline__ void attn_tile_load_scalar(half_t* dst, int lds, const half_t* src, long long ld, int rows,
                                                      int cols, int nrows, int ncols) {
    for (int e = threadIdx.x; e < rows * cols; e += NT) {
        const int r = e / cols, c = e % cols;
        dst[r * lds + c] = (r < nrows && c < ncols) ? src[(long long)r * ld + c] : (half_t)0;
    }
}

// 16-byte global -> shared copy that bypasses L1; valid == false writes 16 zero bytes (src-size 0).
__device__ __forceinline__ void attn_cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void attn_cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void attn_cp_wait1() { asm volatile("cp.async.wait_group 1;"); }

// attn_tile_load through cp.async (nothing waits here: commit, then wait before reading).
template <int NT>
__device__ __forceinline__ void attn_tile_load_async(half_t* dst, int lds, const half_t* src, long long ld, int rows,
                                                     int cols, int nrows, int ncols) {
    const int chunks = cols / 8;
    for (int e = threadIdx.x; e < rows * chunks; e += NT) {
        const int r = e / chunks, c = (e % chunks) * 8;
        const bool ok = r < nrows && c < ncols;
        attn_cp_async16(attn_smem_u32(dst + r * lds + c), ok ? src + (long long)r * ld + c : src, ok);
    }
}

// STAGES 1: each K / V tile is loaded, then consumed. STAGES 2: two K / V buffers; tile i+1 is in
// flight (cp.async) while tile i is consumed (K^T tiles of odd key counts are stored synchronously).
template <typename T, int HD, int BN, int MASK, int KT, int STAGES>
__global__ void __launch_bounds__(128) flash_mma(
    const half_t* __restrict__ Q, const half_t* __restrict__ K, const half_t* __restrict__ V, half_t* __restrict__ Y,
    int Sq, int Skv, int H, float scale, ATTN_MASK_ARGS, int nan_to_zero, int bshd)
{
    static_assert(sizeof(T) == 2, "flash_mma is the fp16 kernel (T = half_t)");
    static_assert(HD % 16 == 0 && HD >= 16 && HD <= 128, "head dim: a multiple of 16 up to 128");
    static_assert(BN % 16 == 0 && BN >= 16 && BN <= 128, "key tile: a multiple of 16 up to 128");
    static_assert(STAGES == 1 || STAGES == 2, "1 or 2 K / V buffers");
    constexpr int BM = 64, NT = 128;
    constexpr int LQ = HD + 8;                    // Q, V and (KT = 0) K rows, in halves
    constexpr int LKT = BN + 8;                   // K^T rows (KT = 1)
    constexpr int NB = BN / 8;                    // score n-blocks per warp
    constexpr int OB = HD / 8;                    // output n-blocks per warp
    const AttnMask mask = make_mask(mptr, msb, msh, msi, msj, mvalue, causal);
    extern __shared__ __align__(16) unsigned char attn_smem[];
    constexpr int KS_ELEMS = KT ? HD * LKT : BN * LQ, VS_ELEMS = BN * LQ;
    half_t* qs = reinterpret_cast<half_t*>(attn_smem);   // [BM][LQ]
    half_t* kv0 = qs + BM * LQ;                          // STAGES x (K [BN][LQ] or [HD][LKT], then V [BN][LQ])
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int z = blockIdx.y, h = z % H, b = z / H;
    const int row0 = blockIdx.x * BM;
    const AttnRows ar = attn_rows(b, h, z, H, Sq, Skv, HD, HD, bshd);

    attn_tile_load<NT>(qs, LQ, Q + ar.qz + (long long)row0 * ar.qs, ar.qs, BM, HD, Sq - row0, HD);
    __syncthreads();
    unsigned qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
        attn_ldsm_x4(attn_smem_u32(qs + (warp * 16 + (lane & 15)) * LQ + kk * 16 + (lane >> 4) * 8),
                     qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);

    float o[OB][4];
#pragma unroll
    for (int j = 0; j < OB; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {ATTN_NEG_INF, ATTN_NEG_INF}, lrow[2] = {0.0f, 0.0f};
    const int rows_of[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};

    const int kv_end = mask.causal ? min(Skv, row0 + BM) : Skv;
    // Load the K / V tile at key t0 into buffer buf (asynchronously with STAGES 2).
    auto load_tile = [&](int buf, int tk) {
        half_t* kb = kv0 + buf * (KS_ELEMS + VS_ELEMS);
        half_t* vb = kb + KS_ELEMS;
        if (KT && (Skv & 7) != 0) attn_tile_load_scalar<NT>(kb, LKT, K + ar.kz + tk, Skv, HD, BN, HD, Skv - tk);
        else if (STAGES == 2) {
            if (KT) attn_tile_load_async<NT>(kb, LKT, K + ar.kz + tk, Skv, HD, BN, HD, Skv - tk);
            else attn_tile_load_async<NT>(kb, LQ, K + ar.kz + (long long)tk * ar.ks, ar.ks, BN, HD, Skv - tk, HD);
        } else {
            if (KT) attn_tile_load<NT>(kb, LKT, K + ar.kz + tk, Skv, HD, BN, HD, Skv - tk);
            else attn_tile_load<NT>(kb, LQ, K + ar.kz + (long long)tk * ar.ks, ar.ks, BN, HD, Skv - tk, HD);
        }
        if (STAGES == 2) {
            attn_tile_load_async<NT>(vb, LQ, V + ar.vz + (long long)tk * ar.vs, ar.vs, BN, HD, Skv - tk, HD);
            attn_cp_commit();
        } else {
            attn_tile_load<NT>(vb, LQ, V + ar.vz + (long long)tk * ar.vs, ar.vs, BN, HD, Skv - tk, HD);
        }
    };
    if (STAGES == 2 && kv_end > 0) load_tile(0, 0);
    for (int it = 0, t0 = 0; t0 < kv_end; ++it, t0 += BN) {
        const int buf = STAGES == 2 ? (it & 1) : 0;
        if (STAGES == 2) {
            // Buffer buf ^ 1 was released by the barrier that ended the previous iteration.
            if (t0 + BN < kv_end) load_tile(buf ^ 1, t0 + BN);
            else attn_cp_commit();  // an empty group keeps "all but the newest" meaning this tile
            attn_cp_wait1();        // this thread's copies of tile it have landed
            __syncthreads();        // everyone's have
        } else {
            __syncthreads();  // every warp is done with the previous K / V tile
            load_tile(0, t0);
            __syncthreads();
        }
        const half_t* ks = kv0 + buf * (KS_ELEMS + VS_ELEMS);
        const half_t* vs = ks + KS_ELEMS;

        float s[NB][4];
#pragma unroll
        for (int j = 0; j < NB; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int j = 0; j < NB / 2; ++j) {
                unsigned b0, b1, b2, b3;
                if (KT)  // K^T [d][key]: rows are k (d), columns n (keys)
                    attn_ldsm_x4_t(attn_smem_u32(ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LKT + j * 16 + (lane >> 4) * 8),
                                   b0, b1, b2, b3);
                else     // K [key][d]: rows are n (keys), columns k (d)
                    attn_ldsm_x4(attn_smem_u32(ks + (j * 16 + (lane & 7) + (lane >> 4) * 8) * LQ + kk * 16 + ((lane >> 3) & 1) * 8),
                                 b0, b1, b2, b3);
                attn_mma(s[2 * j], qf[kk], b0, b1);
                attn_mma(s[2 * j + 1], qf[kk], b2, b3);
            }
        }
        // Scale, mask, and the online softmax on the fragments: s[j][e] is row rows_of[e >> 1],
        // key t0 + 8j + 2t + (e & 1).
        float mx[2] = {ATTN_NEG_INF, ATTN_NEG_INF};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = rows_of[e >> 1], key = t0 + 8 * j + 2 * t + (e & 1);
                float x = s[j][e] * scale;
                x = key >= Skv ? ATTN_NEG_INF : (i < Sq ? masked_score<half_t, MASK>(x, mask, b, h, i, key) : x);
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float alpha[2], muse[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mnew = fmaxf(mrow[r], mx[r]);
            muse[r] = mnew == ATTN_NEG_INF ? 0.0f : mnew;
            alpha[r] = mrow[r] == ATTN_NEG_INF ? 0.0f : __expf(mrow[r] - muse[r]);
            mrow[r] = mnew;
        }
        float ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = s[j][e];
                const float p = x == ATTN_NEG_INF ? 0.0f : __expf(x - muse[e >> 1]);  // ex2.approx: ample for fp16 P
                s[j][e] = p;
                ps[e >> 1] += p;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 1);
            ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 2);
            lrow[r] = lrow[r] * alpha[r] + ps[r];
        }
#pragma unroll
        for (int j = 0; j < OB; ++j) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
        }
        // O += P . V: the score accumulators of n-blocks 2kk, 2kk+1 are the A fragment of k-step kk.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const unsigned a[4] = {attn_pack(s[2 * kk][0], s[2 * kk][1]), attn_pack(s[2 * kk][2], s[2 * kk][3]),
                                   attn_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), attn_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int jd = 0; jd < OB / 2; ++jd) {
                unsigned b0, b1, b2, b3;  // V [key][dv]: rows are k (keys), columns n (dv)
                attn_ldsm_x4_t(attn_smem_u32(vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LQ + jd * 16 + (lane >> 4) * 8),
                               b0, b1, b2, b3);
                attn_mma(o[2 * jd], a, b0, b1);
                attn_mma(o[2 * jd + 1], a, b2, b3);
            }
        }
        if (STAGES == 2) __syncthreads();  // every warp is done with buffer buf before it is refilled
    }
    const float nan = ATTN_NAN;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = rows_of[r];
        if (i >= Sq) continue;
        const bool empty = lrow[r] == 0.0f || lrow[r] != lrow[r];  // as flash_attn: a NaN sum too
        const float inv = empty ? 0.0f : 1.0f / lrow[r];
        half_t* yr = Y + ar.yz + (long long)i * ar.ys;
#pragma unroll
        for (int j = 0; j < OB; ++j) {
            const float y0 = empty ? (nan_to_zero ? 0.0f : nan) : o[j][2 * r] * inv;
            const float y1 = empty ? (nan_to_zero ? 0.0f : nan) : o[j][2 * r + 1] * inv;
            *reinterpret_cast<unsigned*>(yr + 8 * j + 2 * t) = attn_pack(y0, y1);
        }
    }
}
