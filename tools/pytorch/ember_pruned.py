#!/usr/bin/env python3
"""Loads a model Ember pruned (or trained) into plain PyTorch: no Ember needed.

Ember writes a folder (train::save_for_pytorch) with
  model.safetensors  every parameter and buffer, in the source library's names
  model.json         {"format": "ember-pytorch-v1", "builder": "torchvision.models.resnet50",
                      "kwargs": {"num_classes": 10}, "example_input": [1, 3, 224, 224]}
The builder makes the unpruned network: a callable of torchvision or timm
(model.json is data: another module's callable runs only with
trust_builder=True, as it would run that module's code); every Conv1d/2d/3d, BatchNorm, LayerNorm, GroupNorm, Linear
and Embedding whose tensors in the file have other sizes is then rebuilt at
the file's sizes (its other settings kept: stride, padding, groups of a
depthwise conv follow its channels), and the weights load with
load_state_dict(strict=True): a tensor the network lacks or a size the
rebuild cannot explain fails there, by name. From the result, PyTorch's own
tools apply (torch.export.export, torch.onnx.export, torch.compile).

    import ember_pruned                       # tools/pytorch/ on sys.path
    model = ember_pruned.load("run/export")   # eval mode; trust_builder=True for other builders
    python3 tools/pytorch/ember_pruned.py run/export    # prints the rebuilt layers
"""
import importlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

FORMAT = "ember-pytorch-v1"
TRUSTED = ("torchvision.", "timm.")


def _builder(path, trust_builder):
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"model.json: builder '{path}' is not a dotted path (torchvision.models.resnet50)")
    if not path.startswith(TRUSTED) and not trust_builder:
        raise ValueError(f"model.json: builder '{path}' is not torchvision's or timm's; importing it runs its "
                         "module's code: pass trust_builder=True if you trust this folder")
    return getattr(importlib.import_module(module), name)


def _resized(m, prefix, state):
    """m rebuilt at the sizes of its tensors in `state`, or None when they already fit."""
    if isinstance(m, nn.modules.batchnorm._BatchNorm):  # by its weight, or its statistics without one
        t = state.get(prefix + "weight", state.get(prefix + "running_mean"))
        if t is None or t.shape[0] == m.num_features:
            return None
        return type(m)(t.shape[0], eps=m.eps, momentum=m.momentum, affine=m.affine,
                       track_running_stats=m.track_running_stats)
    w = state.get(prefix + "weight")
    if w is None or getattr(m, "weight", None) is None or w.shape == m.weight.shape:
        return None
    bias = getattr(m, "bias", None) is not None
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        out_c, in_per_group = w.shape[0], w.shape[1]
        # depthwise (groups = in channels, k outputs each): its groups follow its channels
        depthwise = m.groups > 1 and m.groups == m.in_channels and m.out_channels % m.in_channels == 0
        groups = out_c // (m.out_channels // m.in_channels) if depthwise else m.groups
        return type(m)(in_per_group * groups, out_c, m.kernel_size, stride=m.stride, padding=m.padding,
                       dilation=m.dilation, groups=groups, bias=bias, padding_mode=m.padding_mode)
    if isinstance(m, nn.Linear):
        return nn.Linear(w.shape[1], w.shape[0], bias=bias)
    if isinstance(m, nn.LayerNorm):
        return nn.LayerNorm(tuple(w.shape), eps=m.eps, elementwise_affine=True, bias=bias)
    if isinstance(m, nn.GroupNorm):
        return nn.GroupNorm(m.num_groups, w.shape[0], eps=m.eps, affine=True)
    if isinstance(m, nn.Embedding):
        return nn.Embedding(w.shape[0], w.shape[1], padding_idx=m.padding_idx)
    return None


def build(folder, trust_builder=False):
    """(model, the layers rebuilt) from Ember's export folder; the model in eval mode."""
    folder = Path(folder)
    spec = json.loads((folder / "model.json").read_text())
    if spec.get("format") != FORMAT:
        raise ValueError(f"{folder / 'model.json'}: format {spec.get('format')!r}, expected {FORMAT!r}")
    builder = _builder(spec["builder"], trust_builder)  # refused before anything is read or run
    state = load_file(folder / "model.safetensors")
    model = builder(**spec.get("kwargs", {}))
    rebuilt = []
    for name, m in list(model.named_modules()):
        new = _resized(m, name + "." if name else "", state)
        if new is None:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        rebuilt.append(f"{name}: {type(m).__name__} rebuilt at the file's sizes")
    model.load_state_dict(state, strict=True)
    return model.eval(), rebuilt


def load(folder, trust_builder=False):
    """The model Ember exported to `folder`, in eval mode."""
    return build(folder, trust_builder)[0]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ember_pruned.py EXPORT_FOLDER")
    model, rebuilt = build(sys.argv[1])
    print(f"{len(rebuilt)} layers rebuilt at the file's sizes; "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    for line in rebuilt:
        print("  " + line)
