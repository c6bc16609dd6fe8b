"""onnx.checker on the optimized model, and whom to blame when it fails: the input (exit 4), a user
rule (exit 10, naming the rule and its file) or graphopt itself (an internal error)."""

from __future__ import annotations

import os
from typing import Sequence

import onnx

from graphopt.errors import GraphoptError, InvalidModel, RuleError
from graphopt.ir.large import WEIGHTLESS_ABOVE, check_weightless, small_bytes


def _checker_error(model: onnx.ModelProto, full: bool, serialized: bytes | None = None) -> str | None:
    """The first line of onnx.checker's complaint about ``model``, or None when it passes.
    ``serialized``: ``small_bytes(model)`` when the caller has it (the checker is handed those bytes)."""
    try:
        data = serialized if serialized is not None else small_bytes(model, WEIGHTLESS_ABOVE)
        if data is None:
            check_weightless(model, full)  # protobuf cannot serialize it whole: checked without the weights
        else:
            onnx.checker.check_model(data, full_check=full)
    except Exception as e:  # ValidationError, and shape inference / decoding errors raised by the checker
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return None


def _blame_user_rule(model: onnx.ModelProto, error: str, rules: Sequence[str | os.PathLike]) -> RuleError | None:
    """When the optimized model fails the checker and a node a user rule built is to blame, the
    RuleError naming that rule and its file (exit 10); None when no user rule built a node."""
    if not rules:
        return None
    from graphopt.rewrite import load_rules
    from graphopt.rewrite._engine import PROVENANCE_PREFIX

    user = {r.name: r for r in load_rules(shipped=False, paths=[str(p) for p in rules]).rules}
    made: list[tuple[str, str]] = []  # (node name, rule name)
    for node in model.graph.node:
        doc = node.doc_string or ""
        if doc.startswith(PROVENANCE_PREFIX):
            rule = doc[len(PROVENANCE_PREFIX):].split(" from=", 1)[0]
            if rule in user:
                made.append((node.name, rule))
    if not made:
        return None
    culprits = [r for n, r in made if n and n in error] or sorted({r for _, r in made})
    if len(culprits) == 1 or len(set(culprits)) == 1:
        r = user[culprits[0]]
        return RuleError(f"{r.file}:{r.line}: rule {r.name!r} builds a node that onnx.checker refuses: {error}; "
                         "fix the rule's 'replace' (or leave the rule out)")
    names = ", ".join(f"{user[c].name!r} ({user[c].file}:{user[c].line})" for c in sorted(set(culprits)))
    return RuleError(f"the optimized model fails onnx.checker after user rules {names} fired: {error}; fix their 'replace'")


_TYPE_ERRORS = ("has unsupported type", "not in allowed types", "TypeInferenceError", "has inconsistent type")


def _is_type_error(error: str) -> bool:
    """A type-constraint violation (a bfloat16 Conv at opset 17; a LayerNormalization reading float X
    with a float16 Scale, as torch's export of a ``.half()`` GPT-2 writes): onnxruntime refuses such a
    model too."""
    # a sparse initializer feeding Add fails onnx's type inference but runs under onnxruntime
    return any(k in error for k in _TYPE_ERRORS) and "sparse_tensor(" not in error


def check_output_model(model: onnx.ModelProto, full: bool = True, original: onnx.ModelProto | None = None,
                       source: str = "<model>", rules: Sequence[str | os.PathLike] = (),
                       serialized: bytes | None = None) -> str | None:
    """onnx.checker on the result. ``full`` adds strict shape inference through the function bodies
    (what --verify and the tests use; about 0.1 s on a 20k-node model).

    A failure is graphopt's bug only if the input passes the same check: when ``original`` fails it
    too, the input is refused as invalid (exit 4) -- unless only the full check fails on both (onnx's
    type inference rejects some models onnxruntime runs, such as a sparse initializer feeding Add),
    in which case the basic check stands and the returned note says so (verify still compares outputs),
    unless the input's failure is a type-constraint violation, which onnxruntime refuses as well.
    ``optimize`` always runs the full check, so a model no runtime accepts is never written.
    ``serialized``: ``graphopt.ir.large.small_bytes(model)``, when the caller has it already."""
    error = _checker_error(model, full, serialized)
    if error is None:
        return None
    if original is not None:
        input_error = _checker_error(original, full)
        if input_error is not None:
            if (full and not _is_type_error(input_error) and _checker_error(original, False) is None
                    and _checker_error(model, False) is None):
                return f"the input fails onnx's full check too ({input_error}); checked without type inference"
            hint = ("; or export it in float32 and let --precision fp16 convert it" if "float16" in input_error
                    and "inconsistent type" in input_error else "")
            raise InvalidModel(f"{source}: the input model fails onnx.checker: {input_error}; fix or re-export "
                               f"the model{hint}")
    blamed = _blame_user_rule(model, error, rules)
    if blamed is not None:
        raise blamed
    raise GraphoptError(f"internal error: the optimized model fails onnx.checker: {error}")
