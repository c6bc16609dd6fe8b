"""cuDNN frontend candidates: CBR as one fused cuDNN operation graph, every engine plan a candidate.

The graph is ``conv_fprop(X, W) -> add(B) -> add(R) -> activation`` with fp32 compute and
intermediates, X / W / R / Y in NHWC (channels-last strides: ``graphopt.lowering.layout``), which is
where cuDNN's fused engines are fast on tensor cores. Each plan that cuDNN's heuristics (mode A,
then the fallback list) offer and that ``check_support`` keeps is a candidate keyed by its plan name
(engine id and knobs, stable across runs, not a list position); the plain ``cudnn`` candidate asks
cuDNN's heuristic for its first plan when the node is loaded (the heuristic's choice when nothing
was profiled). Each plan gets its own workspace size: a plan executed with another plan's workspace
faulted and poisoned the CUDA context on the H200, so candidates are timed in the profiler's
isolated worker like the own kernels.

The activation is cuDNN pointwise ops (``graphopt.providers.cudnn_pointwise``, which the matmul and
the channel-padded graphs share); a composed one's scalars are bound at every launch
(:func:`bind_constants`).

Graph construction (:func:`conv_graph`) takes the ``cudnn`` module as an argument, so the CPU tests
drive it with a fake module that records the calls.

This module is also the one home of what every cuDNN candidate shares (``cudnn_sdpa`` for Attention,
``cudnn_norm`` for LayerNorm / RMSNorm build on it): the library and handle state (``_load``,
``unavailable``, ``versions``), the per-signature graph with its plans listed (:func:`listed`), a plan
picked and built with its own workspace size (:func:`plan_at`), the keys (:func:`plan_candidates`,
:func:`plan_from_key`), binding arrays (:func:`bind`) and running a plan on the current stream
(:func:`execute`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphopt.errors import TuningError
from graphopt.kernels import geometry as geo
from graphopt.lowering.contract import Candidate, Lowering, Signature
from graphopt.providers import cudnn_listing
from graphopt.providers.cudnn_pointwise import activation, activation_reason

OPS = ("CBR",)
NAME = "cudnn"
# The form of the convolution graphs this module builds (every cuDNN CBR provider's): part of their source hash
# and of their remembered plan listings, so that timings and listings of an older form never answer for the
# new one. 2: the model's end pads, and a stem's plans noted REDUCED_PRECISION_REDUCTION offered (1: the
# fewest end pads, every inexact note barred). The other ops' graphs are form 1 (their hash is unchanged).
GRAPH_FORM = 2
DTYPES = {"float16": "HALF", "float32": "FLOAT", "bfloat16": "BFLOAT16"}
# X, W, B, R in, Y out: what the runtime and the checker hand over / allocate; B (1-D: any layout is
# the same memory) says NHWC so that a node without bias or residual reads Y's layout there too
LAYOUTS = ("NHWC", "NHWC", "NHWC", "NHWC", "NHWC")

_STATE: dict[str, Any] = {}  # "module", "reason", "handle": per process
_GRAPHS: dict[str, Any] = {}  # signature key -> _Built (one graph per signature and process)
_REFUSED: dict[str, str] = {}  # signature key -> why cuDNN does not support its graph (per process)


def graph_form(op: str) -> int:
    """The form of the cuDNN graphs built for ``op`` (``GRAPH_FORM`` for CBR's convolutions, else 1)."""
    return GRAPH_FORM if op == "CBR" else 1


class GraphRefused(TuningError):
    """cuDNN does not support a graph here (its frontend's ``cudnnGraphNotSupportedError``): a fact for
    this GPU and cuDNN version, remembered for the process (:func:`listed`) and, as an empty plan
    listing, on disk (:func:`plan_keys`), so a warm run does not build the graph again to learn it."""


def _load():
    if "reason" not in _STATE:
        try:
            import cudnn  # nvidia-cudnn-frontend

            _STATE["module"], _STATE["reason"] = cudnn, None
        except Exception as e:  # noqa: BLE001 - not installed, or its libcudnn is missing
            _STATE["module"] = None
            _STATE["reason"] = (f"nvidia-cudnn-frontend is not importable ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:120] if str(e) else ''}); pip install 'graphopt[gpu]'")
    return _STATE["module"]


def unavailable() -> str | None:
    """None when the cuDNN frontend imports here, else why not."""
    _load()
    return _STATE["reason"]


def versions() -> tuple[tuple[str, str], ...]:
    mod = _load()
    if mod is None:
        return ()
    backend = mod.backend_version() if hasattr(mod, "backend_version") else "?"
    return (("cudnn", str(backend)), ("cudnn_frontend", str(getattr(mod, "__version__", "?"))))


def _handle(mod):
    if "handle" not in _STATE:
        _STATE["handle"] = mod.create_handle()
    return _STATE["handle"]


def _nhwc_strides(dims: list[int]) -> list[int]:
    n, c, h, w = dims
    return [c * h * w, 1, w * c, c]


def _nchw_strides(dims: list[int]) -> list[int]:
    n, c, h, w = dims
    return [c * h * w, h * w, w, 1]


def conv_reason(sig: Signature) -> str | None:
    """Why this CBR signature has no cuDNN graph (before any library call), or None."""
    try:
        g = geo.conv_geom(sig)
        dt = geo.dtype_of(sig)
    except TuningError as e:
        return str(e)
    if dt not in DTYPES:
        return f"dtype {dt} (cuDNN graphs here: {', '.join(DTYPES)})"
    why = activation_reason(sig)
    if why:
        return why
    if g.N * g.C * g.H * g.W >= 2 ** 31 or g.N * g.M * g.OH * g.OW >= 2 ** 31:
        return "tensors over 2**31 elements"
    return None


def conv_graph(mod, handle, sig: Signature, layout: str = "NHWC"):
    """The cuDNN frontend graph for a CBR signature and its tensors ``{"X", "W", "B"?, "R"?, "Y"}``;
    X, W (KRSC or OIHW), R and Y in ``layout`` ("NHWC" or "NCHW"), through their strides."""
    strides = _nhwc_strides if layout == "NHWC" else _nchw_strides
    g = geo.conv_geom(sig)
    dt = getattr(mod.data_type, DTYPES[geo.dtype_of(sig)])
    f32 = mod.data_type.FLOAT
    graph = mod.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    xd = [g.N, g.C, g.H, g.W]
    wd = [g.M, g.C // g.G, g.KH, g.KW]
    yd = [g.N, g.M, g.OH, g.OW]
    t = {"X": graph.tensor(name="X", dim=xd, stride=strides(xd), data_type=dt),
         "W": graph.tensor(name="W", dim=wd, stride=strides(wd), data_type=dt)}
    # the model's own end pads, not the fewest that give OH x OW: cuDNN's first-layer engine (ResNet-50's
    # stem: pads 3 each side, torch's 61 us kernel) refuses the trimmed end pad (NOTES_kernels, fifteenth session)
    y = graph.conv_fprop(image=t["X"], weight=t["W"], pre_padding=[g.ph, g.pw], post_padding=[g.eh, g.ew],
                         stride=[g.sh, g.sw], dilation=[g.dh, g.dw], compute_data_type=f32, name="conv")
    shapes = sig.input_shapes
    if len(shapes) > 2 and shapes[2] is not None:
        t["B"] = graph.tensor(name="B", dim=[1, g.M, 1, 1], stride=[g.M, 1, g.M, g.M], data_type=dt)
        y = graph.add(a=y, b=t["B"], compute_data_type=f32, name="bias")
    if len(shapes) > 3 and shapes[3] is not None:
        t["R"] = graph.tensor(name="R", dim=yd, stride=strides(yd), data_type=dt)
        y = graph.add(a=y, b=t["R"], compute_data_type=f32, name="residual")
    y = activation(graph, y, sig, f32, t, rank=4)
    y.set_output(True).set_data_type(dt).set_dim(yd).set_stride(strides(yd))
    t["Y"] = y
    return graph, t


def bind_constants(t: dict, pack: dict) -> dict:
    """Add the activation's pass-by-value scalars (``t["constants"]``, see ``cudnn_pointwise.activation``) to a
    variant pack."""
    for name, value in t.get("constants", {}).items():
        pack[t[name]] = _HostDl(value)
    return pack


@dataclass
class _Built:
    graph: Any
    tensors: dict
    names: list  # the offered plans' names, in the heuristics' order
    built: set
    extra: Any = None  # what the op's graph builder returned beside the graph and its tensors
    indices: list | None = None  # each offered plan's index in cuDNN's plan list (None: 0, 1, 2, ...)
    handed: set = field(default_factory=set)  # plan indices a built lowering already runs
    copies: int = 0  # private copies made for second lowerings of a plan (lowering_plan)


def lowered_tensors(graph) -> list:
    """The C++ tensors a validated frontend graph binds to pointers (``_cpp_tensors``, by uid: neither
    virtual nor scalars passed by value); [] where the frontend keeps none."""
    return [t for t in (getattr(graph, "_cpp_tensors", None) or {}).values()
            if not t.get_is_virtual() and not t.get_is_pass_by_value()]


def declare_alignment(graph, nbytes: int) -> None:
    """Declare every non-virtual tensor of a validated graph ``nbytes``-byte aligned to cuDNN. The frontend
    declares 16 (``Tensor_attributes::default_alignment``, "pointer alignment assumed by the backend when
    selecting engines"); torch declares its pointers' alignment up to 32. Measured on an H100 (code
    b16e402, ``bench/results/align_probe_h100_b16e402.md``): declaring 32 moved the first four plans of
    eight CBR layers and three GEMMs by at most 2 %, one by 8 %. The Python graph has no argument for it:
    it is set on the lowered C++ tensors (``_cpp_tensors``, filled by ``validate``) before
    ``build_operation_graph`` creates the backend's descriptors. A frontend without them refuses the graph (a reason, never a wrong declaration)."""
    tensors = lowered_tensors(graph)
    if not tensors:
        raise GraphRefused(f"this cuDNN frontend exposes no lowered tensors to declare {nbytes}-byte aligned")
    for t in tensors:
        t.set_alignment(nbytes)


def listed(sig: Signature, make, tag: str = "", alignment: int | None = None) -> _Built:
    """The graph ``make(mod, handle, sig) -> (graph, tensors[, extra])`` builds for ``sig``, validated,
    with its plans listed (heuristics A, then the fallback list; those ``check_support`` keeps).
    Cached per signature (and ``tag``, for a second form of one op's graph) and process: every
    candidate of one signature shares it. ``alignment``: the byte alignment its tensors declare
    (``declare_alignment``; None: the frontend's 16), part of the cache key."""
    key = sig.key() + tag + (f"|align{alignment}" if alignment is not None else "")
    if key in _REFUSED:
        raise GraphRefused(_REFUSED[key])
    if key not in _GRAPHS:
        mod = _load()
        if mod is None:
            raise TuningError(_STATE["reason"])
        try:
            made = make(mod, _handle(mod), sig)
            graph, tensors = made[0], made[1]
            graph.validate()
            if alignment is not None:
                declare_alignment(graph, alignment)
            graph.build_operation_graph()
            graph.create_execution_plans([mod.heur_mode.A, mod.heur_mode.FALLBACK])
            barred = _deselect_inexact(mod, graph, sig)
            graph.check_support()
        except GraphRefused as e:
            _REFUSED[key] = str(e)
            raise
        except Exception as e:
            unsupported = getattr(mod, "cudnnGraphNotSupportedError", None)
            if isinstance(unsupported, type) and isinstance(e, unsupported):
                _REFUSED[key] = f"cuDNN does not support this graph here: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
                raise GraphRefused(_REFUSED[key]) from None
            raise  # anything else (a construction bug, memory, the driver) is not remembered
        n = graph.get_execution_plan_count()
        offered = [i for i in range(n) if i not in barred]
        _GRAPHS[key] = _Built(graph, tensors, [str(graph.get_plan_name_at_index(i)) for i in offered], set(),
                              made[2] if len(made) > 2 else None, offered)
    return _GRAPHS[key]


# Plans whose numerical notes say they compute with less precision than the graph asks (fp32
# compute): a reduction in reduced precision, inputs down-converted, Winograd transforms. On the H200 a
# ResNet-50 tuned without this filter ended 4.6e-2 (max relative) away from torch in fp16, against 5.6e-4
# with the heuristic's plans. Torch does not bar all of them in fp16: the plan it runs for ResNet-50's stem
# (engine 63, H100 API log) is noted REDUCED_PRECISION_REDUCTION (barred_notes lets short stems take it).
INEXACT_NOTES = ("REDUCED_PRECISION_REDUCTION", "DOWN_CONVERT_INPUTS", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6",
                 "WINOGRAD_TILE_13x13")


# A stem whose reduction is this short (C x KH x KW terms) may take plans noted REDUCED_PRECISION_REDUCTION:
# the error such a plan can add over 147 terms (ResNet-50's stem) is inside the gate every plan passes anyway,
# and cuDNN's first-layer engine (63), the one torch runs for that stem, carries the note (bench/NOTES_kernels.md,
# fifteenth session). Every other layer keeps the bar (the ResNet-50 that ended 4.6e-2 from torch had none).
SHORT_REDUCTION = 256


def barred_notes(sig: Signature) -> tuple[str, ...]:
    """The numerical notes that bar a plan of ``sig``'s graph: ``INEXACT_NOTES``, less the reduced-precision
    reduction for a stem (``geo.is_stem``) whose reduction is at most ``SHORT_REDUCTION`` terms. The
    channel-padded stem graphs (``cudnn_cpad``: 8 channels, no stem by this measure) keep every bar."""
    if sig is not None and sig.op == "CBR":
        try:
            g = geo.conv_geom(sig)
        except TuningError:
            return INEXACT_NOTES
        if geo.is_stem(g) and g.C * g.KH * g.KW <= SHORT_REDUCTION:
            return tuple(n for n in INEXACT_NOTES if n != "REDUCED_PRECISION_REDUCTION")
    return INEXACT_NOTES


def _deselect_inexact(mod, graph, sig: Signature) -> set[int]:
    """Bar the plans carrying ``barred_notes(sig)`` and return their indices (the plan list keeps its
    positions: a barred plan refuses to build, so it is never offered as a candidate)."""
    notes = [getattr(mod.numerical_note, n) for n in barred_notes(sig)
             if hasattr(getattr(mod, "numerical_note", None), n)]
    if not notes or not hasattr(graph, "deselect_numeric_notes"):
        return set()
    graph.deselect_numeric_notes(notes)
    barred = getattr(graph, "_barred_indices", None)  # the frontend's own record of what it bars
    return set(barred()) if callable(barred) else set()


def _graph_for(sig: Signature, tag: str = "") -> _Built:
    return listed(sig, conv_graph, tag)


def plan_at(b: _Built, want: str | None, sig: Signature) -> tuple[int, int]:
    """(index, workspace bytes) of plan ``want`` (None: the heuristic's first), built once."""
    if not b.names:
        raise TuningError(f"cuDNN offers no plan for {sig.key()}")
    if want is None:  # the heuristics' first plan that is offered
        pos = 0
    elif want in b.names:
        pos = b.names.index(want)
    else:
        raise TuningError(f"cuDNN plan {want!r} is not offered for this signature here (offered: {', '.join(b.names[:8])})")
    index = b.indices[pos] if b.indices is not None else pos
    if index not in b.built:
        b.graph.build_plan_at_index(index)
        b.built.add(index)
    return index, int(b.graph.get_workspace_size_plan_at_index(index))


def lowering_plan(b: _Built, want: str | None, sig: Signature, fresh=None) -> tuple[_Built, int, int]:
    """(graph, plan index, workspace bytes) for one built lowering of plan ``want`` (see ``plan_at``).

    A plan already running in another lowering of this process (a second node of the same signature)
    gets a private copy: ``fresh(tag_suffix)`` builds the signature's graph again under its own cache
    tag. Two nodes captured in one CUDA graph then share no plan, variant pack or host-side state:
    whatever cuDNN keeps per plan is frozen into the graph once per node. Without ``fresh`` (tests)
    the plan is shared."""
    index, ws = plan_at(b, want, sig)
    if index in b.handed and fresh is not None:
        b.copies += 1
        own = fresh(f"#{b.copies}")
        name = b.names[b.indices.index(index) if b.indices is not None else index]
        index, ws = plan_at(own, name, sig)
        own.handed.add(index)
        return own, index, ws
    b.handed.add(index)
    return b, index, ws


def plan_keys(sig: Signature, built) -> list[str]:
    """The plan names cuDNN lists for ``sig`` here (``built(sig) -> _Built``), or [] where it cannot
    (no GPU, graph refused); remembered on disk per GPU and cuDNN version (``cudnn_listing``), a
    refusal (:class:`GraphRefused`) as an empty listing, any other failure not at all."""
    if _load() is None:
        return []

    def listing() -> list[str] | None:
        try:
            return list(built(sig).names)
        except GraphRefused:  # cuDNN's verdict for this GPU and version: kept (the heuristic candidate says why)
            return []
        except Exception:  # noqa: BLE001 - no GPU, or a failure that may pass: listed again next time
            return None

    try:
        device = _device_tag()
    except Exception:  # noqa: BLE001 - no GPU to name: nothing to remember
        return listing() or []
    key = f"{getattr(built, '__module__', '')}.{getattr(built, '__qualname__', '')}|{sig.key()}"
    form = graph_form(sig.op)  # a listing of an older form of the graph must not name the new one's plans
    return cudnn_listing.remembered(key, device, versions() + ((("graph_form", str(form)),) if form > 1 else ()), listing)


_DEVICE_TAGS: dict[int, str] = {}


def _device_tag() -> str:
    """The GPU the listings hold for: its name and compute capability (asked once per device)."""
    import cupy

    dev = cupy.cuda.Device()
    tag = _DEVICE_TAGS.get(dev.id)
    if tag is None:
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        tag = _DEVICE_TAGS[dev.id] = f"{name.decode() if isinstance(name, bytes) else name} sm_{dev.compute_capability}"
    return tag


def execute(b: _Built, pack: dict, workspace, index: int) -> None:
    """Run plan ``index`` of ``b`` on the current CuPy stream (``pack``: cuDNN tensor -> bound array)."""
    import cupy

    mod = _load()
    handle = _handle(mod)
    mod.set_stream(handle=handle, stream=cupy.cuda.get_current_stream().ptr)
    if workspace is None:  # one byte per process, allocated outside any capture (on first use)
        workspace = _STATE.get("dummy_ws")
        if workspace is None:
            workspace = _STATE["dummy_ws"] = cupy.empty(1, dtype=cupy.uint8)
    b.graph.execute_plan_at_index(pack, bind(workspace), index, handle=handle)


class _Dl:
    """A variant-pack entry: the frontend reads an array's pointer through ``__dlpack__``. CuPy's
    ``__dlpack__()`` without a stream would make the legacy stream wait on ours (illegal under
    CUDA-graph capture): ``stream=-1`` asks for no synchronisation (we run on the same stream)."""

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kw):
        try:
            return self.a.__dlpack__(stream=-1)
        except (TypeError, ValueError, NotImplementedError):
            return self.a.toDlpack()


class _HostDl:
    """A variant-pack entry for a host NumPy array (a pass-by-value scalar such as a norm's epsilon,
    read by value when the plan executes). The frontend asks ``__dlpack__(stream=-1)``, which NumPy
    refuses with a ValueError ("NumPy only supports stream=None", every cuDNN norm failed on the H200
    with it): a host array needs no stream, so the stream argument is dropped."""

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kw):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def bind(a):
    """A variant-pack entry: device arrays through :class:`_Dl`, host NumPy arrays through :class:`_HostDl`."""
    if a is None:
        return None
    return _HostDl(a) if isinstance(a, np.ndarray) else _Dl(a)


class CudnnCandidate(Candidate):
    """What every cuDNN candidate shares: the library versions in its cache key and hash, and the
    start of every ``build`` (:meth:`_plan`)."""

    def graphs(self):
        """``built(sig, tag="") -> _Built``: makes (and caches) this candidate's graph for a signature."""
        raise NotImplementedError

    def _plan(self, sig: Signature) -> tuple[_Built, int, int]:
        """(graph, plan index, workspace bytes) of this candidate's plan for ``sig``: refused with the
        reason when it does not apply."""
        reason = self.applies(sig)
        if reason:
            raise TuningError(f"candidate {self.key()} does not apply: {reason}")
        built = self.graphs()
        return lowering_plan(built(sig), self.param("plan"), sig, lambda tag: built(sig, tag))

    def same_as(self, sig: Signature) -> str | None:
        """Without a ``plan`` this candidate runs the first plan cuDNN lists (``plan_at``): that plan's
        candidate, where the listing is known here (remembered on disk: no graph is built for it)."""
        if self.param("plan") is not None:
            return None
        names = plan_keys(sig, self.graphs())
        return f"{self.name}:plan={names[0]}" if names else None

    #: the op whose graphs this candidate builds (its form is in the source hash: ``graph_form``)
    graph_op = ""

    def source_hash(self) -> str:
        form = graph_form(self.graph_op)
        return ("cudnn:" if form == 1 else f"cudnn{form}:") + ",".join(f"{k}={v}" for k, v in versions())

    def versions(self) -> tuple[tuple[str, str], ...]:
        return versions()


def unavailable_reason(compute_capability, need: tuple[int, int] = (7, 0), what: str = "cuDNN fused graphs") -> str | None:
    """Why no cuDNN candidate can run here (library missing, GPU too old), or None."""
    if _load() is None:
        return _STATE["reason"]
    if tuple(compute_capability) < need:
        return f"{what} need compute capability >= {need[0]}.{need[1]}, got {tuple(compute_capability)}"
    return None


@dataclass(frozen=True)
class CudnnConv(CudnnCandidate):
    """params: ``plan=<cuDNN plan name>``, or none for the heuristic's first plan at load time."""

    graph_op = "CBR"

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        return LAYOUTS  # what build() declares: X, W, R, Y in NHWC

    def graphs(self):
        """``built(sig, tag="") -> _Built``: the graph of this candidate's layout (``cudnn_nchw``'s: NCHW)."""
        return _graph_for

    def applies(self, sig: Signature, compute_capability: tuple[int, int] = (9, 0)) -> str | None:
        if sig.op not in OPS:
            return f"cuDNN candidates here are for {', '.join(OPS)}"
        return unavailable_reason(compute_capability) or conv_reason(sig)

    def build(self, sig: Signature, arch: str) -> Lowering:
        b, index, ws_bytes = self._plan(sig)
        t = b.tensors
        order = ["X", "W", "B", "R"]

        def launch(inputs, outputs, workspace):
            pack = {t[name]: _Dl(a) for name, a in zip(order, inputs) if a is not None and name in t}
            pack[t["Y"]] = _Dl(outputs[0])
            execute(b, bind_constants(t, pack), workspace, index)

        return Lowering(launch=launch, outputs=1, workspace_bytes=ws_bytes, capturable=True, barrier=True,
                        layouts=self.layouts(sig), versions=versions())


def plan_candidates(cls, name: str, op: str, sig: Signature | None, reason, built,
                    limit: int | None = None) -> list[Candidate]:
    """``cls(name)`` (the heuristic's plan at load time), plus one per plan cuDNN lists for ``sig``
    (the first ``limit`` of them, heuristics A first, when given)."""
    out: list[Candidate] = [cls(name)]
    if sig is None or reason(sig) is not None:
        return out
    return out + [cls(name, (("plan", n),)) for n in plan_keys(sig, built)[:limit]]


def plan_from_key(cls, name: str, key: str) -> Candidate | None:
    """The candidate recorded as ``name`` or ``name:plan=<plan name>``."""
    if key == name:
        return cls(name)
    if key.startswith(name + ":plan="):
        return cls(name, (("plan", key[len(name) + len(":plan="):]),))
    return None


def candidates(op: str, sig: Signature | None = None) -> list[Candidate]:
    """The heuristic candidate, plus one per plan when ``sig`` is given and cuDNN can list them here."""
    if op not in OPS:
        return []
    return plan_candidates(CudnnConv, NAME, op, sig, conv_reason, _graph_for)


def from_key(op: str, key: str) -> Candidate | None:
    return plan_from_key(CudnnConv, NAME, key) if op in OPS else None
