"""Real architectures for ``poolfold bench --models``, exported by ``torch.onnx.export``.

torch is optional and imported here only, when a zoo model is first built.  The networks are
written out by hand in the shape of torchvision's (the PyPI torchvision wheel does not import
on a CPU-only machine), with random weights, float32, exported at opset 18 into a cache folder
(``$POOLFOLD_ZOO_CACHE``, else ``~/.cache/poolfold/zoo``), never into the source tree; a model
already exported there is loaded as it is.

- ``resnet18``: one MaxPool (3x3, stride 2, pad 1) between the Conv stem and the residual stages.
- ``googlenet``: 13 ceil-mode MaxPools (stem, the inception branches, between stages).
- ``squeezenet1_0``: 3 ceil-mode MaxPools between Fire modules.
- ``vgg11``: 5 MaxPools and a 500 MB classifier (its weights stored as external data, which
  ``prepare`` must not copy per stretch).
- ``unfold-fold``: ``nn.Unfold -> scale -> nn.Fold``, one Col2Im.

(MaxPool with Indices -> MaxUnpool is the bundled SegNet-style model: torch 2.13's tracer
fails on ``nn.MaxUnpool2d``.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

OPSET = 18


def cache_folder() -> Path:
    folder = os.environ.get("POOLFOLD_ZOO_CACHE") or Path.home() / ".cache" / "poolfold" / "zoo"
    return Path(folder)


def _resnet18(nn):
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers), (1, 3, 224, 224)


def _googlenet(nn):
    import torch

    def conv(cin, cout, k, **kw):
        return nn.Sequential(nn.Conv2d(cin, cout, k, bias=False, **kw),
                             nn.BatchNorm2d(cout, eps=0.001), nn.ReLU(inplace=True))

    class Inception(nn.Module):
        def __init__(self, cin, c1, c3r, c3, c5r, c5, pp):
            super().__init__()
            self.b1 = conv(cin, c1, 1)
            self.b2 = nn.Sequential(conv(cin, c3r, 1), conv(c3r, c3, 3, padding=1))
            self.b3 = nn.Sequential(conv(cin, c5r, 1), conv(c5r, c5, 3, padding=1))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv(cin, pp, 1))

        def forward(self, x):
            return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)

    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
    net = nn.Sequential(
        conv(3, 64, 7, stride=2, padding=3), pool(),
        conv(64, 64, 1), conv(64, 192, 3, padding=1), pool(),
        Inception(192, 64, 96, 128, 16, 32, 32), Inception(256, 128, 128, 192, 32, 96, 64),
        pool(),
        Inception(480, 192, 96, 208, 16, 48, 64), Inception(512, 160, 112, 224, 24, 64, 64),
        Inception(512, 128, 128, 256, 24, 64, 64), Inception(512, 112, 144, 288, 32, 64, 64),
        Inception(528, 256, 160, 320, 32, 128, 128),
        nn.MaxPool2d(2, 2, ceil_mode=True),
        Inception(832, 256, 160, 320, 32, 128, 128), Inception(832, 384, 192, 384, 48, 128, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, 1000))
    return net, (1, 3, 224, 224)


def _squeezenet1_0(nn):
    import torch

    class Fire(nn.Module):
        def __init__(self, cin, squeeze, e1, e3):
            super().__init__()
            self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
            self.e1 = nn.Sequential(nn.Conv2d(squeeze, e1, 1), nn.ReLU(inplace=True))
            self.e3 = nn.Sequential(nn.Conv2d(squeeze, e3, 3, padding=1), nn.ReLU(inplace=True))

        def forward(self, x):
            x = self.squeeze(x)
            return torch.cat([self.e1(x), self.e3(x)], 1)

    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
    net = nn.Sequential(
        nn.Conv2d(3, 96, 7, 2), nn.ReLU(inplace=True), pool(),
        Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128), pool(),
        Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
        Fire(384, 64, 256, 256), pool(), Fire(512, 64, 256, 256),
        nn.Dropout(0.5), nn.Conv2d(512, 1000, 1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return net, (1, 3, 224, 224)


def _vgg11(nn):
    layers, cin = [], 3
    for item in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, item, 3, padding=1), nn.ReLU(inplace=True)]
            cin = item
    layers += [nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 7 * 7, 4096),
               nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
               nn.Dropout(), nn.Linear(4096, 1000)]
    return nn.Sequential(*layers), (1, 3, 224, 224)


def _unfold_fold(nn):
    class UnfoldFold(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.unfold = nn.Unfold(4, stride=2, padding=1)
            self.fold = nn.Fold((64, 64), 4, stride=2, padding=1)

        def forward(self, x):
            return self.fold(self.unfold(self.conv(x)) * 0.25)

    return UnfoldFold(), (1, 3, 64, 64)


ARCHITECTURES: dict[str, Callable] = {
    "resnet18": _resnet18,
    "googlenet": _googlenet,
    "squeezenet1_0": _squeezenet1_0,
    "vgg11": _vgg11,
    "unfold-fold": _unfold_fold,
}


def path(name: str) -> Path:
    """The model's .onnx file, exported into :func:`cache_folder` on first use."""
    target = cache_folder() / f"{name}.onnx"
    if target.exists():
        return target
    import torch
    from torch import nn

    torch.manual_seed(0)
    module, shape = ARCHITECTURES[name](nn)
    module.eval()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial.onnx")
    with torch.no_grad():
        torch.onnx.export(module, (torch.randn(shape),), str(partial), opset_version=OPSET,
                          input_names=["x"], output_names=["y"], dynamo=False)
    model = onnx.load(str(partial))
    for leftover in partial.parent.glob(partial.name + "*"):
        leftover.unlink()
    large = sum(t.ByteSize() for t in model.graph.initializer) > 100 * 2**20
    onnx.save(model, str(target), save_as_external_data=large,
              location=f"{name}.onnx.data" if large else None)
    return target


def model(name: str) -> tuple[str, dict]:
    """(path, feeds) for a zoo model: a fixed random input of its shape."""
    file = path(name)
    graph_input = onnx.load(str(file), load_external_data=False).graph.input[0]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return str(file), {graph_input.name: x}
