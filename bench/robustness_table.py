"""Run the robustness suite (tests/robustness) and write bench/results/robustness.md's table.

Usage: PYTHONPATH=. python bench/robustness_table.py
Counts pytest outcomes per test file (one file per issue-6 category) from a JUnit XML report.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "r.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/robustness", f"--junitxml={xml}"], cwd=ROOT)
        rows: dict[str, Counter] = {}
        for tc in ET.parse(xml).getroot().iter("testcase"):
            cat = tc.get("classname", "").split(".")[-1]
            c = rows.setdefault(cat, Counter())
            c["tried"] += 1
            if tc.find("failure") is None and tc.find("error") is None and tc.find("skipped") is None:
                c["handled"] += 1
    lines = ["| category (test file) | cases tried | handled |", "|---|---|---|"]
    for cat, c in sorted(rows.items()):
        lines.append(f"| {cat} | {c['tried']} | {c['handled']} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
