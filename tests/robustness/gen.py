"""Hypothesis strategy for random valid ONNX float32 models (shared by the graph fuzzer and corpus replay).

The graph is grown from *motifs* that the shipped rules fuse (Conv[+bias][+Add c][+act], Conv+residual,
MatMul[+bias][+act], Gemm[+act], x*Sigmoid(x)) and from plain ops (broadcast Add/Mul, Reshape,
Transpose, activations). Each motif's source is the newest tensor or, at random, an older one, so
intermediates of earlier motifs get second consumers; random tensors also become graph outputs, and
the constants added to Conv/MatMul outputs are per-channel only some of the time. Shapes are tracked
while drawing, so every node is well-formed by construction; onnx.checker (full_check) runs on the
result. Everything comes from hypothesis draws (weights from a drawn seed), so it shrinks and replays.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper as h, numpy_helper

ACTS = ["Relu", "Sigmoid", "Clip", "HardSwish", "LeakyRelu", "SiLU", "HardSigmoidMul", "Gelu"]
MOTIFS = ["conv", "conv", "conv_residual", "matmul", "matmul", "gemm", "elt", "act", "reshape", "transpose", "residual"]


@st.composite
def models(draw, max_steps: int = 8) -> onnx.ModelProto:
    """A random model over input ``x`` (rank 4 or rank 2/3), opset 13, 17 or 20."""
    opset = draw(st.sampled_from([13, 17, 20]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if draw(st.integers(0, 3)):
        x_shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(2, 5)), draw(st.integers(2, 5)))
    else:
        x_shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(2, 3))))
    shapes: dict[str, tuple[int, ...]] = {"x": x_shape}
    nodes, inits, outputs = [], [], []
    counter = [0]

    def fresh(p: str) -> str:
        counter[0] += 1
        return f"{p}{counter[0]}"

    def const(value, dtype=np.float32) -> str:
        name = fresh("k")
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op: str, ins: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = fresh("t")
        nodes.append(h.make_node(op, ins, [out], name=fresh(op.lower() + "_"), **attrs))
        shapes[out] = tuple(shape)
        return out

    def pick_source() -> str:
        names = list(shapes)
        if len(names) == 1 or draw(st.integers(0, 2)):
            return names[-1]
        return names[draw(st.integers(0, len(names) - 1))]

    def commuted(a: str, b: str) -> list[str]:
        return [a, b] if draw(st.booleans()) else [b, a]

    def activation(src: str) -> str:
        s = shapes[src]
        op = draw(st.sampled_from([a for a in ACTS if not (a == "Gelu" and opset < 20 or a == "HardSwish" and opset < 14)]))
        if op == "Clip":
            lo, hi = draw(st.sampled_from([(0.0, 6.0), (-1.0, 1.0), (None, 0.5)]))
            ins = [src, const(lo) if lo is not None else "", const(hi)]
            return node("Clip", ins, s)
        if op == "LeakyRelu":
            return node(op, [src], s, alpha=float(draw(st.sampled_from([0.01, 0.2]))))
        if op == "SiLU":
            return node("Mul", commuted(src, node("Sigmoid", [src], s)), s)
        if op == "HardSigmoidMul":
            return node("Mul", commuted(src, node("HardSigmoid", [src], s, alpha=1 / 6, beta=0.5)), s)
        return node(op, [src], s)

    def broadcast_const(s: tuple[int, ...], kind: str) -> str:
        """A constant for Add/Mul with s: per-channel ([C,1,1] / [1,C,1,1]), per-feature ([N]), a
        scalar, a plain [C] on a rank-4 tensor (NOT per-channel), or any random broadcast."""
        if kind == "per_channel" and len(s) == 4:
            shape = draw(st.sampled_from([(s[1], 1, 1), (1, s[1], 1, 1)]))
        elif kind == "per_feature":
            shape = draw(st.sampled_from([(s[-1],), (1, s[-1])]))[: len(s)]
        elif kind == "scalar":
            shape = draw(st.sampled_from([(), (1,)]))
        elif kind == "last_axis":
            shape = (s[-1],)
        else:
            r = draw(st.integers(0, len(s)))
            shape = tuple(d if draw(st.booleans()) else 1 for d in s[len(s) - r:])
        return const(rng.standard_normal(shape))

    for _ in range(draw(st.integers(1, max_steps))):
        src = pick_source()
        s = shapes[src]
        motif = draw(st.sampled_from(MOTIFS))
        if motif in ("conv", "conv_residual") and len(s) == 4:
            cout = s[1] if motif == "conv_residual" else draw(st.integers(1, 4))
            k = draw(st.sampled_from([1, 3]))
            group = s[1] if (s[1] == cout and draw(st.booleans())) else 1
            ins = [src, const(rng.standard_normal((cout, s[1] // group, k, k)) * 0.5)]
            if draw(st.booleans()):
                ins.append(const(rng.standard_normal(cout)))
            y = node("Conv", ins, (s[0], cout, s[2], s[3]), pads=[k // 2] * 4, group=group)
            if motif == "conv_residual":
                y = node("Add", commuted(y, src), shapes[y])
            elif draw(st.booleans()):
                kind = draw(st.sampled_from(["per_channel", "per_channel", "scalar", "last_axis", "random"]))
                y = node(draw(st.sampled_from(["Add", "Add", "Mul"])), commuted(y, broadcast_const(shapes[y], kind)), shapes[y])
            if draw(st.integers(0, 3)):
                y = activation(y)
        elif motif == "matmul":
            m = draw(st.integers(1, 5))
            y = node("MatMul", [src, const(rng.standard_normal((s[-1], m)) * 0.5)], (*s[:-1], m))
            if draw(st.booleans()):
                kind = draw(st.sampled_from(["per_feature", "per_feature", "scalar", "random"]))
                y = node("Add", commuted(y, broadcast_const(shapes[y], kind)), shapes[y])
            if draw(st.booleans()):
                y = activation(y)
        elif motif == "gemm" and len(s) == 2:
            m, tb = draw(st.integers(1, 5)), draw(st.booleans())
            w = rng.standard_normal((m, s[1]) if tb else (s[1], m)) * 0.5
            ins = [src, const(w)]
            if draw(st.integers(0, 3)):
                ins.append(const(rng.standard_normal(draw(st.sampled_from([(), (m,), (1, m), (s[0], m)])))))
            y = node("Gemm", ins, (s[0], m), transB=int(tb), alpha=float(draw(st.sampled_from([1.0, 0.5]))),
                     beta=float(draw(st.sampled_from([1.0, 2.0]))))
            if draw(st.booleans()):
                y = activation(y)
        elif motif == "act":
            activation(src)
        elif motif == "reshape":
            total = int(np.prod(s))
            new = draw(st.sampled_from([(s[0], total // s[0]), (total,), x_shape]))
            if int(np.prod(new)) != total:
                new = (s[0], total // s[0])
            spec = list(new)
            if draw(st.booleans()):
                spec[draw(st.integers(0, len(spec) - 1))] = -1
            node("Reshape", [src, const(spec, np.int64)], new)
        elif motif == "transpose":
            perm = list(draw(st.permutations(range(len(s)))))
            node("Transpose", [src], tuple(s[p] for p in perm), perm=perm)
        elif motif == "residual":
            same = [t for t in shapes if shapes[t] == s]
            node(draw(st.sampled_from(["Add", "Mul"])), commuted(src, same[draw(st.integers(0, len(same) - 1))]), s)
        else:  # "elt", and the shape-dependent motifs on a tensor of the wrong rank
            kind = draw(st.sampled_from(["per_channel", "per_feature", "scalar", "last_axis", "random"]))
            node(draw(st.sampled_from(["Add", "Mul"])), commuted(src, broadcast_const(s, kind)), s)
    # Random intermediates become graph outputs too (so some fusions must be refused).
    for t in list(shapes)[1:-1]:
        if draw(st.integers(0, 5)) == 0:
            outputs.append(t)
    outputs.append(list(shapes)[-1])
    if draw(st.integers(0, 19)) == 0:
        outputs.append("x")
    outputs = list(dict.fromkeys(outputs))
    graph = h.make_graph(
        nodes, "fuzz",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [h.make_tensor_value_info(o, TensorProto.FLOAT, list(shapes[o])) for o in outputs],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model
