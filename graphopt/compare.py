"""Compare two models on the same random inputs under onnxruntime (CPU).

Inputs follow each graph input's dtype; symbolic or unknown dims take realistic sizes (``--shape``
overrides per input, otherwise ``BATCH_DIM`` for a leading dim and ``DEFAULT_DIM`` for the others,
so attention runs over more than a couple of positions), and an input whose name says it is a mask
is all ones (attend everywhere: an all-zero mask would make every score the same and hide errors).
Errors are reported per output as the max absolute error and the max relative error
``|a - b| / (|b| + atol)``; NaN and inf must sit at the same places in both outputs. The default
tolerances follow the models' dtypes (``default_tolerances``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

from graphopt.errors import InvalidModel, UsageError, VerificationFailed, did_you_mean
from graphopt.ir.io import on_disk
from graphopt.ir.large import WEIGHTLESS_ABOVE, is_large

BATCH_DIM = 2  # a symbolic leading (batch) dim
DEFAULT_DIM = 16  # any other symbolic dim: sequence lengths, image sides
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
#: Most bytes the random inputs of one verify/run may take together; past it, refused before allocating.
MAX_INPUT_BYTES = 4 * 2**30


def check_tolerances(rtol: float, atol: float) -> None:
    """--rtol / --atol must be finite and non-negative (NaN would make every comparison fail)."""
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise UsageError(f"{name} {value}: expected a finite number >= 0, for example {name} 1e-4")


def input_sizes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[list[int], int]]:
    """name -> (dims, bytes) of the random input ``make_inputs`` would allocate, computed without
    allocating; raises UsageError naming the input when they are too large together."""
    shapes = dict(shapes or {})
    out: dict[str, tuple[list[int], int]] = {}
    total = 0
    for vi in _graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if vi.name in shapes:
            dims = [int(d) for d in shapes[vi.name]]
        else:
            dims = [d.dim_value if d.HasField("dim_value") else DEFAULT_DIM for d in tt.shape.dim]
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
        except Exception:
            itemsize = 1  # an undefined or exotic dtype: make_inputs says so
        size = itemsize
        for d in dims:
            size *= max(d, 0)
        total += size
        out[vi.name] = (dims, size)
        if total > MAX_INPUT_BYTES:
            hint = "give a smaller --shape" if vi.name in shapes else "give a smaller --shape for it"
            raise UsageError(f"input {vi.name!r} with shape {dims} needs {size / 2**30:.3g} GiB of random data "
                             f"({total / 2**30:.3g} GiB for the inputs so far, at most {MAX_INPUT_BYTES // 2**30} GiB); "
                             f"{hint}")
    return out


FP16_RTOL = 1e-2  # a model that computes in float16 / bfloat16 keeps ~3 significant digits
FP16_ATOL = 1e-2
_NARROW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def computes_in_fp16(model: onnx.ModelProto) -> bool:
    """True when a float graph input or output, or an initializer, is float16 or bfloat16."""
    g = model.graph
    types = [vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output) if vi.type.HasField("tensor_type")]
    types += [t.data_type for t in g.initializer]
    return any(t in _NARROW for t in types)


def default_tolerances(*models: onnx.ModelProto) -> tuple[float, float]:
    """(rtol, atol) for comparing these models' outputs: 1e-2 / 1e-2 when any of them computes in
    float16 or bfloat16, else 1e-4 / 1e-5."""
    if any(computes_in_fp16(m) for m in models):
        return FP16_RTOL, FP16_ATOL
    return DEFAULT_RTOL, DEFAULT_ATOL


def resolve_tolerances(rtol: float | None, atol: float | None, *models: onnx.ModelProto) -> tuple[float, float]:
    """The given tolerances; a ``None`` takes the default for the models' dtypes."""
    d_rtol, d_atol = default_tolerances(*models) if rtol is None or atol is None else (rtol, atol)
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def _is_mask(name: str) -> bool:
    return "mask" in name.lower()


def parse_shape_overrides(items: Sequence[str]) -> dict[str, list[int]]:
    """``["x=1x3x224x224", "ids=2x16"]`` -> ``{"x": [1, 3, 224, 224], "ids": [2, 16]}``.

    ``UsageError`` (exit 2) for anything but NAME=D1xD2... with positive integer dims."""
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name or not dims:
            raise UsageError(f"--shape {item!r}: expected NAME=D1xD2x..., for example input=1x3x224x224")
        values = []
        for d in dims.lower().split("x"):
            d = d.strip()
            if not d.isdigit() or int(d) < 1:
                raise UsageError(f"--shape {item!r}: {d!r} is not a positive integer; "
                                 "dims are sizes of 1 or more, for example input=1x3x224x224")
            values.append(int(d))
        if name in out:
            raise UsageError(f"--shape {item!r}: input {name!r} is given twice; give each input once")
        out[name] = values
    return out


def _declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def _shown(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def check_shape_overrides(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None, option: str = "--shape") -> None:
    """Check ``--shape`` values against the model's graph inputs before any work: the input exists,
    the rank matches, fixed dims agree, and a symbolic dim shared by several inputs gets one value.
    ``UsageError`` (exit 2) naming the option, the value and what the model declares."""
    if not shapes:
        return
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    declared = {n: _declared_dims(vi) for n, vi in inputs.items()}
    bound: dict[str, tuple[str, int]] = {}
    for name, dims in shapes.items():
        value = f"{option} {name}={'x'.join(map(str, dims))}"
        if name not in inputs:
            listed = ", ".join(f"{n} {_shown(d) if d is not None else '[?]'}" for n, d in declared.items()) or "none"
            raise UsageError(f"{value}: the model has no input {name!r}{did_you_mean(name, inputs) or ';'} "
                             f"its inputs are: {listed}")
        want = declared[name]
        if want is None:
            continue
        if len(want) != len(dims):
            raise UsageError(f"{value}: input {name!r} has {len(want)} dims {_shown(want)}, the value gives {len(dims)}")
        for i, (w, d) in enumerate(zip(want, dims)):
            if isinstance(w, int) and w > 0 and w != d:
                raise UsageError(f"{value}: dim {i} of input {name!r} is fixed at {w} in the model {_shown(want)}; "
                                 f"give {w} there")
            if isinstance(w, str):
                prev = bound.setdefault(w, (name, d))
                if prev[1] != d:
                    raise UsageError(f"{value}: dim {w!r} is {prev[1]} in the value for input {prev[0]!r}; "
                                     f"one symbolic dim takes one size")


def check_given_inputs(model: onnx.ModelProto, given: Mapping[str, np.ndarray], option: str = "--input") -> None:
    """Arrays given for graph inputs (``run --input``) against the declared names, dtypes, ranks and
    fixed dims: ``UsageError`` (exit 2) naming the option and the input."""
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    for name, arr in given.items():
        if name not in inputs:
            raise UsageError(f"{option} {name}: the model has no input of that name{did_you_mean(name, inputs) or ';'} "
                             f"its inputs are {', '.join(map(repr, inputs)) or 'none'}")
        elem = inputs[name].type.tensor_type.elem_type
        want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None
        if want is not None and arr.dtype != want:
            raise UsageError(f"{option} {name}: the array has dtype {arr.dtype.name}, the model's input {name!r} is "
                             f"{want.name}; save it as {want.name} (numpy: arr.astype('{want.name}'))")
        dims = _declared_dims(inputs[name])
        if dims is not None and (len(dims) != arr.ndim or any(
                isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, arr.shape))):
            raise UsageError(f"{option} {name}: the array has shape {list(arr.shape)}, the model's input {name!r} "
                             f"is {_shown(dims)}")


def check_same_inputs(candidate: onnx.ModelProto, reference: onnx.ModelProto, a: str = "A", b: str = "B") -> None:
    """``UsageError`` (exit 2) unless both models take the same inputs: names, dtypes and ranks."""
    def sig(model):
        return {vi.name: (vi.type.tensor_type.elem_type, len(_declared_dims(vi) or [])) for vi in _graph_inputs(model)}

    sa, sb = sig(candidate), sig(reference)
    if set(sa) != set(sb):
        raise UsageError(f"{a} and {b} take different inputs ({', '.join(sorted(sa)) or 'none'} against "
                         f"{', '.join(sorted(sb)) or 'none'}); verify compares two versions of one model")
    for name in sorted(sa):
        (ta, ra), (tb, rb) = sa[name], sb[name]
        if ta != tb or (ra and rb and ra != rb):
            def show(t, r):
                return f"{onnx.TensorProto.DataType.Name(t).lower() if t else '?'} of rank {r}"
            raise UsageError(f"input {name!r} is {show(ta, ra)} in {a} but {show(tb, rb)} in {b}; "
                             "verify compares two versions of one model")


@dataclass
class OutputError:
    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class VerifyResult:
    ok: bool
    rtol: float
    atol: float
    input_shapes: dict[str, list[int]]
    outputs: list[OutputError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. outputs too small for the tolerance

    def to_dict(self) -> dict:
        return asdict(self)

    def worst(self) -> OutputError | None:
        bad = [o for o in self.outputs if not o.ok]
        return bad[0] if bad else None


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def make_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for every graph input (initializer-backed inputs keep their defaults). Their
    total size is checked first (``input_sizes``)."""
    input_sizes(model, shapes)
    shapes = dict(shapes or {})
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in _graph_inputs(model):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise InvalidModel(f"input {vi.name!r} is not a tensor; graphopt verify handles tensor inputs only")
        if vi.name in shapes:
            dims = list(shapes[vi.name])
        else:
            dims = [d.dim_value if d.HasField("dim_value") else (BATCH_DIM if i == 0 else DEFAULT_DIM)
                    for i, d in enumerate(tt.shape.dim)]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if _is_mask(vi.name) and dtype.kind in "fbiu":
            feeds[vi.name] = np.ones(dims, dtype=dtype)  # attend everywhere
        elif dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.integers(0, 2, dims).astype(bool)
        elif dtype.kind in "iu":
            # small non-negative ints: valid token ids, indices and masks for the sample models
            feeds[vi.name] = rng.integers(0, 2, dims).astype(dtype)
        else:
            raise InvalidModel(f"input {vi.name!r} has dtype {dtype}, which graphopt verify cannot generate")
    return feeds


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # errors reach the user as one line (the exception below), never as ORT log lines
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not is_large(model, WEIGHTLESS_ABOVE):
        return _run_session(ort, model.SerializeToString(), opts, feeds)
    # past protobuf's 2 GB (or with weights still in their files) bytes are impossible: onnxruntime
    # reads the model from a temporary folder, its weights as external data
    with on_disk(model) as path:
        return _run_session(ort, str(path), opts, feeds)


def _run_session(ort, model: "bytes | str", opts, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, dict(feeds))))  # type: ignore[return-value]
    except Exception as e:  # onnxruntime raises its own exception types; keep the first line only
        raise VerificationFailed(f"onnxruntime could not run the model: {str(e).splitlines()[0][:300]}") from None


def compare_outputs(name: str, a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> OutputError:
    """``a`` is the candidate, ``b`` the reference."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        return OutputError(name, list(b.shape), float("inf"), float("inf"), False, f"shape {list(a.shape)} vs {list(b.shape)}")
    if a.dtype != b.dtype:
        note = f"dtype {a.dtype} vs {b.dtype}"
    else:
        note = ""
    if a.dtype.kind not in "fc" or b.dtype.kind not in "fc":
        equal = np.array_equal(a, b)
        diff = 0.0 if equal else float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        return OutputError(name, list(b.shape), diff, 0.0 if equal else float("inf"), equal, note)
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    inf_mismatch = (np.isinf(a64) | np.isinf(b64)) & ~(a64 == b64)
    if not np.array_equal(nan_a, nan_b) or inf_mismatch.any():
        return OutputError(name, list(b.shape), float("inf"), float("inf"), False, "NaN/inf at different positions")
    finite = np.isfinite(a64) & np.isfinite(b64)
    if not finite.any():
        return OutputError(name, list(b.shape), 0.0, 0.0, True, note)
    diff = np.abs(a64[finite] - b64[finite])
    max_abs = float(diff.max())
    max_rel = float((diff / (np.abs(b64[finite]) + atol)).max())
    ok = bool(np.all(diff <= atol + rtol * np.abs(b64[finite])))
    return OutputError(name, list(b.shape), max_abs, max_rel, ok, note)


def verify_models(
    candidate: onnx.ModelProto,
    reference: onnx.ModelProto,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    runs: int = 1,
    run_candidate=None,
) -> VerifyResult:
    """Run both models on ``runs`` sets of random inputs and compare every output by name.

    ``rtol`` / ``atol`` default to ``default_tolerances(candidate, reference)``.
    ``run_candidate(feeds) -> {name: array}`` runs the candidate (default: onnxruntime CPU; the CLI's
    ``verify --device cuda`` passes the graphopt runtime)."""
    check_tolerances(rtol, atol)
    rtol, atol = resolve_tolerances(rtol, atol, candidate, reference)
    result = VerifyResult(ok=True, rtol=rtol, atol=atol, input_shapes={})
    worst: dict[str, OutputError] = {}
    ref: dict[str, np.ndarray] = {}
    for r in range(runs):
        feeds = make_inputs(reference, shapes, seed=seed + r)
        result.input_shapes = {k: list(v.shape) for k, v in feeds.items()}
        ref = run_onnxruntime(reference, feeds)
        cand_feeds = {vi.name: feeds[vi.name] for vi in _graph_inputs(candidate) if vi.name in feeds}
        got = run_onnxruntime(candidate, cand_feeds) if run_candidate is None else run_candidate(cand_feeds)
        for name, b in ref.items():
            if name not in got:
                worst[name] = OutputError(name, list(np.shape(b)), float("inf"), float("inf"), False, "missing in the optimized model")
                continue
            err = compare_outputs(name, got[name], b, rtol, atol)
            prev = worst.get(name)
            if prev is None or (prev.ok and not err.ok) or err.max_rel > prev.max_rel:
                worst[name] = err
    result.outputs = list(worst.values())
    result.ok = all(o.ok for o in result.outputs)
    result.warnings = [w for name, b in ref.items() if (w := tolerance_warning(name, b, atol))]
    return result


def tolerance_warning(name: str, reference: np.ndarray, atol: float) -> str:
    """A warning when every finite value of a float output is within ``atol`` of zero: any candidate
    that is also near zero passes, so the comparison says nothing about it. ``""`` otherwise."""
    b = np.asarray(reference)
    if b.dtype.kind not in "fc" or b.size == 0 or atol <= 0:
        return ""
    finite = np.abs(b[np.isfinite(b)].astype(np.float64))
    if finite.size == 0:
        return ""
    biggest = float(finite.max())
    if biggest > atol:
        return ""
    hint = f"give --atol below {biggest * 1e-3:.1e}" if biggest > 0 else "use inputs or weights that give non-zero outputs"
    return (f"output {name!r}: every value is within atol {atol:g} of zero (largest |value| {biggest:.3g}), so the "
            f"check cannot tell right from wrong there; {hint}")
