"""Can cuDNN plan builds run in parallel threads? (issue 20, item 6: cold tuning in 60 s)

    python3 bench/probe_cudnn_build.py OUT.json

For two ResNet-50 layers at bs32 fp16 (3x3 64->64 at 56x56, 1x1 256->64 at 56x56, bias + relu), the
graph's plans (heuristics A + fallback, ``check_support``) are built one by one on a fresh graph,
then again on another fresh graph from a pool of 8 threads (``build_plan_at_index`` per index). The
wall times say whether the frontend releases the GIL while building; each built plan is then
executed once to see that a thread-built plan runs.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone


def main(out: str) -> int:
    import cupy

    from graphopt.lowering.contract import Signature
    from graphopt.providers import cudnn as cd

    mod = cd._load()
    handle = cd._handle(mod)
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cudnn": dict(cd.versions()), "layers": []}
    for shapes, kw in (([(32, 64, 56, 56), (64, 64, 3, 3), (64,)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
                       ([(32, 256, 56, 56), (64, 256, 1, 1), (64,)], {"kernel_shape": [1, 1]})):
        sig = Signature.make("CBR", shapes, ["float16"] * 3, dict(kw, activation="Relu"))
        row: dict = {"signature": sig.key()}
        for mode in ("serial", "threads8"):
            graph, tensors = cd.conv_graph(mod, handle, sig)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([mod.heur_mode.A, mod.heur_mode.FALLBACK])
            graph.check_support()
            n = graph.get_execution_plan_count()
            errors: list[str] = []

            def build(i):
                try:
                    graph.build_plan_at_index(i)
                    return True
                except Exception as exc:  # noqa: BLE001 - recorded
                    errors.append(f"{i}: {type(exc).__name__}: {str(exc)[:120]}")
                    return False

            t0 = time.perf_counter()
            if mode == "serial":
                ok = [build(i) for i in range(n)]
            else:
                with ThreadPoolExecutor(8) as pool:
                    ok = list(pool.map(build, range(n)))
            wall = time.perf_counter() - t0
            ran = 0
            x = cupy.zeros((32, 56, 56, shapes[0][1]), dtype=cupy.float16)  # NHWC memory, logical NCHW
            for i in range(n):
                if not ok[i]:
                    continue
                try:
                    ws = cupy.empty(max(1, int(graph.get_workspace_size_plan_at_index(i))), dtype=cupy.uint8)
                    w = cupy.zeros(shapes[1][0] * shapes[1][1] * shapes[1][2] * shapes[1][3], dtype=cupy.float16)
                    b = cupy.zeros(shapes[2][0], dtype=cupy.float16)
                    y = cupy.empty(32 * 64 * 56 * 56, dtype=cupy.float16)
                    pack = {tensors["X"]: cd._Dl(x), tensors["W"]: cd._Dl(w), tensors["B"]: cd._Dl(b), tensors["Y"]: cd._Dl(y)}
                    cd.execute(cd._Built(graph, tensors, [], set()), pack, ws, i)
                    cupy.cuda.get_current_stream().synchronize()
                    ran += 1
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"run {i}: {type(exc).__name__}: {str(exc)[:120]}")
            row[mode] = {"plans": n, "built": sum(ok), "build_s": round(wall, 3), "ran": ran, "errors": errors[:5]}
            print(sig.key()[:60], mode, row[mode], flush=True)
        res["layers"].append(row)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
