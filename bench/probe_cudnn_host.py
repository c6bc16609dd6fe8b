"""Host cost of one cuDNN CBR execute, three ways (issue 15, item 2: at most 15 us of host time per node).

    python3 bench/probe_cudnn_host.py OUT.json

On one ResNet-50 layer (bs1, fp16, 3x3, 64 channels, 56x56, bias + relu) through graphopt's cuDNN
provider (heuristic plan):

- ``lowering``: the provider's ``Lowering.launch`` as the runtime calls it (variant pack of ``_Dl``
  wrappers, ``execute_plan_at_index``);
- ``int_pointers``: the frontend's public ``execute_plan_at_index`` with raw device pointers (ints)
  in the variant pack instead of DLPack wrappers;
- ``replay``: the same launch captured once into a CUDA graph on a side stream, then replayed with
  ``Graph.launch`` (valid while the pointers do not change, as in a compiled plan's arena).

Each: host microseconds per call (enqueue only, the GPU kept busy by a spin kernel first so that
nothing waits), median of 5 rounds of 200 calls; and the device result of each way compared with
the first, so a faster way that computes something else is caught.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import datetime, timezone


def main(out: str) -> int:
    import cupy
    import numpy as np

    from graphopt.kernels.timing import _spin_kernel
    from graphopt.lowering.contract import Signature
    from graphopt.providers import cudnn as cd

    sig = Signature.make("CBR", [(1, 64, 56, 56), (64, 64, 3, 3), (64,)], ["float16"] * 3,
                         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "activation": "Relu"})
    low = cd.CudnnConv("cudnn").build(sig, "sm_90")
    rs = cupy.random.RandomState(0)
    x = low.conform([rs.standard_normal(s, dtype=cupy.float32).astype(cupy.float16) for s in sig.input_shapes], cupy)
    y = low.empty_outputs(3, [(1, 64, 56, 56)], cupy.float16, cupy)
    ws = cupy.empty(max(1, low.workspace_bytes), dtype=cupy.uint8)
    b = cd._graph_for(sig)
    index, _ = cd.plan_at(b, None, sig)
    t = b.tensors
    mod = cd._load()
    handle = cd._handle(mod)
    stream = cupy.cuda.get_current_stream()
    spin = _spin_kernel()

    def lowering():
        low.launch(x, y, ws)

    int_pack = {t["X"]: x[0].data.ptr, t["W"]: x[1].data.ptr, t["B"]: x[2].data.ptr, t["Y"]: y[0].data.ptr}

    def int_pointers():
        mod.set_stream(handle=handle, stream=stream.ptr)
        b.graph.execute_plan_at_index(int_pack, ws.data.ptr, index, handle=handle)

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        lowering()
        side.synchronize()
        side.begin_capture()
        lowering()
        graph = side.end_capture()

    def replay():
        graph.launch(stream)

    res: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                 "cudnn": dict(cd.versions()), "cupy": cupy.__version__, "signature": sig.key(), "ways": {}}
    ref = None
    for name, fn in (("lowering", lowering), ("int_pointers", int_pointers), ("replay", replay)):
        row: dict = {}
        try:
            y[0][...] = cupy.nan
            fn()
            stream.synchronize()
            got = cupy.asnumpy(y[0]).astype(np.float64)
            if ref is None:
                ref = got
            row["same_result"] = bool(np.array_equal(np.nan_to_num(got, nan=1e9), np.nan_to_num(ref, nan=1e9)))
            rounds = []
            for _ in range(5):
                spin((1,), (1,), (np.int64(20_000_000),))  # ~10 ms of GPU work: the queue never blocks
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                rounds.append((time.perf_counter() - t0) / 200 * 1e6)
                stream.synchronize()
            row["host_us_per_call"] = round(statistics.median(rounds), 2)
            row["rounds_us"] = [round(r, 2) for r in rounds]
        except Exception as exc:  # noqa: BLE001 - recorded; the next way still runs
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        res["ways"][name] = row
        print(name, row, flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
