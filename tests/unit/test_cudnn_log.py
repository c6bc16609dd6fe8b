"""bench/cudnn_log.py: the configuration a process last executed, read from cuDNN's API log (the format cuDNN
8 and 9 print at ``CUDNN_LOGLEVEL_DBG=3``), so the stem probe's device call names torch's engine and knobs."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import cudnn_log  # noqa: E402

FINALIZE = """I! CuDNN (v91900) function cudnnBackendFinalize() called:
i!     descriptor: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
i!         engine_id: type=int; val=12;
i!             CUDNN_KNOB_TYPE_TILE_SIZE: type=int; val=9;
i! Time: 2026-12-07T09:30:00.000000 (0d+0h+0m+2s since start)
"""

EXECUTE = """I! CuDNN (v91900) function cudnnBackendExecute() called:
i!     handle: type=cudnnHandle_t; streamId=0x0;
i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
i!         opGraph: type=CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
i!             engine_id: type=int; val=3;
i!         engineCfg: type=CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
i!             engine: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:
i!                 engine_id: type=int; val={eid};
i!             knobChoices: type=cudnnBackendDescriptor_t:
i!                 CUDNN_KNOB_TYPE_TILE_SIZE: type=int; val=2;
i!                 CUDNN_KNOB_TYPE_SPLIT_K_SLC: type=int; val=-1;
i! Time: 2026-12-07T09:30:01.000000 (0d+0h+0m+3s since start)
"""

LEGACY = """I! CuDNN (v91900) function cudnnConvolutionForward() called:
i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (1);
"""


def test_the_last_execute_names_its_engine_and_knobs():
    text = "preamble\n" + FINALIZE + EXECUTE.format(eid=40) + FINALIZE + EXECUTE.format(eid=47) + FINALIZE
    got = cudnn_log.last_execution(text)
    assert got["function"] == "cudnnBackendExecute"
    assert got["engine_id"] == 47  # the engine config's, not the graph's nor an earlier plan's
    assert got["knobs"] == {"TILE_SIZE": 2, "SPLIT_K_SLC": -1}
    assert cudnn_log.functions(text) == {"cudnnBackendFinalize": 3, "cudnnBackendExecute": 2}


def test_a_legacy_call_gives_its_algorithm_and_no_engine():
    got = cudnn_log.last_execution(FINALIZE + LEGACY)
    assert got["function"] == "cudnnConvolutionForward" and "engine_id" not in got
    assert got["algo"] == "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM"


def test_no_execution_gives_nothing():
    assert cudnn_log.last_execution(FINALIZE) == {}
    assert cudnn_log.last_execution("") == {}
    assert cudnn_log.blocks("no header here\n") == []
