"""Per-bucket lowering dispatch (``lowering_buckets``) and the lowering key a node runs with."""

from __future__ import annotations

import json

import pytest

from graphopt.runtime import select_bucket
from graphopt.runtime.ops_custom import lowering_key

BUCKETS = [
    {"dims": {"batch": 1, "seq": 128}, "lowering": "direct", "params": ""},
    {"dims": {"batch": 8, "seq": 128}, "lowering": "implicit_gemm", "params": "bm=64,bn=64"},
    {"dims": {"batch": 32, "seq": 128}, "lowering": "cublas_ws", "params": ""},
]


@pytest.mark.parametrize("dims, want", [
    ({"batch": 1}, "direct"), ({"batch": 2}, "implicit_gemm"), ({"batch": 8}, "implicit_gemm"),
    ({"batch": 9, "seq": 16}, "cublas_ws"), ({"batch": 32, "seq": 128}, "cublas_ws"),
    ({"batch": 64}, "cublas_ws"),  # larger than every bucket: the last
    ({"batch": 4, "seq": 4096}, "cublas_ws"),  # seq past every bucket: the last
    ({"batch": 4, "other": 4096}, "implicit_gemm"),  # a dim the buckets do not name does not count
    ({}, "direct"),  # nothing bound: the first bucket (its dims cannot be compared)
])
def test_first_bucket_covering_every_dim_else_the_last(dims, want):
    assert select_bucket(BUCKETS, dims)["lowering"] == want
    assert select_bucket(json.dumps(BUCKETS), dims)["lowering"] == want  # the attribute's JSON text too


def test_a_dim_past_one_bucket_moves_to_the_next_even_if_another_dim_fits():
    buckets = [{"dims": {"batch": 8, "seq": 64}, "lowering": "a", "params": ""},
               {"dims": {"batch": 8, "seq": 512}, "lowering": "b", "params": ""},
               {"dims": {"batch": 64, "seq": 512}, "lowering": "c", "params": ""}]
    assert select_bucket(buckets, {"batch": 2, "seq": 65})["lowering"] == "b"
    assert select_bucket(buckets, {"batch": 9, "seq": 10})["lowering"] == "c"


def test_empty_or_malformed_buckets_are_refused_naming_the_node():
    with pytest.raises(ValueError, match="non-empty"):
        select_bucket([], {"batch": 1})
    with pytest.raises(ValueError, match="node 'cbr_3': .*not valid JSON"):
        lowering_key(_Node("cbr_3", lowering_buckets="[{"), {})
    with pytest.raises(ValueError, match="node 'cbr_3': .*non-empty JSON list"):
        lowering_key(_Node("cbr_3", lowering_buckets=json.dumps({"lowering": "x"})), {})


class _Node:
    def __init__(self, name="n", **attrs):
        self.name, self._attrs = name, attrs

    def attr(self, key, default=None):
        return self._attrs.get(key, default)


def test_lowering_key_prefers_buckets_then_the_plain_attributes():
    node = _Node(lowering="direct", lowering_params="", lowering_buckets=json.dumps(BUCKETS))
    assert lowering_key(node, {"batch": 4}) == "implicit_gemm:bm=64,bn=64"
    assert lowering_key(node, {"batch": 1}) == "direct"
    assert lowering_key(_Node(lowering="mma_gemm", lowering_params="bm=128"), {}) == "mma_gemm:bm=128"
    assert lowering_key(_Node(lowering="cublas_ws"), {"batch": 3}) == "cublas_ws"
    assert lowering_key(_Node(), {"batch": 3}) is None
