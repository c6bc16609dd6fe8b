"""``OpSchema``: the declaration of one graphopt custom op (domain ``graphopt``, version 1).

A schema says which inputs and attributes an op takes, checks a node's attributes (``validate``
returns a reason instead of raising, so the rewrite engine can report near-misses), names the
function-body variant a node needs (``overload``), builds that body (``function``) and computes
the NumPy ground truth (``reference``). The op-specific parts live in ``cbr.py`` and
``gemm_act.py``; this module holds only the generic checks every op shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from graphopt.errors import RuleError

DOMAIN = "graphopt"
VERSION = 1

# The attributes lowering selection writes on every graphopt node (graphopt.tune.select): each op
# declares them, so the nodes validate and the function bodies list them.
LOWERING_ATTRIBUTES: dict[str, tuple[type, None]] = {
    "lowering": (str, None),
    "lowering_params": (str, None),
    "lowering_buckets": (str, None),  # JSON, one choice per --shape-profile bucket (graphopt.tune.buckets)
    "lowering_layout": (str, None),  # NCHW / NHWC: the layout the output runs in (graphopt.tune.layout_choice)
}

# Floating-point element types every graphopt op accepts (the type constraint "T").
FLOAT_TYPES: tuple[str, ...] = ("tensor(bfloat16)", "tensor(double)", "tensor(float)", "tensor(float16)")


def _drop_none(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``None`` means "absent" everywhere in this package."""
    return {k: v for k, v in attrs.items() if v is not None}


def _check_type(name: str, value: Any, typ: type) -> str | None:
    """Return a reason when ``value`` does not fit the declared attribute type ``typ``."""
    if typ is float:
        ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    elif typ is str:
        ok = isinstance(value, str)
    elif typ is list:  # list of ints (Conv's dilations, kernel_shape, pads, strides)
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value
        )
    else:  # pragma: no cover - schema declaration bug
        raise TypeError(f"unsupported attribute type {typ!r} for {name}")
    if ok:
        return None
    want = {float: "a float", int: "an int", str: "a string", list: "a list of ints"}[typ]
    return f"attribute {name}={value!r} must be {want}"


@dataclass(frozen=True)
class OpSchema:
    """One custom op.

    ``inputs`` is a list of ``(name, optional)``,
    ``attributes`` maps a name to ``(python type, default or None)`` where ``list`` means a list
    of ints and a ``None`` default means "absent unless given". The four callables are the op's
    private implementation and are wrapped by the public methods below.
    """

    name: str
    inputs: tuple[tuple[str, bool], ...]
    attributes: Mapping[str, tuple[type, Any]]
    doc: str
    _check: Callable[[dict, list[bool]], str | None] = field(repr=False)
    _overload: Callable[[dict, list[bool], int | None], str] = field(repr=False)
    _needs_dtype: Callable[[dict, list[bool]], bool] = field(repr=False)
    _body: Callable[[str, int], onnx.FunctionProto] = field(repr=False)
    _reference: Callable[[list, dict], list] = field(repr=False)
    outputs: tuple[str, ...] = ("Y",)
    type_constraints: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"T": FLOAT_TYPES})
    domain: str = DOMAIN
    version: int = VERSION
    # Attributes whose default ``attach_functions`` writes onto a node that lacks them: the body
    # reads them through ``Constant(value_float=<ref>)``, which has no fallback when the caller's
    # attribute is absent (an op's own attribute default, e.g. LeakyRelu's alpha, needs no entry).
    explicit_defaults: tuple[str, ...] = ()
    # The op's semantics against an array module: ``xp_impl(xp, inputs, attrs, matmul) -> outputs``,
    # with ``xp`` numpy or cupy and ``matmul(a, b)`` the runtime's GEMM (capture-safe on the GPU). It
    # computes in float32 (float16 inputs are upcast) and returns arrays of the first input's dtype,
    # every output the op has. The runtime runs it on the device when no lowering applies, so a node
    # never falls back to the host; ``None`` only for an op whose runtime fallback lives in the runtime
    # itself (CBR's convolution).
    xp_impl: Callable[..., list] | None = field(default=None, repr=False)
    # ``_output_shapes(input_shapes, attrs) -> [shape of each output]``: the one place an op's output
    # shapes are computed (the runtime's buffers, the profiler's checker); ``None`` for an op that
    # does not say (its kernels' family then declares it, see ``register_family(output_shape=)``).
    _output_shapes: Callable[[list, dict], list] | None = field(default=None, repr=False)
    # ``_check_input(i, shape, dtype, attrs, rng) -> array | None``: the host value of input ``i`` on
    # which the profiler checks a lowering (``graphopt.kernels.check``), drawn from the NumPy
    # generator ``rng``; ``None`` (returned, or no function) means N(0, 1) of ``dtype``. Ops use it to
    # keep outputs O(1) (weights scaled by 1/sqrt(fan-in)) or for inputs that are not data (a mask).
    _check_input: Callable[..., Any] | None = field(default=None, repr=False)
    # Inputs the timer must also take from ``check_input`` (seeded with 0) instead of device N(0, 1)
    # values: those whose values change the work (Attention's mask).
    host_check_inputs: tuple[int, ...] = ()
    # The input whose dtype is the op's data dtype (Attention: Q, its mask may be bool); ``None``:
    # every present input has the one data dtype.
    data_dtype_input: int | None = None

    # -- checks ---------------------------------------------------------------------------------
    def validate(self, attrs: Mapping[str, Any], present_inputs: Sequence[bool]) -> str | None:
        """Return ``None`` when a node with these attributes and inputs is valid, else a reason.

        ``present_inputs[i]`` says whether input ``i`` is given (``""`` and trailing omitted
        inputs are absent). Attribute values are plain Python values (str, int, float, list).
        """
        present = [bool(p) for p in present_inputs]
        attrs = _drop_none(attrs)
        if len(present) > len(self.inputs):
            return f"{self.name} takes at most {len(self.inputs)} inputs, got {len(present)}"
        for i, (iname, optional) in enumerate(self.inputs):
            if not optional and (i >= len(present) or not present[i]):
                return f"{self.name} needs input {i} ({iname})"
        for aname in sorted(attrs):
            if aname not in self.attributes:
                known = ", ".join(sorted(self.attributes))
                return f"unknown attribute {aname!r} for {self.name} (known: {known})"
            reason = _check_type(aname, attrs[aname], self.attributes[aname][0])
            if reason:
                return reason
        return self._check(self.normalize(attrs), present)

    def _require_valid(self, attrs: Mapping[str, Any], present_inputs: Sequence[bool]) -> list[bool]:
        present = [bool(p) for p in present_inputs]
        reason = self.validate(attrs, present)
        if reason:
            raise RuleError(f"invalid graphopt.{self.name}: {reason}")
        return present

    def normalize(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Canonical attribute values: ``None`` entries dropped, floats as float, int lists as lists.

        Use it before writing attributes onto a node: an int given for a float attribute (say
        ``clip_min=0``) would otherwise become an INT attribute, which the body's float reference
        cannot read. Unknown names are kept as they are (``validate`` reports them).
        """
        out: dict[str, Any] = {}
        for name, value in _drop_none(attrs).items():
            typ = self.attributes.get(name, (None, None))[0]
            if typ is float and _check_type(name, value, float) is None:
                value = float(value)
            elif typ is int and _check_type(name, value, int) is None:
                value = int(value)
            elif typ is list and _check_type(name, value, list) is None:
                value = [int(v) for v in value]
            out[name] = value
        return out

    # -- variants and bodies --------------------------------------------------------------------
    def overload(self, attrs: Mapping[str, Any], present_inputs: Sequence[bool], dtype: int | None = None) -> str:
        """The deterministic overload key of the function body a node needs, e.g. ``"relu_b_r"``.

        The key depends only on what changes the body (activation, which optional inputs are
        present, which clip bounds are given). ``dtype`` (an ``onnx.TensorProto`` element type) is
        only encoded when it is not float32 and the body needs typed constants; callers that
        target opset >= 15 leave it ``None`` because the body then uses ``CastLike``.
        Raises ``RuleError`` when the attributes are invalid.
        """
        present = self._require_valid(attrs, present_inputs)
        return self._overload(self.normalize(attrs), present, dtype)

    def validated_overload(self, attrs: Mapping[str, Any], present_inputs: Sequence[bool],
                           dtype_of: Callable[[], int | None] | None = None) -> str:
        """``overload`` for attributes and inputs that ``validate`` has just accepted, without
        validating them again (``needs_dtype`` and ``overload`` each validate; the rewrite engine and
        ``attach_functions``, which validate first to word the reason their own way, validated every
        node three times). ``dtype_of()`` gives the element type; it is asked only when the body
        holds typed constants (``needs_dtype``), and ``None`` (opset >= 15) keeps dtype out of the key."""
        present = [bool(p) for p in present_inputs]
        normalized = self.normalize(attrs)
        dtype = dtype_of() if dtype_of is not None and self._needs_dtype(normalized, present) else None
        return self._overload(normalized, present, dtype)

    def needs_dtype(self, attrs: Mapping[str, Any], present_inputs: Sequence[bool]) -> bool:
        """Whether the body for these attributes holds typed constants (so dtype matters below opset 15)."""
        present = self._require_valid(attrs, present_inputs)
        return self._needs_dtype(self.normalize(attrs), present)

    def function(self, overload: str, opset: int) -> onnx.FunctionProto:
        """The ``FunctionProto`` (domain graphopt, name = op, given overload) for a default-domain opset."""
        if not isinstance(opset, int) or opset < 9:
            raise RuleError(f"graphopt.{self.name}: function bodies need default-domain opset >= 9, got {opset!r}")
        return self._body(overload, opset)

    def named(self, values: Sequence[Any]) -> dict[str, Any]:
        """``values`` given in input order (a node's inputs, their shapes, a launch's arrays) keyed by
        the input's name, ``None`` for those absent or not given: the one place a lowering finds an
        optional input of an op whose optional inputs differ from a sibling op's (LayerNorm's skip is
        input 3, RMSNorm's input 2)."""
        vals = list(values)
        return {n: (vals[i] if i < len(vals) else None) for i, (n, _) in enumerate(self.inputs)}

    # -- ground truth ---------------------------------------------------------------------------
    def reference(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
        """NumPy ground truth: computes in float64 and returns arrays of the first input's dtype."""
        present = [x is not None for x in inputs]
        self._require_valid(attrs, present)
        padded = list(inputs) + [None] * (len(self.inputs) - len(inputs))
        return self._reference(padded, self.normalize(attrs))

    def output_shapes(self, input_shapes: Sequence[Sequence[int] | None], attrs: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
        """The shape of every output the op has for these input shapes (``None`` for an absent
        optional input), or ``None`` when the op does not declare them."""
        if self._output_shapes is None:
            return None
        padded = [None if s is None else tuple(int(d) for d in s) for s in input_shapes]
        padded += [None] * (len(self.inputs) - len(padded))
        return [tuple(int(d) for d in s) for s in self._output_shapes(padded, self.normalize(attrs))]

    # -- check inputs ---------------------------------------------------------------------------
    def check_input(self, i: int, shape: Sequence[int], dtype: str, attrs: Mapping[str, Any],
                    rng: np.random.Generator) -> np.ndarray:
        """Host value of input ``i`` (of ``shape``, data dtype ``dtype``) for checking a lowering
        against the reference: N(0, 1) unless the op says otherwise (``_check_input``)."""
        shape = tuple(int(d) for d in shape)
        if self._check_input is not None:
            value = self._check_input(i, shape, dtype, attrs, rng)
            if value is not None:
                return value
        return rng.standard_normal(shape).astype(dtype)

    def check_inputs(self, input_shapes: Sequence[Sequence[int] | None], dtype: str, attrs: Mapping[str, Any],
                     rng: np.random.Generator) -> list[np.ndarray | None]:
        """Every input's check value in order (``None`` for an absent one), drawn from ``rng``."""
        return [None if s is None else self.check_input(i, s, dtype, attrs, rng) for i, s in enumerate(input_shapes)]

    def attribute_names(self) -> list[str]:
        """All declared attribute names, sorted (the FunctionProto's attribute list)."""
        return sorted(self.attributes)
