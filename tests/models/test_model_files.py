"""Every committed ONNX file under models/ is valid and runs; the hand-built ones compute
what they claim.

* For each ``models/**/*.onnx``: ``onnx.checker`` (full) passes, and onnxruntime CPU runs
  it on random inputs of the declared dtypes (symbolic dims: 2 for batch, 16 for
  sequence) with finite outputs of the declared ranks.  Files over 5 MB (the ~20k-node
  GPT-2, about 4 s) are marked ``slow``: deselect them with ``-m "not slow"``.
* ``models/build_samples.py`` is deterministic and the committed files are its output.
* The four hand-built models agree with onnx's reference evaluator (an implementation
  independent of onnxruntime), the transformer block with a float64 NumPy GPT-2 block,
  and their structure contains the patterns the rules must see.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from _scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
SLOW_BYTES = 5 * 1024 * 1024
HAND_BUILT = ["resnet_style.onnx", "mobilenetv2_style.onnx", "transformer_block.onnx",
              "subgraph_if.onnx"]


def model_files() -> list:
    params = []
    for path in sorted(MODELS.rglob("*.onnx")):
        rel = path.relative_to(MODELS).as_posix()
        marks = [pytest.mark.slow] if path.stat().st_size > SLOW_BYTES else []
        params.append(pytest.param(path, id=rel, marks=marks))
    return params


def concrete_dim(dim) -> int:
    """2 for batch-like symbolic dims, 16 for sequence-like ones, 2 for other names."""
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    name = dim.dim_param.lower()
    if "seq" in name or "len" in name:
        return 16
    return 2 if name else 1


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs honoring each graph input's dtype; integer inputs are valid indices.

    Integers are drawn from {0, 1}, valid for any embedding table or token-type input;
    inputs named like ``*mask*`` are all ones so no attention row is fully masked.
    """
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [concrete_dim(d) for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype == np.bool_:
            feeds[vi.name] = np.asarray(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            if "mask" in vi.name.lower():
                feeds[vi.name] = np.ones(shape, dtype=dtype)
            else:
                feeds[vi.name] = np.asarray(rng.integers(0, 2, size=shape), dtype=dtype)
        else:
            feeds[vi.name] = np.asarray(rng.standard_normal(shape), dtype=dtype)
    return feeds


def ort_session(model_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def op_histogram(model: onnx.ModelProto) -> collections.Counter:
    hist: collections.Counter = collections.Counter()

    def walk(graph):
        for node in graph.node:
            hist[node.op_type] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)

    walk(model.graph)
    return hist


# ----------------------------------------------------------------------------------------
# every file
# ----------------------------------------------------------------------------------------

def test_models_folder_has_files():
    names = {p.name for p in MODELS.rglob("*.onnx")}
    assert set(HAND_BUILT) <= names, f"missing in models/: {set(HAND_BUILT) - names}"


@pytest.mark.parametrize("path", model_files())
def test_model_file_checks_and_runs(path: Path, rng):
    data = path.read_bytes()
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) > 0, f"{path.name}: empty graph"
    feeds = random_feeds(model, rng)
    sess = ort_session(data)
    outs = sess.run(None, feeds)
    declared = {o.name: o for o in model.graph.output}
    for meta, value in zip(sess.get_outputs(), outs):
        assert np.all(np.isfinite(value)), f"{path.name}: output {meta.name} has NaN/inf"
        rank = len(declared[meta.name].type.tensor_type.shape.dim)
        assert value.ndim == rank, f"{path.name}: output {meta.name} rank {value.ndim} != {rank}"
        assert value.size > 0, f"{path.name}: output {meta.name} is empty"


# ----------------------------------------------------------------------------------------
# the hand-built samples
# ----------------------------------------------------------------------------------------

def load_build_samples():
    return load_script("models/build_samples.py")


def test_build_samples_deterministic_and_committed(tmp_path):
    bs = load_build_samples()
    first = bs.build_all(str(tmp_path / "a"))
    second = bs.build_all(str(tmp_path / "b"))
    assert sorted(first) == sorted(HAND_BUILT)
    for name in HAND_BUILT:
        assert first[name] == second[name], f"{name}: two builds differ"
        assert (MODELS / name).read_bytes() == first[name], (
            f"models/{name} is stale: rerun `python models/build_samples.py`")


def feeds_for(model, rng, cond=None):
    feeds = random_feeds(model, rng)
    if cond is not None:
        feeds["cond"] = np.array(cond)
    return feeds


@pytest.mark.parametrize("name,cond", [("resnet_style.onnx", None),
                                       ("mobilenetv2_style.onnx", None),
                                       ("transformer_block.onnx", None),
                                       ("subgraph_if.onnx", True),
                                       ("subgraph_if.onnx", False)])
def test_hand_built_match_reference_evaluator(name, cond, rng):
    data = (MODELS / name).read_bytes()
    model = onnx.load_from_string(data)
    feeds = feeds_for(model, rng, cond)
    got = ort_session(data).run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def test_subgraph_if_branches_differ(rng):
    data = (MODELS / "subgraph_if.onnx").read_bytes()
    model = onnx.load_from_string(data)
    sess = ort_session(data)
    x = random_feeds(model, rng)["input"]
    a = sess.run(None, {"input": x, "cond": np.array(True)})[0]
    b = sess.run(None, {"input": x, "cond": np.array(False)})[0]
    assert not np.allclose(a, b)
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    outer = {t.name for t in model.graph.initializer}
    for attr in if_node.attribute:
        sub = attr.g
        assert not sub.initializer, "branch weights must come from the outer scope"
        used = {i for n in sub.node for i in n.input}
        assert used & outer, f"{attr.name} uses no outer-scope weight"
        assert [n.op_type for n in sub.node][0] == "Conv"


def producers(model):
    return {o: n for n in model.graph.node for o in n.output}


def test_resnet_style_structure():
    model = onnx.load(MODELS / "resnet_style.onnx")
    hist = op_histogram(model)
    for op in ["Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool",
               "Flatten", "Gemm"]:
        assert hist[op] > 0, f"resnet_style has no {op}"
    assert model.opset_import[0].version == 17
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    prod = producers(model)
    strided = [n for n in model.graph.node if n.op_type == "Conv" and
               list(next(a.ints for a in n.attribute if a.name == "strides")) == [2, 2]]
    assert len(strided) == 2  # the 3x3 in block 2 and its projection shortcut
    # the residual Adds: one has the (BN) branch first, the other the shortcut first
    orders = []
    for add in (n for n in model.graph.node if n.op_type == "Add"):
        a, b = (prod.get(i) for i in add.input)
        assert next(n for n in model.graph.node if add.output[0] in n.input).op_type == "Relu"
        orders.append((a.op_type, b.op_type))
    assert ("BatchNormalization", "MaxPool") in orders  # Add(branch, identity shortcut)
    assert ("BatchNormalization", "BatchNormalization") in orders  # projection + branch
    proj_add = next(n for n in model.graph.node if n.op_type == "Add" and
                    prod[n.input[0]].op_type == prod[n.input[1]].op_type)
    first_conv = prod[prod[proj_add.input[0]].input[0]]
    w = next(t for t in model.graph.initializer if t.name == first_conv.input[1])
    assert list(w.dims)[2:] == [1, 1], "Add(shortcut, branch): the shortcut is a 1x1 Conv+BN"


def test_mobilenetv2_style_structure():
    model = onnx.load(MODELS / "mobilenetv2_style.onnx")
    hist = op_histogram(model)
    for op in ["Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Mul", "Add", "BatchNormalization"]:
        assert hist[op] > 0, f"mobilenetv2_style has no {op}"
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and
                 next(a.i for a in n.attribute if a.name == "group") > 1]
    inits = {t.name: t for t in model.graph.initializer}
    assert depthwise and all(inits[n.input[1]].dims[1] == 1 for n in depthwise)
    prod = producers(model)
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert all(len(n.input) == 3 for n in clips), "Clip must take min/max as inputs"
    assert any(n.input[1] in prod for n in clips) and any(n.input[1] in inits for n in clips)
    silu = [n for n in model.graph.node if n.op_type == "Mul" and
            any(prod.get(i) is not None and prod[i].op_type == "Sigmoid" for i in n.input)]
    assert silu, "no Sigmoid->Mul (SiLU)"


def test_transformer_block_structure():
    model = onnx.load(MODELS / "transformer_block.onnx")
    hist = op_histogram(model)
    for op in ["ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Erf", "Softmax", "Split", "Reshape",
               "Transpose", "MatMul"]:
        assert hist[op] > 0, f"transformer_block has no {op}"
    assert hist["ReduceMean"] == 4 and hist["Erf"] == 1 and hist["Softmax"] == 1
    assert model.opset_import[0].version == 14
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim[:2]]
    assert dims == ["batch", "seq"]


def gpt2_block_reference(x: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    """float64 NumPy GPT-2 pre-LN block from the model's named initializers."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}

    def ln(v, i):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * w[f"ln_weight_{i}"] + w[f"ln_bias_{i}"]

    def linear(v, i):
        return v @ w[f"linear_w_{i}"] + w[f"bias_{i}"]

    from math import erf, sqrt
    verf = np.vectorize(erf)
    x = x.astype(np.float64)
    bsz, seq, d = x.shape
    heads = 4
    q, k, v = np.split(linear(ln(x, 0), 0), 3, axis=-1)
    split = lambda t: t.reshape(bsz, seq, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    s = split(q) @ split(k).transpose(0, 1, 3, 2) / sqrt(d // heads)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = (p @ split(v)).transpose(0, 2, 1, 3).reshape(bsz, seq, d)
    x = x + linear(ctx, 1)
    h = linear(ln(x, 1), 2)
    h = 0.5 * h * (1.0 + verf(h / sqrt(2.0)))
    return x + linear(h, 3)


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 16), (3, 7)])
def test_transformer_block_is_a_gpt2_block(batch, seq, rng):
    data = (MODELS / "transformer_block.onnx").read_bytes()
    model = onnx.load_from_string(data)
    x = rng.standard_normal((batch, seq, 64)).astype(np.float32)
    got = ort_session(data).run(None, {"input": x})[0]
    want = gpt2_block_reference(x, model)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
