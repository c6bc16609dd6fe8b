"""``graphopt optimize --precision fp16``: the model converted to fp16 before the fusions, so the rules
fire on the fp16 graph and the lowering selection profiles at fp16.

The conversion is onnxconverter-common's ``convert_float_to_float16`` (the converter onnxruntime's
own transformer tools use): float initializers and tensors become fp16, values past fp16's range are
clamped to +-1e4 (so a -3.4e38 attention mask stays finite), and the ops in its default block list
(plus ``--keep-fp32``) stay fp32 behind Cast nodes. The graph inputs and outputs keep their dtypes
unless ``io_fp16``. The result must pass ``onnx.checker`` with full shape inference; when the
converter produces an invalid model, the error says so and names the way out.
"""

from __future__ import annotations

import copy
import warnings
from typing import Sequence

import numpy as np
import onnx

from graphopt.errors import GraphoptError, UnsupportedModel, UsageError
from graphopt.ir import from_model, to_model
from graphopt.passes import eliminate_noop_cast

PRECISIONS = ("fp32", "fp16")


def parse_keep_fp32(text: str | Sequence[str] | None) -> list[str]:
    """``"Softmax,LayerNormalization"`` -> the op names; each must be an ONNX op."""
    if not text:
        return []
    items = text.split(",") if isinstance(text, str) else [x for t in text for x in t.split(",")]
    ops = [x.strip() for x in items if x.strip()]
    for op in ops:
        if not onnx.defs.has(op):
            raise UsageError(f"--keep-fp32 {op}: not an ONNX op type (expected names such as Softmax,ReduceMean)")
    return sorted(set(ops))


def convert_fp16(model: onnx.ModelProto, *, io_fp16: bool = False, keep_fp32: Sequence[str] = (),
                 source: str = "<model>") -> onnx.ModelProto:
    """A new fp16 ModelProto (``model`` is not modified)."""
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise GraphoptError("--precision fp16 needs onnxconverter-common: pip install onnxconverter-common") from None
    m = _without_noop_casts(model)
    # stale fp32 value_info entries would contradict the converted types; shape inference redoes them
    del m.graph.value_info[:]
    block = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(keep_fp32))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the model is already fp16"-style notes; the report says what happened
            out = float16.convert_float_to_float16(m, keep_io_types=not io_fp16, op_block_list=block)
    except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions
        raise UnsupportedModel(f"{source}: the fp16 conversion failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                               "run the fp32 model in fp16 with `graphopt run --dtype fp16` instead") from None
    _fix_cast_targets(out)
    if not io_fp16:
        _read_outputs_before_their_cast(out)
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError or a shape-inference error type
        first = str(e).splitlines()[0][:240] if str(e) else type(e).__name__
        raise UnsupportedModel(f"{source}: the fp16 conversion (onnxconverter-common) gives an invalid model ({first}); "
                               "keep the op it names at fp32 with --keep-fp32 OP, or run the fp32 model with "
                               "`graphopt run --dtype fp16`") from None
    return out


def _lost(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return not dim.HasField("dim_value") and (not dim.dim_param or dim.dim_param.startswith("unk__"))


def restore_dims(converted, reference) -> int:
    """Give the converted graph's tensors the dims that the fp32 graph (``reference``, same tensor names) knows
    where the converted model's shape inference lost them. The conversion drops the exporter's value_info (its
    fp32 types would contradict the converted ones), and ONNX inference alone cannot name a Reshape's -1 dim:
    the dynamo LLaMA's batch dim came back as a fresh ``unk__`` after each head split, where the exporter had
    written ``batch``, and the rules that prove two dims equal (grouped K/V) then failed. Types stay the
    converted graph's; only dims move. Returns the number of tensors refined."""
    changed = 0
    for name in converted.value_info_names():
        vi, ref = converted.value_info_proto(name), reference.value_info_proto(name)
        if vi is None or ref is None or not vi.type.HasField("tensor_type") or not ref.type.HasField("tensor_type"):
            continue
        dims, ref_dims = vi.type.tensor_type.shape.dim, ref.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or len(dims) != len(ref_dims):
            continue
        fix = [i for i, (d, r) in enumerate(zip(dims, ref_dims)) if _lost(d) and not _lost(r)]
        if not fix:
            continue
        new = onnx.ValueInfoProto()
        new.CopyFrom(vi)
        for i in fix:
            new.type.tensor_type.shape.dim[i].CopyFrom(ref_dims[i])
        changed += converted.refine_value_info(new)
    return changed


MASK_LOWEST = -1e30  # a float32 value at most this is a mask's "minus infinity" (rewrite/causal.py says why)
CLAMP = -1e4  # what onnxconverter-common's conversion writes for it (its max_finite_val)
CLAMP_CHECK_MAX = 1 << 24  # constants of more elements are weights, not masks: not read


def clamped_fills(converted, reference) -> dict:
    """{constant: positions} of the converted graph's float16 constants where the fp32 graph (``reference``, same
    tensor names) held a mask's minus infinity (<= -1e30) and the conversion wrote -1e4. The fp32 model masked
    those scores exactly; the fp16 one adds -1e4, which masks them unless a row's scores spread over ~9,900. The
    causal-mask proof (``rewrite/causal.py``) reads these positions as the exact masks the source model meant."""
    found = {}
    constants = converted.initializer_names() + [n.outputs[0] for n in converted.nodes_by_op("Constant")]
    for name in constants:
        info, ref_info = converted.constant_info(name), reference.constant_info(name)
        if info is None or ref_info is None or info[0] != np.float16 or ref_info[0] != np.float32:
            continue
        if int(np.prod(info[1], dtype=np.int64)) > CLAMP_CHECK_MAX or info[1] != ref_info[1]:
            continue
        ref = reference.constant_value(name)
        lowest = ref <= MASK_LOWEST
        if lowest.any() and np.all(converted.constant_value(name)[lowest] == np.float16(CLAMP)):
            found[name] = lowest
    return found


def fp16_tolerances(rtol: float | None, atol: float | None) -> tuple[float, float]:
    """--verify tolerances for an fp16 model: the user's, else rtol 1e-2 and atol 1e-2 (fp16 keeps
    ~3 significant digits; accumulated over a network, 1e-2 is the documented bound)."""
    return (1e-2 if rtol is None else rtol), (1e-2 if atol is None else atol)


def _fix_cast_targets(model: onnx.ModelProto) -> int:
    """Make the model's own Casts to float32 cast to float16 where the converter declared their output
    float16 (it retypes tensors but leaves a Cast's ``to``: a TorchScript export's no-op
    ``Cast(to=FLOAT)`` or an int -> float Cast, such as GPT-2's position embedding or LLaMA's rotary
    positions, then contradicts every fp16 reader). The converter's own Casts around blocked ops are
    declared consistently and stay. Returns the number of Casts changed."""
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        to = next((a for a in node.attribute if a.name == "to"), None)
        if to is not None and to.i == onnx.TensorProto.FLOAT and declared.get(node.output[0]) == onnx.TensorProto.FLOAT16:
            to.i = onnx.TensorProto.FLOAT16
            changed += 1
    return changed


def _without_noop_casts(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without Casts to the type a tensor already has: the converter drops a no-op Cast that
    reads a graph input without putting its own input Cast in its place (CLIP's pixel_values then
    reaches an fp16 Conv as fp32), and keeps a no-op Cast's ``to``."""
    m = copy.deepcopy(model)
    try:
        typed = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 - best effort: convert the model as it is
        return m
    g = from_model(typed)
    return to_model(g) if eliminate_noop_cast(g) else m


def _read_outputs_before_their_cast(model: onnx.ModelProto) -> int:
    """With the graph outputs kept fp32, the converter casts each one back to fp32 at the end, but a
    node inside the graph that reads that output too (BERT's pooler reads last_hidden_state) then gets
    fp32 where it was converted to fp16: it reads the fp16 tensor before the Cast instead."""
    outputs = {o.name for o in model.graph.output}
    producer = {o: n for n in model.graph.node for o in n.output}
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    changed = 0
    for node in model.graph.node:
        for i, t in enumerate(node.input):
            cast = producer.get(t)
            if t not in outputs or cast is None or cast is node or cast.op_type != "Cast":
                continue
            src = cast.input[0]
            if declared.get(src) == onnx.TensorProto.FLOAT16 and node.op_type != "Cast":
                node.input[i] = src
                changed += 1
    return changed
