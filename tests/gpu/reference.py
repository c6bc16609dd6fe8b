"""Float64 NumPy references for the GPU kernel tests (until graphopt.ops lands, then they defer).

Independent of the kernels: the convolution is a plain loop over the filter window on a padded
input, the GEMM is numpy.matmul; both in float64.
"""

from __future__ import annotations

import math

import numpy as np


def activation(x: np.ndarray, name: str, alpha=None, beta=None, lo=None, hi=None) -> np.ndarray:
    if name == "none":
        return x
    if name == "Relu":
        return np.maximum(x, 0)
    if name == "Clip":
        return np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return np.where(x >= 0, x, a * x)
    if name == "Sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "SiLU":
        return x / (1 + np.exp(-x))
    if name == "HardSwish":
        return x * np.clip(x / 6 + 0.5, 0, 1)
    if name == "HardSigmoidMul":
        a = 0.2 if alpha is None else alpha
        b = 0.5 if beta is None else beta
        return x * np.clip(a * x + b, 0, 1)
    if name == "Gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    if name == "GeluTanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise ValueError(name)


def _act(x, attrs):
    return activation(x, attrs.get("activation", "none"), attrs.get("act_alpha"), attrs.get("act_beta"),
                      attrs.get("clip_min"), attrs.get("clip_max"))


def conv_pads(x_shape, w_shape, attrs):
    nd = len(x_shape) - 2
    ks = list(w_shape[2:])
    st = list(attrs.get("strides", [1] * nd))
    dl = list(attrs.get("dilations", [1] * nd))
    ap = attrs.get("auto_pad", "NOTSET")
    sp = list(x_shape[2:])
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-sp[i] // st[i]) for i in range(nd)]
        tot = [max(0, (out[i] - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - sp[i]) for i in range(nd)]
        b = [t // 2 if ap == "SAME_UPPER" else t - t // 2 for t in tot]
        return b, [t - bb for t, bb in zip(tot, b)], st, dl
    if ap == "VALID":
        return [0] * nd, [0] * nd, st, dl
    pads = list(attrs.get("pads", [0] * 2 * nd))
    return pads[:nd], pads[nd:], st, dl


def cbr(x, w, b, r, attrs) -> np.ndarray:
    """y = act(Conv(x, w, b) + r) in float64; 1-D or 2-D, any groups."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    one_d = x.ndim == 3
    if one_d:
        x, w = x[:, :, None, :], w[:, :, None, :]
    begin, end, st, dl = conv_pads(x.shape if not one_d else (x.shape[0], x.shape[1], x.shape[3]),
                                   w.shape if not one_d else (w.shape[0], w.shape[1], w.shape[3]), attrs)
    if one_d:
        begin, end, st, dl = [0] + begin, [0] + end, [1] + st, [1] + dl
    G = int(attrs.get("group", 1))
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    xp = np.zeros((N, C, H + begin[0] + end[0] + 1 * 0, W + begin[1] + end[1]))
    xp[:, :, begin[0]:begin[0] + H, begin[1]:begin[1] + W] = x
    OH = (H + begin[0] + end[0] - dl[0] * (KH - 1) - 1) // st[0] + 1
    OW = (W + begin[1] + end[1] - dl[1] * (KW - 1) - 1) // st[1] + 1
    y = np.zeros((N, M, OH, OW))
    Mg = M // G
    for g in range(G):
        xs = xp[:, g * Cg:(g + 1) * Cg]
        wg = w[g * Mg:(g + 1) * Mg]
        for i in range(KH):
            for j in range(KW):
                h0, w0 = i * dl[0], j * dl[1]
                patch = xs[:, :, h0:h0 + st[0] * (OH - 1) + 1:st[0], w0:w0 + st[1] * (OW - 1) + 1:st[1]]
                y[:, g * Mg:(g + 1) * Mg] += np.einsum("nchw,mc->nmhw", patch, wg[:, :, i, j])
    if one_d:
        y = y[:, :, 0, :]
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape((1, M) + (1,) * (y.ndim - 2))
    if r is not None:
        y = y + np.asarray(r, np.float64)
    return _act(y, attrs)


def gemm_act(a, b, c, attrs) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if attrs.get("mode", "matmul") == "gemm":
        if attrs.get("transA", 0):
            a = a.T
        if attrs.get("transB", 0):
            b = b.T
        y = attrs.get("alpha", 1.0) * (a @ b)
        if c is not None:
            y = y + attrs.get("beta", 1.0) * np.asarray(c, np.float64)
    else:
        y = np.matmul(a, b)
        if c is not None:
            y = y + np.asarray(c, np.float64)
    return _act(y, attrs)


def reference(op: str, inputs, attrs) -> np.ndarray:
    """graphopt.ops' reference when it exists, else the one above (float64 result)."""
    try:  # pragma: no cover - depends on the ops engineer's module
        from graphopt.ops import get_schema

        out = get_schema(op).reference([None if v is None else np.asarray(v, np.float64) for v in inputs], attrs)[0]
        return np.asarray(out, np.float64)
    except Exception:
        pass
    if op == "CBR":
        return cbr(*(list(inputs) + [None, None])[:4], attrs)
    return gemm_act(*(list(inputs) + [None])[:3], attrs)
