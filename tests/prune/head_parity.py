"""Parity: Ember's attention-head pruning (C++) vs Torch-Pruning's (Python).

The driver (head_parity_driver.cpp) removes a share of every attention
layer's heads with Ember (Pruner::step_heads, L1 or L2, each layer losing
`ratio` of its heads) and writes the dense weights, the pruned weights (the
plan in the metadata), Ember's head scores on the dense weights and an
input/output pair of the pruned model. Here each model is built again in
PyTorch with the same parameter names, loaded with the dense weights and
pruned by Torch-Pruning's MetaPruner with num_heads={q/k/v layer: heads},
prune_num_heads=True, head_pruning_ratio=ratio, prune_head_dims=False,
GroupMagnitudeImportance(p, bias=True), local ranking, and every layer but the
q/k/v projections ignored, for every setting in SETTINGS. Checked, per model
and setting:

  1. Scores: Torch-Pruning scores a head by the group importance of the
     output projection's input channels (its root for attention groups),
     which sums |w|^p over each channel's q, k and v rows (weights and biases,
     with bias=True) and its output-projection column, then averages over the
     head's head_dim channels (imp.view(num_heads, -1).mean(1) in
     base_pruner.py). Ember sums over the same blocks, so its score is
     head_dim times Torch-Pruning's (group_reduction="sum", normalizer=None).
  2. Torch-Pruning's pruned state_dict equals Ember's pruned file exactly
     (keys, shapes, values: the same heads removed, the same rows and columns
     kept, in the same order), with group_reduction="sum", normalizer=None and
     with its defaults "mean"/"mean" (the same ranking within a layer).
  3. The plan in the file's metadata, replayed on the dense weights, gives the
     pruned file; its head entries keep the heads whose rows were kept.
  4. The PyTorch model at the pruned sizes loads the file with strict=True and
     reproduces Ember's output.

    python head_parity.py DRIVER OUT_DIR [MODEL...]

Models: char_gpt (CharGpt, 2 blocks, 8 heads of 4 channels, one fused qkv
Linear split as timm's Attention does: view, permute, unbind; Ember's C++
indexes the permuted tensor, the same values) and separate_qkv (separate q,
k, v, o Linear layers, 8 heads; the PyTorch model repeats k and v only for
GQA: through repeat_interleave, even by 1, Torch-Pruning's graph loses k's
and v's channel mapping (root_idxs None) and leaves them out of the score).

How the two are called alike, and what differs by design:
  - Torch-Pruning removes heads only inside its width step, for a group with
    channels to remove: with pruning_ratio=0 it removes no head whatever
    head_pruning_ratio says (checked below as a known difference). So it runs
    with pruning_ratio=ratio, prune_head_dims=False (no channel goes inside a
    kept head) and every other layer ignored. Ember's prune.ratio=0
    prune.heads=r removes heads only.
  - Its GroupMagnitudeImportance counts biases only with bias=True (the
    default is False); Ember counts the q/k/v biases. With trained, nonzero
    biases the defaults may rank heads differently, so bias=True here.
  - Heads removed per layer: Torch-Pruning ceil(ratio * heads), Ember
    heads - floor(heads * (1 - ratio)): the same count.
  - Not compared: global head ranking (Torch-Pruning ranks heads across
    layers with global_pruning; Ember has no global head ranking),
    prune_head_dims (Torch-Pruning can also narrow the heads; Ember keeps
    head_dim), iterative steps, Taylor and random.

KNOWN_DIFFERENCES run too and must still differ: a difference that disappears
fails the test, so the list (and docs/pruning.md) is updated.

Torch-Pruning scores in float32, Ember in float64 (then float32): with these
seeds the smallest gap between the last removed and the first kept head's
score (printed per layer) is 2.2e-3 of the score, far above float32
rounding (a sum of n nonnegative terms is within n x eps32 of itself: 6e-5
for a char_gpt head's 524 terms; checked per layer), so the comparison
cannot flip on a tie.
"""
import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_pruning as tp
from safetensors import safe_open
from safetensors.torch import load_file

from parity import Mismatch, compare, run_driver  # the channel parity test's: same file layout and driver
from tolerance import EPS32, bound, forward_reduction_length  # (parity.py put tests/ on the path)

PARITY_SET = ["char_gpt", "separate_qkv"]
# (importance, p of GroupMagnitudeImportance, ratio). 8 heads: 2, 4 and 6 go.
SETTINGS = [("l1", 1, 0.25), ("l2", 2, 0.25), ("l1", 1, 0.5), ("l2", 2, 0.75)]
HEAD_DIM = 4  # every model's (the driver's)


# Models, mirroring head_parity_driver.cpp. Each takes its attention widths
# from its tensors (heads = rows / HEAD_DIM), so a model built at the pruned
# sizes computes the pruned model.

class CausalSelfAttention(nn.Module):
    """CharGpt's attention (lib/include/ember/models/char_gpt.h): fused qkv [3A, C], proj [C, A]."""

    def __init__(self, d, inner):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * inner), nn.Linear(inner, d)

    def forward(self, x):
        B, T, _ = x.shape
        A = self.qkv.out_features // 3
        q, k, v = self.qkv(x).view(B, T, 3, A // HEAD_DIM, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, A))


class Block(nn.Module):
    def __init__(self, d, inner):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), CausalSelfAttention(d, inner), nn.LayerNorm(d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class CharGpt(nn.Module):
    """ember::models::CharGpt (dropout 0): the output layer is tied to wte."""

    def __init__(self, inner=(32, 32), d=32, block_size=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList([Block(d, a) for a in inner])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    @classmethod
    def from_state(cls, sd):
        n = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
        return cls(tuple(sd[f"blocks.{i}.attn.proj.weight"].shape[1] for i in range(n)))

    def attention(self):
        """(layer name, q/k/v layers, {layer: heads}, output projection) per attention layer."""
        return [(f"blocks.{i}.attn", [b.attn.qkv], {b.attn.qkv: b.attn.qkv.out_features // 3 // HEAD_DIM},
                 b.attn.proj) for i, b in enumerate(self.blocks)]


class GqaAttention(nn.Module):
    """tests/prune/models.h's GqaAttention: q [H*hd, d], k and v [KV*hd, d], o [d, H*hd]."""

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.q, self.o = nn.Linear(d, heads * HEAD_DIM), nn.Linear(heads * HEAD_DIM, d)
        self.k, self.v = nn.Linear(d, kv_heads * HEAD_DIM), nn.Linear(d, kv_heads * HEAD_DIM)

    def forward(self, x):
        B, T, _ = x.shape
        H, KV = self.q.out_features // HEAD_DIM, self.k.out_features // HEAD_DIM
        q = self.q(x).view(B, T, H, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(B, T, KV, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(B, T, KV, HEAD_DIM).transpose(1, 2)
        if H != KV:  # Torch-Pruning loses k's and v's channel mapping through repeat_interleave, even by 1
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, H * HEAD_DIM))


class AttentionNet(nn.Module):
    """tests/prune/models.h's AttentionNet: emb -> x + attn(x) -> out."""

    def __init__(self, heads=8, kv_heads=8, vocab=32, d=16):
        super().__init__()
        self.emb, self.attn, self.out = nn.Embedding(vocab, d), GqaAttention(d, heads, kv_heads), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        return self.out(x + self.attn(x))

    @classmethod
    def from_state(cls, sd):
        return cls(sd["attn.q.weight"].shape[0] // HEAD_DIM, sd["attn.k.weight"].shape[0] // HEAD_DIM)

    def attention(self):
        a = self.attn
        H, KV = a.q.out_features // HEAD_DIM, a.k.out_features // HEAD_DIM
        return [("attn", [a.q, a.k, a.v], {a.q: H, a.k: KV, a.v: KV}, a.o)]


MODELS = {
    "char_gpt": lambda: CharGpt(),
    "separate_qkv": lambda: AttentionNet(8, 8),
}

KNOWN_DIFFERENCES = {
    "gqa": ("grouped-query attention (8 query heads in 4 kv groups). Ember removes whole kv groups: a kv head "
            "with all its query heads (at 0.5: 2 groups, 4 query and 2 kv heads). Torch-Pruning cannot express "
            "that: for GQA it removes query heads inside every kv group and keeps every kv head (base_pruner.py "
            "empties the k and v layers' indices: 'disable head pruning for the kv layers if GQA is enabled'), "
            "which Ember refuses (a kv head would serve fewer query heads than the others). On this module (k, v "
            "repeated by repeat_interleave; HF's repeat_kv with expand behaves the same) its graph maps the 32 "
            "query channels onto the 16 k/v channels, and it removes nothing."),
    "char_gpt_pruning_ratio_0": ("Torch-Pruning with pruning_ratio=0 and head_pruning_ratio=0.25 removes no head: "
                                 "it selects heads inside the width step, which skips a group with no channel to "
                                 "remove (n_pruned = 0). Ember's prune.ratio=0 prune.heads=0.25 removes a quarter "
                                 "of the heads and nothing else."),
}


def torch_pruning(model, example, ratio, importance, pruning_ratio=None):
    """Torch-Pruning's head pruning of `model` in place, every layer but the q/k/v projections ignored."""
    attention = model.attention()
    qkv = {m for _, layers, _, _ in attention for m in layers}
    num_heads = {m: n for _, _, heads, _ in attention for m, n in heads.items()}
    ignored = [m for m in model.modules() if m not in qkv and len(list(m.children())) == 0
               and any(True for _ in m.parameters(recurse=False))]
    pruner = tp.pruner.MetaPruner(model, example, importance=importance,
                                  pruning_ratio=ratio if pruning_ratio is None else pruning_ratio,
                                  global_pruning=False, round_to=None, ignored_layers=ignored,
                                  num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
                                  head_pruning_ratio=ratio)
    pruner.step()


def torch_pruning_head_scores(model, example, p):
    """Torch-Pruning's per-head scores, as MetaPruner computes them: the group of the output projection's
    input channels, GroupMagnitudeImportance (sum, no normalizer, biases), averaged over each head's channels."""
    dg = tp.DependencyGraph().build_dependency(model, example_inputs=example)
    importance = tp.importance.GroupMagnitudeImportance(p=p, group_reduction="sum", normalizer=None, bias=True)
    out = {}
    for name, _, heads, proj in model.attention():
        group = dg.get_pruning_group(proj, tp.prune_linear_in_channels, idxs=list(range(proj.in_features)))
        imp = importance(group)
        out[name] = imp.view(max(heads.values()), -1).mean(1)
    return out


def check(name, out_dir, p=1, ratio=0.25):
    dense = load_file(str(out_dir / f"{name}_dense.safetensors"))
    pruned_path = out_dir / f"{name}_pruned.safetensors"
    pruned = load_file(str(pruned_path))
    io = load_file(str(out_dir / f"{name}_io.safetensors"))
    model = MODELS[name]()
    model.load_state_dict(dense, strict=True)
    model.eval()

    # 1. Scores: Ember's = head_dim x Torch-Pruning's mean over the head's channels.
    notes = []
    tp_scores = torch_pruning_head_scores(copy.deepcopy(model), io["input"], p)
    for layer, s in tp_scores.items():
        ember = io[f"scores.{layer}"]
        # A head's score sums |w|^p over its terms (its channels' q, k, v rows and biases and output-projection
        # columns: the layers' elements / heads), all nonnegative: Torch-Pruning's float32 sum is within
        # eps32 x (terms + 2) of the exact one whatever its order (the +2: |w|^2's rounding and the mean's
        # division; x HEAD_DIM = 4 is exact), Ember's float64 one (stored as float32) within one more eps32.
        layers, heads = next((q, h) for n_, q, h, _ in model.attention() if n_ == layer)
        proj = next(o for n_, _, _, o in model.attention() if n_ == layer)
        terms = sum(t.numel() for m in layers for t in (m.weight, m.bias)) + proj.weight.numel()
        rtol = bound(EPS32, n=terms // max(heads.values()) + 3)
        if ember.shape != s.shape or not torch.allclose(ember.double(), HEAD_DIM * s.double(), rtol=rtol, atol=0):
            raise Mismatch(f"{layer}: Ember's head scores {ember.tolist()} are not head_dim x Torch-Pruning's "
                           f"{s.tolist()} to {rtol:.2g} relative")
        n_removed = math.ceil(ratio * len(s))
        ordered = ember.sort().values
        gap = (ordered[n_removed] - ordered[n_removed - 1]) / ordered[n_removed]
        if not gap > 2 * rtol:  # else the two tools' roundings could rank the heads on either side differently
            raise Mismatch(f"{layer}: the last removed and first kept heads' scores are {gap.item():.2g} apart, "
                           f"within float32 rounding of each other ({2 * rtol:.2g}): choose another seed")
        notes.append(f"{layer} score gap {gap.item():.2g}")

    # 2. Torch-Pruning on the same weights.
    for reduction, normalizer in [("sum", None), ("mean", "mean")]:
        m = copy.deepcopy(model)
        importance = tp.importance.GroupMagnitudeImportance(p=p, group_reduction=reduction, normalizer=normalizer,
                                                            bias=True)
        try:
            torch_pruning(m, io["input"], ratio, importance)
        except Exception as e:  # Torch-Pruning's own failure is a difference too
            raise Mismatch(f"Torch-Pruning failed: {type(e).__name__}: {e}") from e
        compare(f"Torch-Pruning (group_reduction={reduction}, normalizer={normalizer})", m.state_dict(), pruned,
                dense)

    # 3. The plan in the metadata, replayed on the dense weights.
    with safe_open(str(pruned_path), framework="pt") as f:
        plan = json.loads(f.metadata()["ember.pruning_plan"])
    replayed = dict(dense)
    for e in plan["entries"]:
        replayed[e["name"]] = replayed[e["name"]].index_select(e["dim"], torch.tensor(e["keep"]))
    compare("the plan replayed on the dense weights", replayed, pruned, dense)
    removed = []
    for h in plan["heads"]:
        rows = pruned[f"{h['module']}.{'qkv' if name == 'char_gpt' else 'q'}.weight"].shape[0]
        if len(h["keep"]) * HEAD_DIM * (3 if name == "char_gpt" else 1) != rows:
            raise Mismatch(f"plan head entry {h['module']} keeps {h['keep']}, the file has {rows} q rows")
        removed.append(f"{h['module']} -{sorted(set(range(h['n_head'])) - set(h['keep']))}")

    # 4. A PyTorch model at the pruned sizes loads Ember's file and computes Ember's output.
    small = type(model).from_state(pruned)
    small.load_state_dict(pruned, strict=True)
    small.eval()
    with torch.no_grad():
        y = small(io["input"])
    if y.shape != io["output"].shape:
        raise Mismatch(f"the PyTorch model loaded with Ember's pruned weights gives output {list(y.shape)}, "
                       f"Ember gave {list(io['output'].shape)}")
    # Not the same computation (scaled_dot_product_attention and PyTorch's modules against Ember's C++
    # attention), so a derived bound, as parity.py's: eps32 x n x max |output|, n = the fan-ins of every
    # layer (the tied output layer's through wte) plus the reductions without weights: each normalisation
    # over its width (the 1-D .weight tensors), and per attention q.k over HEAD_DIM, the softmax's sum and
    # the average of v over the T positions.
    diff = (y - io["output"]).abs().max().item()
    T = io["input"].shape[1]
    norms = sum(t.numel() for k, t in pruned.items() if k.endswith(".weight") and t.dim() == 1)
    n = forward_reduction_length(pruned, extra=norms + len(small.attention()) * (HEAD_DIM + 2 * T))
    limit = bound(EPS32, n=n) * io["output"].abs().max().item()
    if not diff <= limit:
        raise Mismatch(f"the PyTorch model loaded with Ember's pruned weights computes another output: "
                       f"max |diff| {diff:.3g} (bound {limit:.3g} = eps32 x {n} x max |output|)")
    return (f"heads removed {', '.join(removed)}; {'; '.join(notes)}; output max |diff| {diff:.3g} "
            f"(bound {limit:.3g})")


def check_gqa(out_dir, p=1, ratio=0.5):
    """Torch-Pruning's head pruning of the GQA model must still differ from Ember's (KNOWN_DIFFERENCES)."""
    dense = load_file(str(out_dir / "gqa_dense.safetensors"))
    pruned = load_file(str(out_dir / "gqa_pruned.safetensors"))
    io = load_file(str(out_dir / "gqa_io.safetensors"))
    model = AttentionNet(8, 4)
    model.load_state_dict(dense, strict=True)
    model.eval()
    torch_pruning(model, io["input"], ratio, tp.importance.GroupMagnitudeImportance(p=p, bias=True))
    got = model.state_dict()
    try:
        compare("Torch-Pruning", got, pruned, dense)
    except Mismatch as e:
        shapes = ", ".join(f"{k} {list(got[k].shape)} (Ember {list(pruned[k].shape)})"
                           for k in ("attn.q.weight", "attn.k.weight"))
        raise Mismatch(f"{e}; {shapes}") from e


def check_pruning_ratio_0(out_dir):
    """Torch-Pruning with pruning_ratio=0 must still remove no head (KNOWN_DIFFERENCES)."""
    dense = load_file(str(out_dir / "char_gpt_dense.safetensors"))
    io = load_file(str(out_dir / "char_gpt_io.safetensors"))
    model = CharGpt()
    model.load_state_dict(dense, strict=True)
    torch_pruning(model, io["input"], 0.25, tp.importance.GroupMagnitudeImportance(p=1, bias=True),
                  pruning_ratio=0.0)
    compare("Torch-Pruning (pruning_ratio=0)", model.state_dict(),
            load_file(str(out_dir / "char_gpt_pruned.safetensors")), dense)


def main():
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} DRIVER OUT_DIR [MODEL...]")
    driver, out_dir, chosen = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    unknown = [n for n in chosen if n not in MODELS]  # the parity models; KNOWN_DIFFERENCES run by default
    if unknown:
        sys.exit(f"head_parity.py: unknown model(s) {unknown}; known: {sorted(MODELS)}")

    failed = []
    for importance, p, ratio in SETTINGS:
        setting_dir = out_dir / f"{importance}_{ratio}"
        names = chosen or PARITY_SET
        run_driver(driver, setting_dir, names, importance, ratio)
        for name in names:
            what = f"{name} ({importance}, ratio {ratio})"
            try:
                print(f"{what}: Ember and Torch-Pruning remove the same heads; {check(name, setting_dir, p, ratio)}")
            except Mismatch as e:
                failed.append(what)
                print(f"{what}: MISMATCH: {e}")
                if name in KNOWN_DIFFERENCES:
                    print(f"  (known difference: {KNOWN_DIFFERENCES[name]})")
    if not chosen:
        # The known differences must still be differences.
        known_dir = out_dir / "known_differences"
        run_driver(driver, known_dir, ["gqa", "char_gpt"], "l1", 0.5)
        run_driver(driver, known_dir / "ratio_0.25", ["char_gpt"], "l1", 0.25)
        for name, test in [("gqa", lambda: check_gqa(known_dir)),
                           ("char_gpt_pruning_ratio_0", lambda: check_pruning_ratio_0(known_dir / "ratio_0.25"))]:
            try:
                test()
            except Mismatch as e:
                print(f"{name}: still differs, as documented: {str(e).splitlines()[0][:200]}")
                continue
            failed.append(f"{name} (now matches Torch-Pruning: update KNOWN_DIFFERENCES and docs/pruning.md)")
            print(f"{name}: MATCHES Torch-Pruning, but KNOWN_DIFFERENCES says it differs")
    if failed:
        sys.exit(f"head_parity.py: {len(failed)} checks failed: {failed}")


if __name__ == "__main__":
    main()
