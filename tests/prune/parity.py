"""Parity: Ember's structured pruner (C++) vs Torch-Pruning (DepGraph, Python).

The driver prunes each model with Ember (group importance L1 or L2, local
ranking, step(ratio), round_to 1) and writes its dense weights, its pruned weights (with
the plan in the metadata) and an input/output pair of the pruned model. Here
each model is built again in PyTorch with the same parameter names, loaded
with the dense weights and pruned by Torch-Pruning's MetaPruner with
GroupMagnitudeImportance(p), pruning_ratio, the classifier ignored, for every
setting in SETTINGS (L1 at 0.5, L2 at 0.5, L1 at 0.25, L2 at 0.75). Checked,
per model and setting:

  1. Torch-Pruning's pruned state_dict equals Ember's pruned file exactly (keys,
     shapes, values: the same channels kept, in the same order), both with the
     importance Ember computes (sum over the group, no normalizer) and with
     Torch-Pruning's defaults (mean over the group, divided by its mean: the same
     ranking within a group).
  2. The plan in the file's metadata, replayed on the dense weights, gives the
     pruned file.
  3. The model built in PyTorch at the pruned sizes (read from the file's
     shapes) loads the file with strict=True and reproduces Ember's output.

    python parity.py DRIVER OUT_DIR [MODEL...]

What is not compared, and so not claimed: global ranking, round_to > 1,
max_ratio, iterative steps, the norm-scale, Taylor and random criteria.

Torch-Pruning scores in float32, Ember in float64: with these seeds the
smallest gap between the last removed and the first kept unit's score is 1.7e-4
of the score, far above float32 rounding (a sum of n nonnegative terms is
within n x eps32 of itself, and a group here sums a few hundred), so the
comparison cannot flip on a tie.

MODEL defaults to the parity set, and then the KNOWN_DIFFERENCES models (where
the two tools define pruning differently) run too, at L1 0.5, and must still
differ: a difference that disappears fails the test, so the list (and
docs/pruning.md) is updated. Naming models runs only those, in every setting.
"""
import copy
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_pruning as tp
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import EPS32, bound, forward_reduction_length  # noqa: E402

PARITY_SET = ["residual", "mixed_plain", "dense_concat"]
# (importance, p of GroupMagnitudeImportance, pruning ratio). The ratios keep
# n (1 - ratio) exactly representable, so both tools keep the same count.
SETTINGS = [("l1", 1, 0.5), ("l2", 2, 0.5), ("l1", 1, 0.25), ("l2", 2, 0.75)]


# Models, mirroring tests/prune/models.h and parity_models.h. WIDTHS: the output
# channels of each independently prunable layer (defaults = the dense model);
# the others follow from the couplings (a residual add, a concat, a flatten).

class ResidualNet(nn.Module):
    WIDTHS = {"stem": 8, "a1": 8, "b1": 16, "b2": 16}  # a2 = stem (residual); short_conv = b2

    def __init__(self, w=WIDTHS):
        super().__init__()
        s, a, b, c = w["stem"], w["a1"], w["b1"], w["b2"]
        self.stem, self.stem_bn = nn.Conv2d(3, s, 3, padding=1, bias=False), nn.BatchNorm2d(s)
        self.a1, self.a1_bn = nn.Conv2d(s, a, 3, padding=1, bias=False), nn.BatchNorm2d(a)
        self.a2, self.a2_bn = nn.Conv2d(a, s, 3, padding=1, bias=False), nn.BatchNorm2d(s)
        self.b1, self.b1_bn = nn.Conv2d(s, b, 3, padding=1, stride=2, bias=False), nn.BatchNorm2d(b)
        self.b2, self.b2_bn = nn.Conv2d(b, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.short_conv, self.short_bn = nn.Conv2d(s, c, 1, stride=2, bias=False), nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 5)

    def forward(self, x):
        h = F.relu(self.stem_bn(self.stem(x)))
        h = F.relu(h + self.a2_bn(self.a2(F.relu(self.a1_bn(self.a1(h))))))
        h = F.relu(self.short_bn(self.short_conv(h)) + self.b2_bn(self.b2(F.relu(self.b1_bn(self.b1(h))))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class MixedPlainNet(nn.Module):
    WIDTHS = {"stem": 8, "plain": 8, "side": 4, "down": 10, "fc1": 24}  # res = stem (residual)

    def __init__(self, w=WIDTHS):
        super().__init__()
        s = w["stem"]
        self.stem, self.bn = nn.Conv2d(3, s, 3, padding=1), nn.BatchNorm2d(s)
        self.res = nn.Conv2d(s, s, 3, padding=1)
        self.plain = nn.Conv2d(s, w["plain"], 3, padding=1)
        self.side = nn.Conv2d(s, w["side"], 1)
        self.down = nn.Conv2d(w["plain"] + w["side"], w["down"], 3, stride=2, padding=1)
        self.fc1 = nn.Linear(w["down"] * 4 * 4, w["fc1"])
        self.fc2 = nn.Linear(w["fc1"], 6)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = h + F.relu(self.res(h))
        h = torch.cat([F.relu(self.plain(h)), F.relu(self.side(h))], 1)
        h = F.relu(self.down(h))
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class DenseConcatNet(nn.Module):
    WIDTHS = {"left": 6, "right": 10, "mix": 12, "grow": 4, "fuse": 8, "fc1": 20}

    def __init__(self, w=WIDTHS):
        super().__init__()
        self.left, self.left_bn = nn.Conv2d(3, w["left"], 3, padding=1, bias=False), nn.BatchNorm2d(w["left"])
        self.right = nn.Conv2d(3, w["right"], 1)
        self.mix = nn.Conv2d(w["left"] + w["right"], w["mix"], 3, padding=1)
        self.grow = nn.Conv2d(w["mix"], w["grow"], 3, padding=1)
        self.fuse = nn.Conv2d(w["mix"] + w["grow"], w["fuse"], 3, stride=2, padding=1)
        self.fc1 = nn.Linear(w["fuse"] * 4 * 4, w["fc1"])
        self.fc2 = nn.Linear(w["fc1"], 4)

    def forward(self, x):
        h = torch.cat([F.relu(self.left_bn(self.left(x))), F.relu(self.right(x))], 1)
        h = F.relu(self.mix(h))
        h = torch.cat([h, F.relu(self.grow(h))], 1)
        h = F.relu(self.fuse(h))
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


# Models where the tools differ: dense architecture only.

class MixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.res = nn.Conv2d(8, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.side = nn.Conv2d(8, 4, 1)
        self.down = nn.Conv2d(12, 10, 3, stride=2, padding=1)
        self.fc1, self.fc2 = nn.Linear(10 * 4 * 4, 24), nn.Linear(24, 6)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = h + F.relu(self.res(h))
        h = torch.cat([F.relu(self.dw(h)), F.relu(self.side(h))], 1)
        h = F.relu(self.down(h))
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class ConcatSplitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.left, self.right = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 10, 1)
        self.mix, self.head = nn.Conv2d(16, 12, 3, padding=1), nn.Conv2d(6, 8, 1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        h = torch.cat([F.relu(self.left(x)), F.relu(self.right(x))], 1)
        a, b = self.mix(h).chunk(2, 1)
        h = F.relu(self.head(a * torch.sigmoid(b)))
        return self.fc(F.max_pool2d(h, 2).flatten(1))


class ConcatFlattenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.left, self.right = nn.Conv2d(3, 12, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.fc1, self.fc2 = nn.Linear(16 * 4 * 4, 20), nn.Linear(20, 4)

    def forward(self, x):
        h = torch.cat([F.relu(self.left(x)), F.relu(self.right(x))], 1)
        return self.fc2(F.relu(self.fc1(F.max_pool2d(h, 2).flatten(1))))


class SeparableNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.stem_bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.dw, self.dw_bn = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 12, 1)
        self.dw2 = nn.Conv2d(12, 24, 3, padding=1, groups=12)
        self.grouped, self.gn = nn.Conv2d(24, 16, 3, padding=1, groups=4), nn.GroupNorm(4, 16)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        h = F.relu(self.stem_bn(self.stem(x)))
        h = F.relu(self.dw_bn(self.dw(h)))
        h = F.hardtanh(self.pw(h), 0.0, 6.0)
        h = F.relu(self.dw2(h))
        h = F.silu(self.gn(self.grouped(h)))
        return self.fc(h.mean((2, 3)))


class MlpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.ln = nn.Embedding(11, 12), nn.LayerNorm(12)
        self.fc1, self.fc2, self.head = nn.Linear(12, 32), nn.Linear(32, 12), nn.Linear(12, 11)

    def forward(self, idx):
        x = self.emb(idx)
        x = x + self.fc2(F.gelu(self.fc1(self.ln(x))))
        return self.head(x)


# name -> (model class, the classifier Torch-Pruning must leave alone; Ember never resizes outputs)
MODELS = {
    "residual": (ResidualNet, "fc"),
    "mixed_plain": (MixedPlainNet, "fc2"),
    "dense_concat": (DenseConcatNet, "fc2"),
    "mixed": (MixedNet, "fc2"),
    "concat_split": (ConcatSplitNet, "fc"),
    "concat_flatten": (ConcatFlattenNet, "fc2"),
    "separable": (SeparableNet, "fc"),
    "mlp": (MlpNet, "head"),
}

KNOWN_DIFFERENCES = {
    "mixed": "Torch-Pruning's GroupMagnitudeImportance scores only layers whose pruning function is "
             "prune_conv_{out,in}_channels; a depthwise conv's is prune_depthwise_conv_out_channels, so dw.weight "
             "is left out of the stem group's score. Ember counts |dw.weight| (its output rows).",
    "concat_split": "mix's output is chunked into a gate, a * sigmoid(b). Both tools tie channel i of one half to "
                    "channel i of the other, but Torch-Pruning picks 12 - int(12 * 0.5) = 6 channels and each "
                    "drags its partner along: 12 to remove, check_pruning_group refuses, mix stays at 12 (at "
                    "ratio 0.25 it removes 6, not 3). Ember ranks the pairs as units and keeps 6 channels.",
    "concat_flatten": "Torch-Pruning sizes a concat by walking to its consumer (shape_infer."
                      "infer_in_channels_recursively): through the pooling and the flatten that is fc1, 256 "
                      "input features, not the concat's 16 channels, so update_concat_index_mapping sets no "
                      "offsets and the concat passes indices through unshifted: right's channel j is tied to "
                      "left's channel j and to fc1's features of channel j, not 12 + j. Its pruned model fails "
                      "(fc1 gets 192 features, expects 224). Ember offsets them.",
    "separable": "Torch-Pruning fails on dw2 (12 -> 24 channels, groups 12: a depthwise conv with channel "
                 "multiplier 2, which ops.module2type calls a plain conv): GroupMagnitudeImportance scores its "
                 "input channels from weight.transpose(0, 1), one row, and indexes it with 12 channel indices. "
                 "Grouped convs differ too: Torch-Pruning removes the same positions inside every conv group "
                 "(groups stay 4, GroupNorm keeps 4 groups), Ember removes whole groups (groups shrink).",
    "mlp": "Torch-Pruning's GroupMagnitudeImportance leaves nn.Embedding out (target_types: conv, linear, "
           "batch norm, layer norm); Ember counts emb.weight's columns in the residual-stream group.",
}


class Mismatch(Exception):
    pass


def widths_of(cls, state):
    """The WIDTHS a state dict was built with: each listed layer's output channels."""
    return {layer: state[layer + ".weight"].shape[0] for layer in cls.WIDTHS}


def kept(dense, pruned):
    """Kept positions of a 1-D tensor, found by value (None when some value is not unique)."""
    out = []
    for v in pruned.tolist():
        hits = (dense == v).nonzero().view(-1).tolist()
        if len(hits) != 1:
            return None
        out.append(hits[0])
    return out


def compare(what, got, want, dense):
    """Raises Mismatch naming every tensor of `got` (a state dict) that differs from `want` (Ember's file)."""
    problems = []
    if set(got) != set(want):
        problems.append(f"keys: only in {what}: {sorted(set(got) - set(want))}, "
                        f"only in Ember's file: {sorted(set(want) - set(got))}")
    for key in sorted(set(got) & set(want)):
        g, w = got[key], want[key]
        if g.shape != w.shape:
            problems.append(f"{key}: shape {list(g.shape)} in {what}, {list(w.shape)} in Ember's file")
        elif not torch.equal(g, w):
            problems.append(f"{key}: same shape {list(g.shape)}, different values")
        else:
            continue
        if g.dim() == 1 and g.is_floating_point():
            problems.append(f"  kept channels of {key}: {what} {kept(dense[key], g)}, "
                            f"Ember {kept(dense[key], w)}")
    if problems:
        raise Mismatch(f"{what} differs from Ember's pruned weights:\n    " + "\n    ".join(problems))


def check(name, out_dir, p=1, ratio=0.5):
    cls, classifier = MODELS[name]
    dense = load_file(out_dir / f"{name}_dense.safetensors")
    pruned_path = out_dir / f"{name}_pruned.safetensors"
    pruned = load_file(pruned_path)
    io = load_file(out_dir / f"{name}_io.safetensors")

    model = cls()
    model.load_state_dict(dense, strict=True)
    model.eval()  # Torch-Pruning traces in eval mode too; no batch-norm statistics change

    # 1. Torch-Pruning on the same weights.
    tp_model = None
    for reduction, normalizer in [("sum", None), ("mean", "mean")]:
        m = copy.deepcopy(model)
        importance = tp.importance.GroupMagnitudeImportance(p=p, group_reduction=reduction, normalizer=normalizer)
        try:
            pruner = tp.pruner.MetaPruner(m, io["input"], importance=importance, pruning_ratio=ratio,
                                          global_pruning=False, round_to=None,
                                          ignored_layers=[getattr(m, classifier)])
            pruner.step()
        except Exception as e:  # Torch-Pruning's own failure is a difference too
            raise Mismatch(f"Torch-Pruning failed: {type(e).__name__}: {e}") from e
        compare(f"Torch-Pruning (group_reduction={reduction}, normalizer={normalizer})", m.state_dict(), pruned,
                dense)
        if tp_model is None:
            tp_model = m

    # 2. The plan in the metadata, replayed on the dense weights.
    with safe_open(str(pruned_path), framework="pt") as f:
        plan = json.loads(f.metadata()["ember.pruning_plan"])
    replayed = dict(dense)
    for e in plan["entries"]:
        t = replayed[e["name"]]
        if t.shape[e["dim"]] != e["size"]:
            raise Mismatch(f"plan entry {e['name']}[{e['dim']}]: size {e['size']}, the dense tensor has "
                           f"{t.shape[e['dim']]}")
        replayed[e["name"]] = t.index_select(e["dim"], torch.tensor(e["keep"]))
    compare("the plan replayed on the dense weights", replayed, pruned, dense)

    # 3. A PyTorch model at the pruned sizes loads Ember's file and computes Ember's output.
    small = cls(widths_of(cls, pruned)) if hasattr(cls, "WIDTHS") else tp_model
    small.load_state_dict(pruned, strict=True)
    small.eval()
    with torch.no_grad():
        y = small(io["input"])
    if y.shape != io["output"].shape:
        raise Mismatch(f"the PyTorch model loaded with Ember's pruned weights gives output {list(y.shape)}, "
                       f"Ember gave {list(io['output'].shape)}")
    # Not the same computation (PyTorch's modules against Ember's C++ ones: other kernels or blocking may
    # be chosen), so a derived bound: each layer's float32 dot products may round differently, by at most
    # eps32 x their length of the magnitude, and the errors add up along the path to an output: eps32 x n
    # x max |output|, n = the fan-ins of every layer plus the input's pixels per channel (the pooling's sum).
    diff = (y - io["output"]).abs().max().item()
    n = forward_reduction_length(pruned, extra=io["input"][0, 0].numel())
    limit = bound(EPS32, n=n) * io["output"].abs().max().item()
    if not diff <= limit:
        raise Mismatch(f"the PyTorch model loaded with Ember's pruned weights computes another output: "
                       f"max |diff| {diff:.3g} on outputs up to {io['output'].abs().max().item():.3g} (bound "
                       f"{limit:.3g} = eps32 x {n} x max |output|)")
    n_dense, n_pruned = (sum(t.numel() for k, t in s.items() if "running" not in k and "num_batches" not in k)
                         for s in (dense, pruned))
    return (f"{len(plan['entries'])} plan entries, parameters {n_dense} -> {n_pruned}, "
            f"output max |diff| {diff:.3g} (bound {limit:.3g})")


def run_driver(driver, out_dir, names, importance, ratio):
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [driver, str(out_dir), "--importance", importance, "--ratio", repr(ratio), *names]
    if subprocess.run(args, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"{Path(sys.argv[0]).name}: {' '.join(args)} failed (its message is above)")


def main():
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} DRIVER OUT_DIR [MODEL...]")
    driver, out_dir, chosen = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    unknown = [n for n in chosen if n not in MODELS]
    if unknown:
        sys.exit(f"parity.py: unknown model(s) {unknown}; known: {sorted(MODELS)}")

    failed = []
    for importance, p, ratio in SETTINGS:
        setting_dir = out_dir / f"{importance}_{ratio}"
        names = chosen or PARITY_SET
        run_driver(driver, setting_dir, names, importance, ratio)
        for name in names:
            what = f"{name} ({importance}, ratio {ratio})"
            try:
                print(f"{what}: Ember and Torch-Pruning keep the same channels; {check(name, setting_dir, p, ratio)}")
            except Mismatch as e:
                failed.append(what)
                print(f"{what}: MISMATCH: {e}")
                if name in KNOWN_DIFFERENCES:
                    print(f"  (known difference: {KNOWN_DIFFERENCES[name]})")
    if not chosen:
        # The known differences must still be differences.
        known_dir = out_dir / "known_differences"
        run_driver(driver, known_dir, list(KNOWN_DIFFERENCES), "l1", 0.5)
        for name in KNOWN_DIFFERENCES:
            try:
                check(name, known_dir)
            except Mismatch as e:
                print(f"{name}: still differs, as documented: {str(e).splitlines()[0][:160]}")
                continue
            failed.append(f"{name} (now matches Torch-Pruning: move it to PARITY_SET and update docs/pruning.md)")
            print(f"{name}: MATCHES Torch-Pruning, but KNOWN_DIFFERENCES says it differs")
    if failed:
        sys.exit(f"parity.py: {len(failed)} checks failed: {failed}")


if __name__ == "__main__":
    main()
