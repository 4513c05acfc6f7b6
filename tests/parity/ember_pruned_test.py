#!/usr/bin/env python3
"""tools/pytorch/ember_pruned.py on hand-made export folders (no Ember binary):
  - a builder outside torchvision and timm is refused before anything is read
    or imported, unless trust_builder=True;
  - a depthwise conv with a channel multiplier (groups = inputs, 2 outputs
    each) and a batch norm without affine weights (rebuilt from its running
    statistics) are rebuilt at the file's sizes; the model runs;
  - a tensor the network lacks fails the strict load, by name;
  - a folder of another format is refused.

    python3 tests/parity/ember_pruned_test.py WORK
"""
import json
import shutil
import sys
import types
from pathlib import Path

import torch
from logits_check import check
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "pytorch"))
import ember_pruned  # noqa: E402


def folder(work, name, builder, state, fmt="ember-pytorch-v1"):
    d = work / name
    d.mkdir(parents=True)
    (d / "model.json").write_text(json.dumps({"format": fmt, "builder": builder, "kwargs": {}}))
    if state is not None:
        save_file({k: v.contiguous() for k, v in state.items()}, d / "model.safetensors")
    return d


def refused(what, fn):
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        check(what in str(e), f"refused, but without '{what}': {e}")
        return
    raise AssertionError(f"not refused: expected '{what}'")


def main():
    work = Path(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    refused("is not torchvision's or timm's", lambda: ember_pruned.build(folder(work, "os", "os.system", None)))

    net = types.ModuleType("ember_pruned_test_net")  # a builder of the test's own, trusted explicitly
    net.make = lambda: nn.Sequential(nn.Conv2d(8, 16, 3, groups=8, padding=1), nn.BatchNorm2d(16, affine=False),
                                     nn.ReLU(), nn.Conv2d(16, 4, 1))
    sys.modules[net.__name__] = net
    torch.manual_seed(0)
    full = net.make().state_dict()
    kept = {"0.weight": full["0.weight"][:8], "0.bias": full["0.bias"][:8],  # 4 of 8 inputs, 2 outputs each
            "1.running_mean": full["1.running_mean"][:8], "1.running_var": full["1.running_var"][:8],
            "1.num_batches_tracked": full["1.num_batches_tracked"],
            "3.weight": full["3.weight"][:, :8], "3.bias": full["3.bias"]}
    d = folder(work, "mine", f"{net.__name__}.make", kept)
    refused("trust_builder=True", lambda: ember_pruned.build(d))
    model, rebuilt = ember_pruned.build(d, trust_builder=True)
    conv, norm = model[0], model[1]
    check((conv.in_channels, conv.out_channels, conv.groups) == (4, 8, 4), f"depthwise rebuilt as {conv}")
    check(norm.num_features == 8 and not norm.affine, f"batch norm rebuilt as {norm}")
    check(len(rebuilt) == 3, f"rebuilt {rebuilt}")
    check(model(torch.randn(2, 4, 5, 5)).shape == (2, 4, 5, 5), "the rebuilt model does not run")
    for k, v in kept.items():
        check(torch.equal(model.state_dict()[k], v), f"{k} not loaded")
    print("a depthwise conv with multiplier 2 and a batch norm without weights: rebuilt at the file's sizes")

    extra = dict(kept, **{"4.weight": torch.zeros(3)})
    refused("4.weight", lambda: ember_pruned.build(folder(work, "extra", f"{net.__name__}.make", extra),
                                                   trust_builder=True))
    refused("format", lambda: ember_pruned.build(folder(work, "old", "torchvision.models.resnet18", None, "v0")))
    print("ember_pruned_test: OK")


if __name__ == "__main__":
    main()
