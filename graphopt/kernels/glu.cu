// The gate of a gated MLP (SwiGLU / GeGLU) after its two GEMMs: Y = act(G + bg) * (Y + bu), in place
// on Y (which holds the up projection X @ Wu), G the gate projection X @ Wg, both [rows][N]; the
// biases (N values each) are optional (null). VEC elements per load (N % VEC == 0 and 16-byte
// aligned tensors when VEC > 1). Arithmetic in fp32.

template <typename T, int VEC>
struct __align__(sizeof(T) * VEC) GluVec {
    T v[VEC];
};

template <typename T, int VEC>
__global__ void __launch_bounds__(256) glu_gate(
    const T* __restrict__ G, T* __restrict__ Y, const T* __restrict__ bg, const T* __restrict__ bu,
    long long total, int N, int act, float alpha, float beta, float lo, float hi)
{
    typedef GluVec<T, VEC> V;
    ActParams ap; ap.kind = act; ap.alpha = alpha; ap.beta = beta; ap.lo = lo; ap.hi = hi;
    const long long nv = total / VEC;
    const V* gv = reinterpret_cast<const V*>(G);
    V* yv = reinterpret_cast<V*>(Y);
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < nv; j += (long long)gridDim.x * blockDim.x) {
        const int col = (int)((j * VEC) % N);
        const V g = gv[j];
        const V u = yv[j];
        float a[VEC], b[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            a[k] = Num<T>::to_f(g.v[k]);
            b[k] = Num<T>::to_f(u.v[k]);
            if (bg) a[k] += Num<T>::to_f(bg[col + k]);
            if (bu) b[k] += Num<T>::to_f(bu[col + k]);
        }
        apply_act_n<VEC>(a, ap);  // one dispatch for the vector, not one a value
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = Num<T>::from_f(a[k] * b[k]);
        yv[j] = o;
    }
}
