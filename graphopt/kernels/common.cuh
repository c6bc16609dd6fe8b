// graphopt kernel prelude: storage types, fp16 conversion, activations, epilogue helpers.
// It includes no headers (NVRTC needs none for it), so the same text compiles in CI without the CUDA
// toolkit headers. Python prepends it to every kernel source (graphopt/kernels/source.py).
// Everything configurable arrives as a template integer or a kernel argument: no model text ever
// reaches this source.
#pragma once

typedef unsigned short half_t;   // fp16 storage; arithmetic is always fp32

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

template <typename T> struct Num;
template <> struct Num<float> {
    static __device__ __forceinline__ float load(const float* p) { return *p; }
    static __device__ __forceinline__ float to_f(float v) { return v; }
    static __device__ __forceinline__ float from_f(float v) { return v; }
};
template <> struct Num<half_t> {
    static __device__ __forceinline__ float load(const half_t* p) { return h2f(*p); }
    static __device__ __forceinline__ float to_f(half_t v) { return h2f(v); }
    static __device__ __forceinline__ half_t from_f(float v) { return f2h(v); }
};

// Activation codes; graphopt/kernels/source.py ACT_CODES must list the same numbers.
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_CLIP 2
#define ACT_LEAKYRELU 3
#define ACT_SIGMOID 4
#define ACT_SILU 5
#define ACT_HARDSWISH 6
#define ACT_HARDSIGMOIDMUL 7
#define ACT_GELU 8
#define ACT_GELUTANH 9
#define ACT_HARDSIGMOID 10
#define ACT_QUICKGELU 11

struct ActParams {
    int kind;
    float alpha;   // LeakyRelu slope, HardSigmoid alpha
    float beta;    // HardSigmoid beta
    float lo, hi;  // Clip bounds (+-inf when absent)
};

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

// 2^x by the hardware's ex2 alone (exp2f adds a rescaling for subnormal results around it): a result
// under 2^-126 becomes 0 (a softmax probability that far under its row's largest, an erfc tail).
// ex2(-inf) = 0, ex2(NaN) = NaN.
__device__ __forceinline__ float ex2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Everything inlined: for loops that apply the activation once per element in a rolled loop (the
// staged epilogue), where code size is no concern and the call would cost more than erff itself.
__device__ __forceinline__ float apply_act_inline(float x, const ActParams& a) {
    switch (a.kind) {
        case ACT_RELU: return fmaxf(x, 0.0f);
        case ACT_CLIP: return fminf(fmaxf(x, a.lo), a.hi);
        case ACT_LEAKYRELU: return x >= 0.0f ? x : a.alpha * x;
        case ACT_SIGMOID: return sigmoid_f(x);
        case ACT_SILU: return x * sigmoid_f(x);
        case ACT_HARDSWISH: return x * fminf(fmaxf(x * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
        case ACT_HARDSIGMOIDMUL: return x * fminf(fmaxf(a.alpha * x + a.beta, 0.0f), 1.0f);
        case ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        case ACT_GELUTANH: {
            float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            return 0.5f * x * (1.0f + tanhf(u));
        }
        case ACT_HARDSIGMOID: return fminf(fmaxf(a.alpha * x + a.beta, 0.0f), 1.0f);
        case ACT_QUICKGELU: return x * sigmoid_f(1.70200002193450928f * x);  // 1.702 as float32 (CLIP)
        default: return x;
    }
}

// n / d for n < 2^31, with d's (mul, shr) from graphopt.kernels.divisor.fast_divisor: a multiply-high, an
// add and a shift, where a 32-bit division by a run-time d is ~20 instructions (the module says why).
__device__ __forceinline__ unsigned fast_div(unsigned n, unsigned mul, int shr) {
    return (__umulhi(n, mul) + n) >> shr;
}

// The activation of a thread's N values with one dispatch: apply_act_inline per value repeats its switch
// (a compare chain and its branches) for each, since the kind is a launch argument, not a constant; here
// each common kind's case holds the loop (the kind fixed inside, so the switch folds) and the others share
// the per-value form (bench/NOTES_kernels.md, sixteenth session: the depthwise kernel's issue budget).
template <int KIND, int N>
__device__ __forceinline__ void apply_act_all(float (&x)[N], ActParams a) {
    a.kind = KIND;  // a constant here: apply_act_inline's switch folds to one case
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = apply_act_inline(x[i], a);
}

template <int N>
__device__ __forceinline__ void apply_act_n(float (&x)[N], const ActParams& a) {
    switch (a.kind) {
        case ACT_NONE: return;
        case ACT_RELU: apply_act_all<ACT_RELU>(x, a); return;
        case ACT_CLIP: apply_act_all<ACT_CLIP>(x, a); return;
        case ACT_SILU: apply_act_all<ACT_SILU>(x, a); return;
        case ACT_HARDSWISH: apply_act_all<ACT_HARDSWISH>(x, a); return;
        default:
#pragma unroll
            for (int i = 0; i < N; ++i) x[i] = apply_act_inline(x[i], a);
    }
}

// The rarer activations live in one out-of-line function: a GEMM epilogue applies the activation
// to every accumulator of a fully unrolled tile, and inlining the whole switch (erff, tanhf, ...)
// into each of them multiplied code size and compile time. The kind is uniform per launch.
// It is apply_act_inline's switch called out of line: one body, so the two forms cannot disagree.
__device__ __noinline__ float apply_act_slow(float x, int kind, float alpha, float beta, float lo, float hi) {
    ActParams a; a.kind = kind; a.alpha = alpha; a.beta = beta; a.lo = lo; a.hi = hi;
    return apply_act_inline(x, a);
}

// The cheap piecewise-linear activations are inlined (a first measurement showed Clip / ReLU6
// through the out-of-line call costing up to ~37% on memory-bound 1x1 layers); only the
// transcendental ones (Sigmoid, SiLU, Gelu, GeluTanh) pay for the call.
__device__ __forceinline__ float apply_act(float x, const ActParams& a) {
    if (a.kind == ACT_NONE) return x;
    if (a.kind == ACT_RELU) return fmaxf(x, 0.0f);
    if (a.kind == ACT_CLIP) return fminf(fmaxf(x, a.lo), a.hi);
    if (a.kind == ACT_LEAKYRELU) return x >= 0.0f ? x : a.alpha * x;
    if (a.kind == ACT_HARDSWISH) return x * fminf(fmaxf(x * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
    return apply_act_slow(x, a.kind, a.alpha, a.beta, a.lo, a.hi);
}

// Loads that bypass L1 (data written by other CTAs of the same launch, split-K partials).
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("{ ld.global.cg.f32 %0, [%1]; }" : "=f"(v) : "l"(p));
    return v;
}
