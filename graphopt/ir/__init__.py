"""The IR: a networkx-backed ``Graph`` of ``Node``s, and lossless ONNX load/save.

Only this package touches protobufs; everything else works on ``Graph`` through its mutation API.
"""

from graphopt.ir.convert import from_model, to_model
from graphopt.ir.graph import Graph
from graphopt.ir.io import load_model, model_bytes, save_model, serialize
from graphopt.ir.node import Node
from graphopt.ir.shapes import refine_shapes
from graphopt.ir.values import ValueInfo

__all__ = ["Graph", "Node", "ValueInfo", "from_model", "to_model", "load_model", "save_model", "serialize", "model_bytes",
           "refine_shapes"]
