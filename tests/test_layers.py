"""The layers of design.md hold: a module imports graphopt code only from its own layer or below,
inside functions too, and the tuner and the runtime never import each other (both stand on
graphopt.lowering). The check is static (the AST of every file), so it needs no import to run."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "graphopt"

# Lowest first. Utilities that import only graphopt.errors sit with it.
LAYERS = [
    {"errors", "files"},
    {"ir", "compare"},  # compare hands onnxruntime a model on disk past 2 GB (ir.io.on_disk)
    {"ops"},
    {"passes", "rewrite"},
    {"lowering"},
    {"kernels", "providers"},
    {"tune", "runtime"},
    {"pipeline", "precision", "output_check"},
    {"api", "cli", "cli_runtime", "cli_display", "cli_checks", "outputs", "_rules"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
APART = [{"tune", "runtime"}]  # same layer, and still neither imports the other


def _unit(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return rel.parts[0]


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        unit = _unit(path, root)
        if unit == "__init__":
            continue  # the package facade may re-export anything
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphopt."):
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("graphopt.")]
            else:
                continue
            for target in targets:
                dep = target.split(".")[1]
                where = f"{path.relative_to(root.parent)}:{node.lineno} imports {target}"
                if unit not in RANK or dep not in RANK:
                    out.append(f"{where}: {unit if unit not in RANK else dep} has no layer in tests/test_layers.py")
                elif RANK[dep] > RANK[unit]:
                    out.append(f"{where}: {dep} is a layer above {unit}")
                elif dep != unit and any({dep, unit} == pair for pair in APART):
                    out.append(f"{where}: {unit} and {dep} must not import each other")
    return out


def test_every_import_follows_the_layers():
    assert violations() == []


def test_the_check_catches_a_wrong_way_import(tmp_path):
    tree = tmp_path / "graphopt"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    victim = tree / "ir" / "graph.py"
    victim.write_text(victim.read_text(encoding="utf-8") + "\n\ndef _bad():\n    from graphopt.tune import select\n")
    (tree / "runtime" / "plan.py").write_text((tree / "runtime" / "plan.py").read_text(encoding="utf-8")
                                              + "\nfrom graphopt.tune.cache import TuningCache\n")
    found = violations(tree)
    assert any("ir/graph.py" in v and "tune is a layer above ir" in v for v in found), found
    assert any("runtime/plan.py" in v and "must not import each other" in v for v in found), found
