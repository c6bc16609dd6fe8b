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

import onnx

from graphopt.errors import GraphoptError, UnsupportedModel, UsageError

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
    m = copy.deepcopy(model)
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
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError or a shape-inference error type
        first = str(e).splitlines()[0][:240] if str(e) else type(e).__name__
        raise UnsupportedModel(f"{source}: the fp16 conversion (onnxconverter-common) gives an invalid model ({first}); "
                               "keep the op it names at fp32 with --keep-fp32 OP, or run the fp32 model with "
                               "`graphopt run --dtype fp16`") from None
    return out


def fp16_tolerances(rtol: float | None, atol: float | None) -> tuple[float, float]:
    """--verify tolerances for an fp16 model: the user's, else rtol 1e-2 and atol 1e-2 (fp16 keeps
    ~3 significant digits; accumulated over a network, 1e-2 is the documented bound)."""
    return (1e-2 if rtol is None else rtol), (1e-2 if atol is None else atol)
