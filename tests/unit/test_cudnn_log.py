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


REAL = pathlib.Path(__file__).parent / "data" / "cudnn_api_torch_stem_h100.log"


def test_the_real_log_of_torchs_stem_convolution():
    """cuDNN 9.19 as torch 2.11 logged ResNet-50's stem at bs32 fp16 on an H100: the execute block, its
    Internal twin and the return records (status only) that follow each."""
    text = REAL.read_text()
    got = cudnn_log.last_execution(text)
    assert got["function"] == "cudnnBackendExecute"
    assert got["engine_id"] == 47
    assert got["knobs"] == {"TILE_SIZE": 2, "LDGA": 0, "TILEK": 2, "STAGES": 0, "LDGC": 1}
    assert {"cudnnBackendExecute", "cudnnBackendExecuteInternal"} <= set(cudnn_log.functions(text))


def test_descriptors_drop_what_differs_between_processes():
    lines = cudnn_log.last_execution(REAL.read_text())["lines"]
    desc = cudnn_log.descriptor(lines)
    assert not any("addr=" in d or "Time:" in d or "uid:" in d or "deviceName" in d for d in desc)
    assert any("alignmentInBytes: type=int64_t; val=32;" in d for d in desc)
    assert any("strideA: type=int; val=[150528,1,672,3];" in d for d in desc)
    other = [line.replace("val=32;", "val=16;") for line in lines]
    changed = [a for a, b in zip(desc, cudnn_log.descriptor(other)) if a != b]
    assert len(changed) == 3  # X, W and Y's alignment: the diff shows what a reader needs, nothing volatile


def test_the_chosen_configuration_is_the_one_executed_most_once_settled():
    """A benchmark-mode process times several plans (each up to 100 times), then runs the one it keeps on
    every call: the configuration executed most among the last ``settled`` executions is that one, even when
    a benchmarked plan ran more often overall or another plan's execute comes last; ties go to the latest;
    every configuration is listed with its count."""
    text = (EXECUTE.format(eid=40) * 6 + EXECUTE.format(eid=63) + FINALIZE + EXECUTE.format(eid=63)
            + EXECUTE.format(eid=63) + EXECUTE.format(eid=47))
    got = cudnn_log.chosen_execution(text, settled=4)
    assert got["engine_id"] == 63 and got["function"] == "cudnnBackendExecute"
    assert [(e["engine_id"], e["count"]) for e in got["executions"]] == [(40, 6), (63, 3), (47, 1)]
    assert cudnn_log.last_execution(text)["engine_id"] == 47
    tie = EXECUTE.format(eid=40) + EXECUTE.format(eid=47)
    assert cudnn_log.chosen_execution(tie)["engine_id"] == 47
    assert cudnn_log.chosen_execution(FINALIZE) == {}
    legacy = cudnn_log.chosen_execution(LEGACY + LEGACY)
    assert legacy["executions"] == [{"engine_id": None, "knobs": {}, "algo": "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM", "count": 2}]
