"""The lowering contract shared by every provider (own kernels, cuDNN, cuBLASLt), the tuner and the runtime.

A *signature* says what one fused node computes (op, shapes, dtypes, attributes, layout); a
*candidate* is one way to compute it (a kernel family plus its tile parameters). Both have a stable
string form: it is what the tuning cache keys on and what is written into the optimized model as the
node's ``lowering`` / ``lowering_params`` attributes. ``build`` returns a :class:`Lowering`: the launch
function plus everything the tuner and the runtime must know about it without asking by name
(workspace, capture, layouts, the outputs it fills, library versions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from graphopt.lowering import layout


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(_fmt(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass(frozen=True)
class Signature:
    """What a fused node computes, independent of how: the profiler times each signature once."""

    op: str
    input_shapes: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    layout: str = "NCHW"

    @staticmethod
    def make(op: str, shapes: Sequence, dtypes: Sequence[str], attrs: Mapping[str, Any], layout: str = "NCHW") -> "Signature":
        frozen = tuple(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in sorted(attrs.items())
            if not k.startswith("lowering")
        )
        return Signature(op, tuple(None if s is None else tuple(int(d) for d in s) for s in shapes), tuple(dtypes), frozen, layout)

    def attr(self, name: str, default: Any = None) -> Any:
        return self._attr_map.get(name, default)

    @functools.cached_property
    def _attr_map(self) -> dict[str, Any]:
        # built once: a warm ResNet-50 selection asked 25,000 attributes (every candidate's applies)
        return dict(self.attrs)

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        # Built once per signature: selection asks it five times a node (cache, memo, layouts) and
        # formatting it was 0.05 s of selecting 590 nodes under cProfile. The fields never change.
        shapes = ";".join("-" if s is None else _fmt(s) for s in self.input_shapes)
        attrs = ",".join(f"{k}={_fmt(v)}" for k, v in self.attrs)
        return f"{self.op}|{shapes}|{','.join(self.dtypes)}|{attrs}|{self.layout}"


@dataclass(frozen=True)
class Candidate:
    """One lowering: ``name`` picks the kernel family, ``params`` its configuration.

    Subclasses (one per kernel family, in ``graphopt/kernels/<family>.py``) implement ``applies`` and
    ``build``; ``key()`` and ``params_str()`` are formatted once from ``name`` and ``params`` (the
    fields are frozen) and are not meant to be overridden: a family that wants another spelling
    says so through its ``params``. ``applies`` returns ``None`` when the candidate can run the signature, otherwise the
    reason it cannot (shown in reports). ``build`` compiles for ``arch`` (for example ``"sm_90"``)
    and returns ``launch(inputs, outputs)`` that enqueues the work on the current CUDA stream.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    def param(self, key: str, default: Any = None) -> Any:
        return self._param_map.get(key, default)

    @functools.cached_property
    def _param_map(self) -> dict[str, Any]:
        return dict(self.params)  # built once (the tile accessors ask six parameters a check)

    def params_str(self) -> str:
        return self._strings[1]

    def key(self) -> str:
        return self._strings[0]

    @functools.cached_property
    def _strings(self) -> tuple[str, str]:
        # (key, params string), formatted once per candidate: listing ResNet-50's 25 signatures asked
        # for 20,000 keys (the earned-place filter, the cache lookup, the layouts) and formatting them
        # was 0.4 s of a 2.1 s warm optimize under cProfile. A frozen candidate's fields never change.
        p = ",".join(f"{k}={_fmt(v)}" for k, v in self.params)
        return (f"{self.name}:{p}" if p else self.name), p

    def applies(self, sig: Signature, compute_capability: tuple[int, int]) -> str | None:
        return None

    def source_hash(self) -> str:
        """Hash of the kernel source(s) this candidate compiles; part of the tuning-cache key."""
        return ""

    # Whether every ``launch`` of this family ends with one of graphopt's own kernels, launched
    # normally (no programmatic dependent launch, no early release of its dependents), for every
    # non-empty shape: then stream order is whole after it and the next lowering's barrier is not
    # needed (``Lowering.ordinary``). Set by the families whose launch is own NVRTC kernels only; a
    # family that calls a library (cuBLAS through ``graphopt.kernels.blas``, cuDNN) leaves it False.
    ordinary_launch: ClassVar[bool] = False

    def build(self, sig: Signature, arch: str) -> "Lowering | Callable[[Sequence[Any], Sequence[Any]], None]":
        """A :class:`Lowering` (or, for simple families, a bare ``launch(inputs, outputs)``: see
        :func:`as_lowering`); callers go through :func:`build_lowering`."""
        raise NotImplementedError(f"candidate {self.key()} has no GPU build")

    def versions(self) -> tuple[tuple[str, str], ...]:
        """Library versions this candidate's result depends on (cuDNN, cuBLAS): part of the cache key."""
        return ()

    def same_as(self, sig: Signature) -> str | None:
        """The key of another candidate for ``sig`` that runs exactly what this one runs (a vendor's
        "heuristic's first plan" is one of the plans it lists), or None. The profiler builds, checks
        and times such a pair once, under the other key."""
        return None

    def layouts(self, sig: Signature) -> tuple[str, ...]:
        """The ``layouts`` that ``build(sig)``'s :class:`Lowering` declares, known without building
        (no GPU): the tuner counts layout conversions with it. ``()``: C-contiguous everywhere."""
        return ()


#: Byte alignment of each part a lowering lays out in its workspace (a library's own workspace, the operands it
#: copies or pads there): what cuBLAS, cuDNN and 16-byte vector loads want.
WORKSPACE_ALIGN = 256


def workspace_offset(n: int) -> int:
    """``n`` bytes rounded up to ``WORKSPACE_ALIGN``: where the next part of a workspace starts."""
    return -(-int(n) // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


@dataclass
class Lowering:
    """A built candidate: ``launch(inputs, outputs, workspace)`` enqueues on the current stream.

    - ``outputs``: how many of the op's outputs it fills, in order (a SkipLayerNorm kernel that
      writes the kept sum fills 2); a node with more outputs than that runs another implementation.
    - ``workspace_bytes``: scratch device memory ``launch`` needs; the runtime allocates it once per
      node (and counts it), the profiler per candidate. ``workspace`` is None when it is 0.
    - ``capturable``: whether ``launch`` may run under CUDA-graph stream capture.
    - ``layouts``: the layout of each input then each output (``NCHW``, ``NHWC``, ``rowmajor``,
      ``colmajor`` for a constant, ``rowpad``; see ``graphopt.lowering.layout``), or ``()`` for
      "C-contiguous everywhere". The runtime and the
      checker hand ``launch`` its inputs in these layouts and allocate its outputs in them. Outputs
      are read after the inputs a node actually has, so a slot for an optional trailing input (a
      CBR's bias and residual, a GemmAct's bias) repeats the first output's layout: a node that omits
      the input then finds its output's layout there (1-D and absent inputs are the same in any layout).
    - ``versions``: library versions that belong in the tuning-cache key.
    - ``barrier``: whether ``launch`` must be preceded by a stream barrier
      (:mod:`graphopt.lowering.barrier`): its library may start a kernel before the previous one on
      the stream has finished (programmatic dependent launch). Set by the cuDNN and cuBLASLt
      providers; ``launch`` then enqueues the barrier itself, so the checker and the timer run (and
      time) it; ``unordered_launch`` is the launch without it. The runtime uses that one only right
      after an ordinary launch (``graphopt.runtime.ordering``), where the barrier orders nothing.
    - ``ordinary``: every launch ends with one of graphopt's own kernels launched normally (it starts
      only when everything before it on the stream is complete and releases nothing early), for
      every non-empty shape: a barrier right after it adds nothing. Declared through
      ``Candidate.ordinary_launch``; False (the safe answer) for anything that calls a library.

    Calling the object as ``lowering(inputs, outputs)`` allocates its workspace on first use (the
    profiler's and the tests' way to run it).
    """

    launch: Callable[[Sequence[Any], Sequence[Any], Any], None]
    outputs: int = 1
    workspace_bytes: int = 0
    capturable: bool = True
    layouts: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()
    barrier: bool = False
    ordinary: bool = False
    unordered_launch: Any = field(default=None, init=False, repr=False)  # launch without the barrier (set below)
    _workspace: Any = field(default=None, repr=False)
    _built: Any = field(default=None, repr=False)  # what build() returned, when as_lowering wrapped it

    def __post_init__(self) -> None:
        self.unordered_launch = self.launch
        if self.barrier:
            self.launch = _OrderedLaunch(self.launch)

    def __getattr__(self, name: str) -> Any:
        # attributes of a wrapped launch object (test fakes carry their behaviour on it)
        built = self.__dict__.get("_built")
        if built is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(built, name)

    @property
    def needs_barrier(self) -> bool:
        """Whether the barrier still runs before the launch: declared, and not measured unneeded."""
        return self.barrier and getattr(self.launch, "needed", None) is not False

    def input_layout(self, i: int) -> str:
        return self.layouts[i] if i < len(self.layouts) else ""

    def output_layout(self, n_inputs: int, i: int) -> str:
        return self.input_layout(n_inputs + i)

    def conform(self, inputs: Sequence[Any], xp: Any) -> list:
        """``inputs`` stored in the declared layouts (a no-op for those that already are); inputs
        with no declared layout are made C-contiguous."""
        return [None if a is None else layout.to_layout(a, self.input_layout(i) or "NCHW", xp)
                for i, a in enumerate(inputs)]

    def empty_outputs(self, n_inputs: int, shapes: Sequence[Sequence[int]], dtype: Any, xp: Any) -> list:
        """Output buffers of the given logical shapes in the declared output layouts."""
        return [layout.empty(s, dtype, self.output_layout(n_inputs, i) or "NCHW", xp) for i, s in enumerate(shapes)]

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
        if self.workspace_bytes and self._workspace is None:
            import cupy

            self._workspace = cupy.empty(int(self.workspace_bytes), dtype=cupy.uint8)
        return self.launch(inputs, outputs, self._workspace)  # (a fake launch in tests returns its time)


class _OrderedLaunch:
    """``launch`` after the stream barrier. With ``GRAPHOPT_MEASURE_BARRIERS=1`` (read when the lowering
    is built) the first eager call also measures whether the launch may start early at all
    (``graphopt.lowering.early_start``); ``needed`` is then False where it cannot, and later calls leave
    the barrier out. ``needed``: None until measured (and always without the variable), True or False
    after. The modules are bound once here: this runs before every vendor launch."""

    def __init__(self, launch: Callable[[Sequence[Any], Sequence[Any], Any], None]):
        from graphopt.lowering import barrier, early_start

        self.launch, self.needed = launch, None
        self._barrier = barrier  # looked up per call: a test or bench may patch barrier.barrier
        self._measure = early_start.starts_early if early_start.enabled() else None

    def __call__(self, inputs, outputs, workspace):
        if self.needed is not False:
            self._barrier.barrier()
        result = self.launch(inputs, outputs, workspace)
        if self.needed is None and self._measure is not None:
            self.needed = self._measure(self.launch, inputs, outputs, workspace)
        return result


def build_lowering(cand: Any, sig: Signature, arch: str) -> Lowering:
    """``cand.build(sig, arch)`` as a :class:`Lowering`, with the family's ``ordinary_launch`` declared
    on it (the runtime, the profiler and the benchmarks all build through here). ``cand`` may be any
    object with ``build`` (a user's family need not subclass :class:`Candidate`)."""
    low = as_lowering(cand.build(sig, arch))
    if getattr(cand, "ordinary_launch", False):
        low.ordinary = True
    return low


def as_lowering(built: Any) -> Lowering:
    """``build()``'s result as a :class:`Lowering`: a bare ``launch(inputs, outputs)`` callable is one
    output, no workspace, capturable."""
    if isinstance(built, Lowering):
        return built
    if not callable(built):
        raise TypeError(f"build() must return a Lowering or a launch(inputs, outputs) callable, got {type(built).__name__}")
    return Lowering(launch=lambda inputs, outputs, workspace: built(inputs, outputs), _built=built)
