"""A lowering and torch's call each timed as a model places them: right after an ordinary launch.

Why: the tables time a node by repeating it back to back in a CUDA graph. For a cuDNN lowering that
repeats its stream barrier before every call (the previous call is a library launch that may start
early), where the runtime drops it after an ordinary launch (``graphopt.runtime.ordering``: after a
LayerNorm, a transpose, any own kernel). Back to back, torch's call overlaps the previous one's tail
(programmatic dependent launch) where in a model it follows some other kernel. Placing both after the
same ordinary launch (one empty own kernel, launched normally, releasing nothing early: the runtime's
condition for dropping the barrier) times each as it runs in a model, and the comparison alike.

``placed_pair`` captures ``reps`` x [lead kernel, graphopt's launch without its barrier] in one CUDA
graph (CuPy), ``reps`` x [lead kernel, torch's call] in another (``torch.cuda.graph``), and ``reps``
lead kernels alone; then replays them in turns, ``rounds`` times, each replay between CUDA events.
The inputs rotate over copies covering 128 MiB (no call finds them in L2), shared by both (CuPy views
of torch's tensors). Reported: each graph's median per call, the lead's, and the median over rounds of
graphopt's replay time over torch's (paired: the two replays a moment apart, the machine in one state).
"""

from __future__ import annotations


def placed_pair(low, torch_fn, tensors, reps: int = 20, rounds: int = 15, rotate_bytes: int = 128 << 20,
                max_sets: int = 16) -> dict:
    """See the module docstring. ``low``: a built :class:`~graphopt.lowering.Lowering` of one output
    shaped like ``tensors[0]``; ``torch_fn(*tensors)``: torch's call; ``tensors``: torch CUDA tensors."""
    import cupy
    import torch

    from graphopt.kernels.timing import median
    from graphopt.lowering.early_start import marker_kernel
    from lowering_bench import torch_graph, torch_replay_ms

    per_set = max(1, sum(t.numel() * t.element_size() for t in tensors))
    n_sets = max(1, min(max_sets, -(-rotate_bytes // per_set)))
    tsets = [list(tensors)] + [[t.clone() for t in tensors] for _ in range(n_sets - 1)]
    torch.cuda.synchronize()
    csets = [([cupy.asarray(t) for t in ts] + [None], [cupy.empty(tuple(ts[0].shape), dtype=cupy.asarray(ts[0]).dtype)])
             for ts in tsets]
    ws = cupy.empty(int(low.workspace_bytes), dtype=cupy.uint8) if low.workspace_bytes else None
    lead = marker_kernel()  # an empty own kernel, launched normally
    launch = low.unordered_launch

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(3):  # warm-up: plan choice, lazy loading
            lead((1,), (1,), ())
            launch(*csets[i % n_sets], ws)
        stream.synchronize()
        graphs = {}
        for name, with_node in (("graphopt", True), ("lead", False)):
            stream.begin_capture()
            try:
                for i in range(reps):
                    lead((1,), (1,), ())
                    if with_node:
                        launch(*csets[i % n_sets], ws)
            finally:
                graphs[name] = stream.end_capture()
            graphs[name].launch(stream)
        stream.synchronize()

    def torch_run(i):
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            lead((1,), (1,), ())
        return torch_fn(*tsets[i % n_sets])

    tgraph, held = torch_graph(torch_run, reps)

    def cupy_ms(graph):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with stream:
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    ours, theirs, leads = [], [], []
    for _ in range(rounds):
        ours.append(cupy_ms(graphs["graphopt"]))
        theirs.append(torch_replay_ms(tgraph))
        leads.append(cupy_ms(graphs["lead"]))
    del held
    us = lambda xs: round(median(xs) * 1e3 / reps, 2)  # noqa: E731
    return {"graphopt_placed_us": us(ours), "torch_placed_us": us(theirs), "lead_us": us(leads),
            "placed_ratio_paired": round(median([a / b for a, b in zip(ours, theirs)]), 4),
            "reps": reps, "rounds": rounds, "sets": n_sets}
