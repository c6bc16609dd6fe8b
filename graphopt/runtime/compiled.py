"""Compile a traced plan: every buffer it owns in one arena, every step a prebuilt closure.

After ``plan.trace`` has run the graph once, everything a run needs to decide is known: each
slot's shape, dtype and strides, which steps write which buffers and when each buffer is last read.
``compile_plan`` uses that to

1. place the outputs of the steps that can write into a given buffer (custom ops running a lowering,
   whose contract is ``launch(inputs, outputs, workspace)``, and the direct standard ops of
   ``DIRECT``: elementwise ufuncs with ``out=``, Transpose as one copy) and every lowering workspace
   in one arena, offsets by liveness (``graphopt.runtime.arena``): one device allocation per plan;
2. rebind those steps to closures over their arena views: a lowering step is its ``launch`` with the
   output and workspace views, the constant inputs already in the lowering's layout, and a layout
   conversion only for the inputs that needed one when traced (or come from the caller);
   shape-only steps (Reshape, Flatten, Squeeze, Unsqueeze) are a ``reshape`` to the traced shape;
3. build the loop ``Plan._fast`` runs: per step the step (its ``run`` is the rebound closure), its
   input slots (a spare slot for omitted inputs), its output slots and the slots to drop.

Graph outputs are never in the arena, nor is any buffer a graph output is a view of (the caller
keeps them after the next run). Steps that cannot write into a given buffer (the other
standard ops, If, fallbacks) allocate from the memory pool as before and are freed by liveness.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.lowering import layout
from graphopt.runtime.onnx_ops.pooling import POOL_OPS, pool_kernel_args
from graphopt.runtime.ordering import drop_needless_barriers
from graphopt.runtime.onnx_ops.registry import OpContext
from graphopt.runtime.arena import Interval, assign, live_peak
from graphopt.runtime.replay import FreshStepReplay, StepReplay

# standard ops computed straight into their arena buffer: op -> (ufunc name, arity)
DIRECT = {"Add": ("add", 2), "Sub": ("subtract", 2), "Mul": ("multiply", 2), "Div": ("true_divide", 2),
          "Relu": ("maximum", 1), "Tanh": ("tanh", 1), "Sqrt": ("sqrt", 1), "Exp": ("exp", 1), "Log": ("log", 1),
          "Abs": ("absolute", 1), "Neg": ("negative", 1), "Floor": ("floor", 1), "Ceil": ("ceil", 1),
          "Sin": ("sin", 1), "Cos": ("cos", 1), "Transpose": ("copyto", 1)}
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _direct(step, arrays, backend, feed_slots):
    """``make(out) -> run`` computing the step straight into ``out`` (an arena view), or None when
    the step is not one of ``DIRECT`` / MatMul / Gemm in a form that allows it."""
    if step.kind != "std" or len(step.outputs) != 1 or step.outputs[0] is None:
        return None
    ins = [arrays[s] if s is not None else None for s in step.inputs]
    out = arrays[step.outputs[0]]
    if step.op in ("MatMul", "Gemm"):
        return _gemm_direct(step, ins, out, backend, feed_slots)
    if step.op in POOL_OPS:
        return _pool_direct(step, ins, out, backend)
    if step.op not in DIRECT or len(ins) != DIRECT[step.op][1] or any(a is None for a in ins):
        return None
    if step.op == "Div" and out.dtype.kind != "f":
        return None  # integer Div truncates: the generic path
    if not all(a.dtype == out.dtype for a in ins):
        return None
    return lambda view: _direct_run(step, view, backend.xp)


def _gemm_direct(step, ins, out, backend, feed_slots):
    """MatMul / Gemm through the backend's GEMM bound once to these shapes (``backend.matmul_into``)."""
    gemm = step.op == "Gemm"
    if len(ins) < 2 or any(a is None for a in ins[:2]) or len(ins) > (3 if gemm else 2):
        return None
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    attr = step.node.attr
    if any(x.dtype != out.dtype for x in (a, b) + ((c,) if c is not None else ())):
        return None
    if gemm and c is not None and float(attr("beta", 1.0)) != 1.0:
        return None
    if not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    ta, tb = (bool(attr("transA", 0)), bool(attr("transB", 0))) if gemm else (False, False)
    run = backend.matmul_into(a, b, ta, tb, float(attr("alpha", 1.0)) if gemm else 1.0, gemm)
    if run is None:
        return None
    xp = backend.xp
    fix = tuple(i for i in (0, 1) if step.inputs[i] in feed_slots)  # a caller's array may be strided
    add = xp.add

    def make(view):
        if c is None and not fix:
            def mm(ins):
                run(ins[0], ins[1], view)
                return [view]

            return mm

        def mm_bias(ins):
            x, y = ins[0], ins[1]
            if fix:
                x, y = xp.ascontiguousarray(x), xp.ascontiguousarray(y)
            run(x, y, view)
            if c is not None:
                add(view, ins[2], out=view)
            return [view]

        return mm_bias

    return make


def _pool_direct(step, ins, out, backend):
    """A pooling node through the backend's pooling kernel, written into the arena view (geometry
    decoded once, here), when that kernel takes it (then the traced output, whose strides the view
    copies, came from the same kernel: the input's layout)."""
    if len(ins) != 1 or ins[0] is None or getattr(backend, "pool", None) is None:
        return None
    x = ins[0]
    ctx = OpContext(backend.xp, step.node, 0, {}, pool=backend.pool)
    args = pool_kernel_args(ctx, x, step.op)
    if args is None:  # traced through the window-slice path: stays generic
        return None
    pool2d, xp = backend.pool.pool2d, backend.xp

    def make(view):
        return lambda ins: [pool2d(xp, ins[0], *args, out=view)]

    return make


def _extent(arr) -> int:
    """Bytes from an array's first element to one past its last (a strided view, such as a ``rowpad``
    output, spans more than its ``nbytes``); 0 when it is empty."""
    if int(getattr(arr, "size", 0)) == 0:
        return 0
    return arr.itemsize + sum((d - 1) * abs(s) for d, s in zip(arr.shape, arr.strides))


def _span(arr) -> int:
    """Bytes an array occupies: its ``nbytes``, or its extent when strided wider (``rowpad``)."""
    return max(int(arr.nbytes), _extent(arr))


def _compact(arr, block_bytes: int) -> bool:
    """Whether ``arr`` is a dense tensor (C order or a permutation of it, as NHWC) alone in its block
    (of ``block_bytes``): then a view with the same shape and strides at an arena offset holds it. The
    block may be larger (CuPy's pool rounds sizes up to 512 bytes)."""
    nbytes = int(getattr(arr, "nbytes", 0))
    if nbytes <= 0 or any(s < 0 for s in arr.strides):
        return False
    return _extent(arr) == nbytes and block_bytes >= nbytes


def compile_plan(plan, arrays: list, backend, blocks: list, block_bytes: list) -> None:  # noqa: C901 - one pass per concern
    """Place the plan's own buffers in one arena and rebind its steps (see the module docstring).
    ``arrays``: the traced slots (metadata only once spent); ``blocks`` / ``block_bytes``: each slot's
    memory-block token and size, as the trace recorded them while the arrays were alive."""
    block_of = blocks
    fixed_blocks = {block_of[s] for _, s in plan.outputs} | {block_of[s] for s, _ in plan.constants} | \
        {block_of[s] for _, s in plan.inputs}
    last_use: dict[Any, int] = {}
    for k, step in enumerate(plan.steps):
        for s in step.inputs + step.outputs:
            if s is not None:
                last_use[block_of[s]] = k
    seen = set(fixed_blocks)
    feed_slots = {s for _, s in plan.inputs}
    makers: dict[int, Any] = {}  # step index -> make(out view) -> run, for the direct standard ops
    intervals: list[Interval] = []
    placed: dict[int, list] = {}  # step index -> [(output index, slot or None, array)]
    for k, step in enumerate(plan.steps):
        lowered = getattr(step.run, "lowered", None)
        fresh = [s is None or (block_of[s] not in seen and _compact(arrays[s], block_bytes[s])) for s in step.outputs]
        for s in step.outputs:
            if s is not None:
                seen.add(block_of[s])
        direct = None if lowered is not None else _direct(step, arrays, backend, feed_slots)
        if lowered is None and direct is None:
            continue
        if not all(fresh):
            continue
        outs = []
        for j, s in enumerate(step.outputs):
            like = arrays[s] if s is not None else lowered.empty_like(j, backend.xp)
            end = last_use[block_of[s]] if s is not None else k
            # an unnamed output in its declared layout may be strided (rowpad): the view spans its extent
            intervals.append(Interval(("out", k, j), _span(like), k, end))
            outs.append((j, s, like))
        if lowered is not None:
            for j in range(len(step.outputs), lowered.n_out):  # outputs the node does not name
                like = lowered.empty_like(j, backend.xp)
                intervals.append(Interval(("out", k, j), _span(like), k, k))
                outs.append((j, None, like))
            if lowered.workspace_bytes:
                intervals.append(Interval(("ws", k), int(lowered.workspace_bytes), k, k))
        placed[k] = outs
        if direct is not None:
            makers[k] = direct
    offsets, total = assign(intervals)
    plan.arena_offsets, plan.arena_intervals, plan.arena_bytes = offsets, intervals, total
    plan.arena_live_bytes = live_peak(intervals)
    # workspaces in the arena, plus those of lowered steps left outside it (their output is a graph
    # output, or a view of one): those keep the workspace allocated when the step was built
    unplaced = [getattr(s.run, "lowered", None) for k, s in enumerate(plan.steps) if k not in placed]
    plan.workspace_bytes = sum(iv.size for iv in intervals if iv.key[0] == "ws") + sum(
        int(lw.workspace_bytes or 0) for lw in unplaced if lw is not None)
    arena = backend.arena_alloc(total) if total else None
    plan.arena = arena

    drop_needless_barriers(plan, arrays, block_of, set(makers), feed_slots, DIRECT, POOL_OPS, RESHAPES)
    replay = bool(getattr(backend, "step_graphs", False))  # eager runs replay each step's own CUDA graph
    n = plan.n_slots
    template: list[Any] = [None] * (n + 2)  # n: always None (omitted inputs); n + 1: a sink for unnamed outputs
    for slot, arr in plan.constants:
        template[slot] = arr
    arena_blocks = set()
    # slots whose array (so its address) is the same every run: constants, arena views and the
    # reshapes of those; every other slot (feeds, pool-allocated outputs) may move between runs
    stable = {slot for slot, _ in plan.constants} | {n}
    loop = []
    for k, step in enumerate(plan.steps):
        run = step.run
        ins = tuple(n if s is None else s for s in step.inputs)
        lowered = getattr(step.run, "lowered", None)
        if k in placed:
            views = [(j, s, backend.arena_view(arena, offsets[("out", k, j)], like)) for j, s, like in placed[k]]
            for _, s, v in views:
                if s is not None:
                    template[s] = v
                    arena_blocks.add(block_of[s])
            if lowered is not None:
                ws = backend.arena_view_bytes(arena, offsets[("ws", k)], lowered.workspace_bytes) \
                    if lowered.workspace_bytes else None
                check = _to_check(step, lowered, arrays, feed_slots)
                out_views = [v for _, _, v in views]
                ins = _lowered_ins(step, lowered, template, n)
                # input conversions run inside the step (and so inside its recorded graph: one replay
                # does the transposes and the launch), so a replay is keyed by the unconverted inputs
                run = _converting(_lowering_run(lowered, out_views, ws), check, lowered, backend)
                if replay and _replayable(step, lowered):
                    run = StepReplay(run, out_views, backend.cupy, _moving(ins, stable, n))
            else:
                run = makers[k](views[0][2])
                if replay and step.capture is None:
                    run = StepReplay(run, [views[0][2]], backend.cupy, _moving(ins, stable, n))
            stable.update(s for _, s, _ in views if s is not None)
        elif lowered is not None:
            # a lowering writing a graph output (or a view of one): new output arrays every run, the
            # rest bound once as for the arena steps
            check = _to_check(step, lowered, arrays, feed_slots)
            alloc, plan.fresh_bytes[k] = _output_alloc(lowered, backend.xp)
            ins = _lowered_ins(step, lowered, template, n)
            convert = _conversion(check, lowered, backend)
            if replay and _replayable(step, lowered):
                run = FreshStepReplay(_launch_into(lowered, lowered.workspace, convert), alloc, backend.cupy,
                                      _moving(ins, stable, n))
            else:
                run = _converting(_fresh_run(lowered, alloc, lowered.workspace), check, lowered, backend)
        elif step.kind == "std" and step.op in RESHAPES and step.outputs and step.outputs[0] is not None:
            shape = tuple(arrays[step.outputs[0]].shape)
            run = _reshape_run(shape)
            ins = ins[:1]
            if ins[0] in stable and block_of[step.outputs[0]] == block_of[step.inputs[0]]:
                stable.add(step.outputs[0])  # a view of a fixed buffer (a reshape that copies is a new array each run)
        step.run = run
        outs = tuple(n + 1 if s is None else s for s in step.outputs)
        free = tuple(s for s in step.free if block_of[s] not in arena_blocks)
        loop.append((step, ins, outs, free))
    plan.loop = loop
    plan.template = template


class Lowered:
    """What a custom step running a lowering needs to be rebound (``backend.custom_step`` attaches it
    to the step's run function as ``run.lowered``)."""

    def __init__(self, lowering, key: str, fixed: dict, out_shape: tuple, out_dtype, n_in: int, n_out: int,
                 workspace=None):
        self.lowering, self.key, self.fixed, self.workspace = lowering, key, fixed, workspace
        self.out_shape, self.out_dtype, self.n_in, self.n_out = tuple(out_shape), out_dtype, n_in, n_out
        self.launch = lowering.launch
        self.workspace_bytes = int(lowering.workspace_bytes or 0)

    def empty_like(self, j: int, xp):
        """Output ``j``'s buffer as the lowering declares it (shape, dtype, layout strides)."""
        return layout.empty(self.out_shape, self.out_dtype, self.lowering.output_layout(self.n_in, j) or "NCHW", xp)


def _to_check(step, lowered, arrays, feed_slots) -> tuple:
    """The inputs a lowered step converts to its declared layout every run: the caller's feeds, and
    those that were in another layout when traced (a region's edge); constants were converted once."""
    return tuple(i for i, s in enumerate(step.inputs)
                 if s is not None and i not in lowered.fixed
                 and (s in feed_slots or not layout.is_layout(arrays[s], lowered.lowering.input_layout(i) or "NCHW")))


def _lowered_ins(step, lowered, template: list, n: int) -> tuple:
    """A lowered step's input slots, its constants (already in the lowering's layout) in slots of their own."""
    return tuple(_fixed_slot(template, lowered.fixed.get(i)) if i in lowered.fixed else
                 (n if s is None else s) for i, s in enumerate(step.inputs))


def _moving(ins: tuple, stable: set, n: int) -> tuple:
    """The positions of the inputs whose address may change between runs (a replay's key): those
    not in ``stable``. Slots past the plan's own (``n + 1``) are the constants ``_fixed_slot`` added:
    they never move. (An input the step converts is keyed by the address it is converted from.)"""
    return tuple(i for i, s in enumerate(ins) if s <= n + 1 and s not in stable)


def _replayable(step, lowered) -> bool:
    return step.capture is None and bool(getattr(lowered.lowering, "capturable", False))


def _output_alloc(lowered, xp):
    """``(alloc, nbytes)``: ``alloc() -> outputs``, new arrays in the lowering's declared shapes, dtype
    and layouts (shapes and layouts decided here, once), and the bytes one call allocates."""
    specs = [lowered.empty_like(j, xp) for j in range(lowered.n_out)]
    nbytes = sum(_span(a) for a in specs)
    if all(a.flags.c_contiguous for a in specs):
        shapes = [(tuple(a.shape), a.dtype) for a in specs]
        empty = xp.empty
        return (lambda: [empty(shape, dtype) for shape, dtype in shapes]), nbytes
    return (lambda: [lowered.empty_like(j, xp) for j in range(lowered.n_out)]), nbytes


def _fixed_slot(template: list, arr) -> int:
    """A new slot at the end of ``template`` holding ``arr`` (a constant input already in the lowering's layout)."""
    template.append(arr)
    return len(template) - 1


def _fresh_run(lowered, alloc, ws):
    launch = lowered.launch

    def run(ins):
        outs = alloc()
        launch(ins, outs, ws)
        return outs

    return run


def _launch_into(lowered, ws, convert=None):
    """``run((ins, outs))``: the launch writing ``outs`` (``FreshStepReplay``'s step), after
    ``convert(ins)`` (``_conversion``) when the step converts inputs."""
    launch = lowered.launch
    if convert is None:
        return lambda a: launch(a[0], a[1], ws)

    def run(a):
        launch(convert(a[0]), a[1], ws)

    return run


def _lowering_run(lowered, outs: list, ws):
    launch = lowered.launch

    def run(ins):
        launch(ins, outs, ws)
        return outs

    return run


def _conversion(check: tuple, lowered, backend):
    """``convert(ins) -> list``: the inputs with those at ``check`` put into the lowering's declared
    layouts (a copy only for an input not already in it, by the backend's ``to_layout``), in a new
    list (a step replay keeps the list it recorded with: it must still name the unconverted inputs);
    None when there are none."""
    if not check:
        return None
    xp, to_layout, input_layout = backend.xp, backend.to_layout, lowered.lowering.input_layout
    conv = tuple((i, input_layout(i) or "NCHW") for i in check)

    def convert(ins):
        ins = list(ins)
        for i, lay in conv:
            ins[i] = to_layout(ins[i], lay, xp)
        return ins

    return convert


def _converting(run, check: tuple, lowered, backend):
    """``run`` after ``_conversion``'s conversions; ``run`` itself when there are none."""
    convert = _conversion(check, lowered, backend)
    if convert is None:
        return run
    return lambda ins: run(convert(ins))


def _direct_run(step, out, xp):
    name, arity = DIRECT[step.op]
    if step.op == "Transpose":
        perm = step.node.attr("perm", None)
        copyto = xp.copyto

        def transpose(ins):
            x = ins[0]
            copyto(out, x.transpose(perm if perm is not None else tuple(range(x.ndim))[::-1]))
            return [out]

        return transpose
    fn = getattr(xp, name)
    perm = layout.channels_last_perm(out)
    if perm is not None:  # a channels-last buffer: every operand walked in its memory order, as traced
        return _direct_in_order(fn, step, out, perm)
    if step.op == "Relu":
        zero = out.dtype.type(0)
        return lambda ins: [fn(ins[0], zero, out=out)]
    if arity == 1:
        return lambda ins: [fn(ins[0], out=out)]
    return lambda ins: [fn(ins[0], ins[1], out=out)]


def _direct_in_order(fn, step, out, perm):
    """``_direct_run`` into a channels-last ``out``: the ufunc gets the channels-last views of the
    operands and of ``out`` (C-contiguous, so one flat loop), not NCHW-ordered strided ones."""
    target = out.transpose(perm)
    extra = (out.dtype.type(0),) if step.op == "Relu" else ()  # Relu is maximum(x, 0)

    def run(ins):
        fn(*(layout.permuted(a, perm) for a in ins), *extra, out=target)
        return [out]

    return run


def _reshape_run(shape: tuple):
    return lambda ins: [ins[0].reshape(shape)]


_ = np  # NumPy dtypes flow through the arrays above
