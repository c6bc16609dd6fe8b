"""The lowering-candidate contract shared by the kernels, the profiler and the heuristic.

A *signature* says what one fused node computes (op, shapes, dtypes, attributes, layout); a
*candidate* is one way to compute it (a kernel family plus its tile parameters). Both have a stable
string form: it is what the tuning cache keys on and what is written into the optimized model as the
node's ``lowering`` / ``lowering_params`` attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


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
            if k not in ("lowering", "lowering_params")
        )
        return Signature(op, tuple(None if s is None else tuple(int(d) for d in s) for s in shapes), tuple(dtypes), frozen, layout)

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    def key(self) -> str:
        shapes = ";".join("-" if s is None else _fmt(s) for s in self.input_shapes)
        attrs = ",".join(f"{k}={_fmt(v)}" for k, v in self.attrs)
        return f"{self.op}|{shapes}|{','.join(self.dtypes)}|{attrs}|{self.layout}"


@dataclass(frozen=True)
class Candidate:
    """One lowering: ``name`` picks the kernel family, ``params`` its configuration.

    Subclasses (one per kernel family, in ``graphopt/kernels/<family>.py``) implement ``applies`` and
    ``build``. ``applies`` returns ``None`` when the candidate can run the signature, otherwise the
    reason it cannot (shown in reports). ``build`` compiles for ``arch`` (for example ``"sm_90"``)
    and returns ``launch(inputs, outputs)`` that enqueues the work on the current CUDA stream.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def params_str(self) -> str:
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.params)

    def key(self) -> str:
        p = self.params_str()
        return f"{self.name}:{p}" if p else self.name

    def applies(self, sig: Signature, compute_capability: tuple[int, int]) -> str | None:
        return None

    def source_hash(self) -> str:
        """Hash of the kernel source(s) this candidate compiles; part of the tuning-cache key."""
        return ""

    def build(self, sig: Signature, arch: str) -> Callable[[Sequence[Any], Sequence[Any]], None]:
        raise NotImplementedError(f"candidate {self.key()} has no GPU build")
