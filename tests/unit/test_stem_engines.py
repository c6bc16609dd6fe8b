"""bench/stem_engines.py on the CPU: the signature it builds cuDNN's graph from is the bare convolution
``cudnn_split`` lists plans for, and its report renders every kind of row it can collect (timed plans of
both sources sorted, refusals counted, the notes' barred plans, the append check), so a device call does
not find out by a traceback after its measurements."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import stem_engines as se  # noqa: E402
from graphopt.providers import cudnn_split  # noqa: E402


def test_the_probed_graph_is_the_bare_convolution_of_each_stem():
    for name, (xs, w, s, p, _act, _extra) in se.STEMS.items():
        sig = cudnn_split.conv_only(se.cbr_sig((32,) + xs, w, s, p, "Relu", {}, "float16", bias=False))
        assert cudnn_split.split_reason(se.cbr_sig((32,) + xs, w, s, p, "Relu", {}, "float16")) is None, name
        assert len(sig.input_shapes) == 2 and "activation" not in dict(sig.attrs), name


def test_the_report_renders_every_kind_of_row(tmp_path):
    header = {"gpu": "NVIDIA H200", "date": "2026-12-07", "command": "python3 bench/stem_engines.py --out x"}
    row = {
        "layer": "r50.stem", "bs": 32, "dtype": "float16",
        "torch_kernels": {"sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc": {"count": 20, "mean_us": 84.1}},
        "torch_plan": {"function": "cudnnBackendExecute", "engine_id": 31, "knobs": {"TILE_SIZE": 2}, "log_bytes": 9000},
        "torch_plan_on_graphopt_graph": [
            {"engine": 31, "knobs": "torch's knobs", "name": "eng31_k2=2", "us": 61.0, "max_rel_err": 4e-4, "workspace": 0},
            {"engine": 31, "knobs": "default knobs", "refused": "CUDNN_STATUS_NOT_SUPPORTED"},
        ],
        "graphopt_plan_log": {"engine_id": 31, "knobs": {"TILE_SIZE": 2}},
        "frontend_alignment": {"alignments": [16]},
        "descriptor_diff": ["--- torch", "+++ graphopt", "-    alignmentInBytes: type=int64_t; val=32;",
                            "+    alignmentInBytes: type=int64_t; val=16;"],
        "offered_by_graphopt": ["eng47_k2=2"],
        "barred_by_note": {"REDUCED_PRECISION_REDUCTION": ["eng12_k2=1"], "WINOGRAD_TILE_4x4": "not in this frontend"},
        "heuristics_unfiltered": [
            {"mode": "A", "index": 0, "name": "eng47_k2=2", "barred": False, "us": 192.4, "max_rel_err": 4e-4, "workspace": 0},
            {"mode": "A", "index": 1, "name": "eng12_k2=1", "barred": True, "us": 85.0, "max_rel_err": 6e-3, "workspace": 1024},
            {"mode": "B", "refused": "no plan"},
        ],
        "engines": [
            {"engine_count": 3, "appends": {"heuristic_a": 2, "engines_added": 3, "after": 5, "names": []}},
            {"engine": 0, "name": "eng0", "us": 3251.2, "max_rel_err": "nan", "workspace": 0},
            {"engine": 1, "refused": "not supported"},
            {"engine": 2, "skipped": "budget"},
        ],
    }
    se._write(str(tmp_path), "h200", header, [row])
    md = (tmp_path / "stem_engines_h200.md").read_text()
    timed = [line for line in md.splitlines() if line.startswith("| heur") or line.startswith("| engine")]
    assert [line.split("|")[3].strip() for line in timed] == ["85.0", "192.4", "3251.2"]  # fastest first
    assert "Engines refused: 1 of 3." in md and "eng12_k2=1" in md and "heuristic_a" in md
    assert "84.1 us x20" in md
    assert 'engine 31 knobs {"TILE_SIZE": 2}' in md and "`eng31_k2=2` 61.0 us" in md
    assert "default knobs: refused: CUDNN_STATUS_NOT_SUPPORTED" in md
    assert 'byte alignment for graphopt\'s graph: {"alignments": [16]}' in md
    assert "```diff\n--- torch" in md and "+    alignmentInBytes: type=int64_t; val=16;" in md
    assert json.loads((tmp_path / "stem_engines_h200.json").read_text())["rows"][0]["layer"] == "r50.stem"


def test_a_torch_config_is_built_with_its_knobs_mapped_to_the_frontends_enum():
    built, aligned = [], []

    class Graph:
        def create_execution_plan(self, eid, knobs):
            built.append((eid, dict(knobs)))

        def check_support(self):
            if not built[-1][1]:
                raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED\nmore")

        def get_plan_name_at_index(self, i):
            return f"eng{built[-1][0]}"

    class Probe:
        class mod:
            class knob_type:
                TILE_SIZE = "kt-tile"

        def graph(self, alignment=None):
            aligned.append(alignment)
            return Graph(), {}

        def run_plan(self, g, t, i):
            return {"us": 60.0, "max_rel_err": 1e-4, "workspace": 0}

    rows = se.try_torch_config(Probe(), {"engine_id": 31, "knobs": {"TILE_SIZE": 2, "NOT_A_KNOB": 1}}, alignments=(None, 32))
    assert built == [(31, {"kt-tile": 2}), (31, {"kt-tile": 2}), (31, {})] and aligned == [None, 32, None]
    assert rows[0]["us"] == 60.0 and rows[0]["unknown_knobs"] == ["NOT_A_KNOB"]
    assert rows[1]["knobs"] == "torch's knobs, 32-byte tensors"
    assert rows[2]["refused"] == "CUDNN_STATUS_NOT_SUPPORTED"
    assert se.try_torch_config(Probe(), {"algo": "X"}) == []


def test_a_child_that_cannot_run_torch_is_an_error_row_not_a_traceback():
    got = se.torch_plan("r50.stem", 1, timeout=120)  # no GPU here (and maybe no torch): the child fails
    assert set(got) == {"error"} and got["error"].startswith("child exit"), got


def test_the_descriptor_diff_of_two_executions():
    base = ["I! CuDNN (v91900 56) function cudnnBackendExecute() called:",
            "i!     xDesc: type=CUDNN_BACKEND_TENSOR_DESCRIPTOR:", "i!         alignmentInBytes: type=int64_t; val=32;",
            "i!         uid: type=int64_t; val=120;"]
    other = [base[0], base[1], base[2].replace("32", "16"), base[3].replace("120", "7")]
    diff = se.descriptor_diff(base, other)
    assert [d for d in diff if d[:1] in "+-" and d[:3] not in ("---", "+++")] == [
        "-         alignmentInBytes: type=int64_t; val=32;", "+         alignmentInBytes: type=int64_t; val=16;"]
    assert se.descriptor_diff(base, base) == []


def test_lowered_tensors_are_the_graphs_pointer_tensors():
    from graphopt.providers import cudnn

    class T:
        def __init__(self, virtual, align, by_value=False):
            self.virtual, self.align, self.by_value = virtual, align, by_value

        def get_is_virtual(self):
            return self.virtual

        def get_is_pass_by_value(self):
            return self.by_value

        def get_alignment(self):
            return self.align

    class G:
        _cpp_tensors = {1: T(False, 16), 2: T(True, 4), 3: T(False, 16), 4: T(False, 8, by_value=True)}

    assert len(cudnn.lowered_tensors(G())) == 2
    assert cudnn.lowered_tensors(object()) == []

    class P:
        def graph(self, alignment=None):
            return G(), {}

    assert se.default_alignment(P()) == {"alignments": [16]}
