"""A fake ``cudnn`` frontend module that records what the providers ask of it, for the CPU tests of
the cuDNN providers (CBR, matmul, SDPA, norms, their channel-padded and NCHW forms): one fake, so each
test reads the same log.

The log holds tuples: ``("pygraph", kwargs)``; ``("tensor", name, dim, stride, data_type,
is_pass_by_value)``; ``(op, {arg: tensor name or value})`` for every graph operation; ``(setter,
tensor name, value...)`` for every ``set_*`` on a tensor (lists for dims and strides); the plan calls;
``("execute", sorted tensor names, plan index)``.
"""

from __future__ import annotations

import types

import numpy as np


class FakeTensor:
    """A cuDNN tensor: records every ``set_*`` call on it and returns itself; ``virtual`` until it is a
    graph input (``tensor``) or marked an output (``set_output(True)``)."""

    def __init__(self, log, name, virtual=True):
        self.log, self.name, self.virtual = log, name, virtual

    def set_output(self, value):
        self.log.append(("set_output", self.name, value))
        self.virtual = not value
        return self

    def __getattr__(self, what):
        if what.startswith("set_"):
            def setter(*values):
                self.log.append((what, self.name) + tuple(list(v) if isinstance(v, (list, tuple)) else v for v in values))
                return self
            return setter
        raise AttributeError(what)


class FakeGraph:
    """A ``cudnn.pygraph``: every operation recorded and answered with its output tensor(s)."""

    OUTPUTS = {"sdpa": 2, "layernorm": 3, "rmsnorm": 2}  # outputs per operation (1 where not listed)
    WORKSPACE_UNIT = 1000  # plan i's workspace is WORKSPACE_UNIT * (i + 1) bytes
    NAMED_BY_OP = False  # an operation's output tensor named after the operation, not its ``name`` argument

    def __init__(self, log, plans, refuse_inference=False, **kw):
        self.log, self.plans, self.refuse, self.phase, self.bound = log, plans, refuse_inference, None, {}
        self.made: list[FakeTensor] = []
        log.append(("pygraph", kw))

    def tensor(self, name, dim, stride, data_type, is_pass_by_value=False):
        self.log.append(("tensor", name, list(dim), list(stride), data_type, is_pass_by_value))
        self.made.append(FakeTensor(self.log, name, virtual=False))
        return self.made[-1]

    def validate(self):
        """Lowers the graph as the frontend's Python graph does: its C++ tensors, by uid (``_cpp_tensors``)."""
        self.log.append(("validate",))
        self._cpp_tensors = {uid: FakeCppTensor(self.log, t) for uid, t in enumerate(self.made)}

    def __getattr__(self, op):
        if op in ("build_operation_graph", "check_support"):
            return lambda *a: self.log.append((op,))
        if op.startswith("_") or op in ("plans",):
            raise AttributeError(op)

        def call(**kw):
            self.log.append((op, {k: (v.name if isinstance(v, FakeTensor) else v) for k, v in kw.items()}))
            self.phase = kw.get("norm_forward_phase", self.phase)
            n, name = self.OUTPUTS.get(op, 1), op if self.NAMED_BY_OP else kw.get("name", op)
            outs = [FakeTensor(self.log, name)] + [FakeTensor(self.log, f"{name}:{i}") for i in range(1, n)]
            self.made.extend(outs)
            return tuple(outs) if n > 1 else outs[0]

        return call

    def create_execution_plans(self, modes):
        self.log.append(("create_execution_plans", modes))

    def get_execution_plan_count(self):
        return 0 if self.refuse and self.phase == "INFERENCE" else len(self.plans)

    def get_plan_name_at_index(self, i):
        return self.plans[i]

    def build_plan_at_index(self, i):
        self.log.append(("build_plan_at_index", i))

    def get_workspace_size_plan_at_index(self, i):
        return self.WORKSPACE_UNIT * (i + 1)

    def execute_plan_at_index(self, pack, ws, i, handle=None):
        self.log.append(("execute", sorted(t.name for t in pack), i))
        # what each tensor was bound to, as NumPy (arrays, or the provider's DLPack wrappers' ``a``)
        self.bound = {t.name: np.array(a) if isinstance(a, np.ndarray) else np.array(getattr(a, "a", a))
                      for t, a in pack.items()}


class FakeCppTensor:
    """A lowered tensor: its virtual flag read from the graph's tensor at validation; ``set_alignment``
    recorded as ``("set_alignment", name, bytes)``."""

    def __init__(self, log, t: FakeTensor):
        self.log, self.name, self.virtual, self.alignment = log, t.name, t.virtual, 16

    def get_is_virtual(self):
        return self.virtual

    def get_is_pass_by_value(self):
        return False

    def get_alignment(self):
        return self.alignment

    def set_alignment(self, n):
        self.log.append(("set_alignment", self.name, n))
        self.alignment = n
        return self


def fake_module(plans, refuse_inference=False, graph=FakeGraph):
    """(a fake ``cudnn`` module whose graphs list ``plans``, the shared call log)."""
    log: list = []
    mod = types.SimpleNamespace(
        data_type=types.SimpleNamespace(HALF="HALF", FLOAT="FLOAT", BFLOAT16="BF16"),
        heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"),
        norm_forward_phase=types.SimpleNamespace(INFERENCE="INFERENCE", TRAINING="TRAINING"),
        pygraph=lambda **kw: graph(log, list(plans), refuse_inference, **kw),
        create_handle=lambda: "handle", set_stream=lambda handle, stream: log.append(("set_stream", stream)),
        backend_version=lambda: 91900, __version__="1.32.0")
    return mod, log
