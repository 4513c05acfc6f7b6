#!/usr/bin/env python3
"""Loads a model Ember pruned (or trained) into plain PyTorch: no Ember needed.

Ember writes a folder (train::save_for_pytorch) with
  model.safetensors  every parameter and buffer, in the source library's names
  model.json         {"format": "ember-pytorch-v1", "builder": "torchvision.models.resnet50",
                      "kwargs": {"num_classes": 10}, "example_input": [1, 3, 224, 224]}
The builder (any importable callable that returns an nn.Module) makes the
unpruned network; every Conv1d/2d/3d, BatchNorm, LayerNorm, GroupNorm, Linear
and Embedding whose tensors in the file have other sizes is then rebuilt at
the file's sizes (its other settings kept: stride, padding, groups of a
depthwise conv follow its channels), and the weights load with
load_state_dict(strict=True): a tensor the network lacks or a size the
rebuild cannot explain fails there, by name. From the result, PyTorch's own
tools apply (torch.export.export, torch.onnx.export, torch.compile).

    import ember_pruned                       # tools/pytorch/ on sys.path
    model = ember_pruned.load("run/export")   # eval mode
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


def _builder(path):
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"model.json: builder '{path}' is not a dotted path (torchvision.models.resnet50)")
    return getattr(importlib.import_module(module), name)


def _resized(m, prefix, state):
    """m rebuilt at the sizes of its tensors in `state`, or None when they already fit."""
    w = state.get(prefix + "weight")
    if w is None or w.shape == m.weight.shape:
        return None
    bias = getattr(m, "bias", None) is not None
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        out_c, in_per_group = w.shape[0], w.shape[1]
        depthwise = m.groups == m.in_channels == m.out_channels and m.groups > 1
        groups = out_c if depthwise else m.groups
        return type(m)(in_per_group * groups, out_c, m.kernel_size, stride=m.stride, padding=m.padding,
                       dilation=m.dilation, groups=groups, bias=bias, padding_mode=m.padding_mode)
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return type(m)(w.shape[0], eps=m.eps, momentum=m.momentum, affine=m.affine,
                       track_running_stats=m.track_running_stats)
    if isinstance(m, nn.Linear):
        return nn.Linear(w.shape[1], w.shape[0], bias=bias)
    if isinstance(m, nn.LayerNorm):
        return nn.LayerNorm(tuple(w.shape), eps=m.eps, elementwise_affine=True, bias=bias)
    if isinstance(m, nn.GroupNorm):
        return nn.GroupNorm(m.num_groups, w.shape[0], eps=m.eps, affine=True)
    if isinstance(m, nn.Embedding):
        return nn.Embedding(w.shape[0], w.shape[1], padding_idx=m.padding_idx)
    return None


def build(folder):
    """(model, description) from Ember's export folder; the model in eval mode."""
    folder = Path(folder)
    spec = json.loads((folder / "model.json").read_text())
    if spec.get("format") != FORMAT:
        raise ValueError(f"{folder / 'model.json'}: format {spec.get('format')!r}, expected {FORMAT!r}")
    state = load_file(folder / "model.safetensors")
    model = _builder(spec["builder"])(**spec.get("kwargs", {}))
    rebuilt = []
    for name, m in list(model.named_modules()):
        new = _resized(m, name + "." if name else "", state)
        if new is None:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        rebuilt.append(f"{name}: {tuple(m.weight.shape)} -> {tuple(new.weight.shape)}")
    model.load_state_dict(state, strict=True)
    return model.eval(), rebuilt


def load(folder):
    """The model Ember exported to `folder`, in eval mode."""
    return build(folder)[0]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ember_pruned.py EXPORT_FOLDER")
    model, rebuilt = build(sys.argv[1])
    print(f"{len(rebuilt)} layers rebuilt at the file's sizes; "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    for line in rebuilt:
        print("  " + line)
