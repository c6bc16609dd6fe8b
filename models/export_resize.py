"""Export a small U-Net-style decoder that upsamples with ``F.interpolate``, to ONNX ``Resize``, with
both torch exporters: nearest by a scale factor, and bilinear to a size read from another tensor's
shape (a Shape -> Slice -> Concat chain in the export). Random weights (seeded), dynamic batch.

Needs its own venv (torch is never a test dependency)::

    /work/venvs/torch/bin/python models/export_resize.py

Writes ``models/resize/unet_upsample_torchscript_op17.onnx`` and ``..._dynamo_op18.onnx``; each is
checked with ``onnx.checker`` (full) and run in onnxruntime against eager torch at a batch other than
the traced one. tests/runtime/test_runtime_resize.py runs them on the graphopt runtime, optimized
and not, against onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent / "resize"


class UNetUp(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.dec = nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        skip = F.relu(self.enc(x))
        low = F.relu(self.down(skip))
        near = F.interpolate(low, scale_factor=2, mode="nearest")
        smooth = F.interpolate(low, size=skip.shape[-2:], mode="bilinear", align_corners=False)
        return self.dec(torch.cat([near + smooth, skip], 1))


def main() -> int:
    OUT.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = UNetUp().eval()
    x = torch.randn(2, 3, 32, 32)
    check = torch.randn(3, 3, 32, 32)
    for exporter, opset in (("torchscript", 17), ("dynamo", 18)):
        path = OUT / f"unet_upsample_{exporter}_op{opset}.onnx"
        kw = dict(dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}) if exporter == "torchscript" else \
            dict(dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}}, external_data=False)
        torch.onnx.export(model, (x,), str(path), opset_version=opset, dynamo=exporter == "dynamo",
                          input_names=["x"], output_names=["y"], **kw)
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": check.numpy()})[0]
        with torch.no_grad():
            want = model(check).numpy()
        err = float(np.abs(got - want).max())
        assert err < 1e-4, (path.name, err)
        print(f"{path.name}: {path.stat().st_size} bytes, max error against torch {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
