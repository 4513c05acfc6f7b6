#!/usr/bin/env bash
# End to end: the gpt2 recipe on llm.c token files (GPT-2's format, byte
# tokens of a generated text, written by ember_shards write --from text;
# vocabulary 256):
#   - without data.tokens, or with contexts longer than the position table,
#     it is refused under --check, saying what to pass;
#   - a 2-layer GPT-2 from scratch learns the text (validation loss well
#     under ln 256);
#   - from a model transformers saved (save_pretrained, random weights: no
#     download), it loads every tensor, trains, and writes <run.dir>/hf,
#     which GPT2LMHeadModel.from_pretrained loads; transformers' validation
#     loss of that model on the same windows, batches and averaging equals
#     the recipe's within a bound derived from the logits' (2 x 1e-5 of the
#     largest logit: a cross-entropy moves at most twice as far as any of
#     its logits), and is below the loss of the weights it started from;
#   - the planner's measurement (--measure) counts transformers' parameters
#     and GPT-2's training FLOPs;
#   - sharded: the same start trained on 2 Gloo ranks x 8 sequences with
#     dist.sharding=parameters (ZeRO-3: GPT-2's tied wte/lm_head in one
#     shard) and every block checkpointed ends within a float32 bound of one
#     process x 16, and its export loads in from_pretrained.
set -euo pipefail
bin="$1"; py="$2"; out="$3"; shards="$4"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"

# The token files as users make them: tools/ember shards (ember_shards write --from text), byte tokens.
"$py" - "$out/text.txt" <<'EOF'
import random
import sys
rng = random.Random(0)
subjects, verbs, objects = ["the cat", "a dog", "my friend", "the old man"], ["sees", "likes", "finds"], \
    ["the ball.", "a red hat.", "the small house.", "some bread."]
open(sys.argv[1], "w").write(" ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
                                      for _ in range(4000)))
EOF
"$shards" write "$out/text.txt" "$out" --from text --tokenizer bytes --tokens-per-shard 50000 --val-fraction 0.1 \
  >"$out/shards.out" 2>"$out/shards.err" || { cat "$out/shards.err"; fail "ember_shards write --from text failed"; }
expect_in "$out/shards.err" "in 2 token files: .*train-{000000..000001}.bin"

small=(model.preset= model.n_layer=2 model.n_head=2 model.n_embd=64 model.n_positions=64 data.block_size=32
       data.vocab_size=256 data.batch_size=16 data.eval_batch_size=8 trainer.threads=1 sched.warmup_epochs=0
       data.tokens="$out/train-{000000..000001}.bin" data.val_tokens="$out/val-000000.bin")

set +e
"$bin" model.preset= --check >"$out/check.out" 2>"$out/check.err"; rc=$?
set -e
[[ $rc -ne 0 ]] || fail "--check accepted a run without data.tokens"
expect_in "$out/check.err" "data.tokens names no token files"
set +e
"$bin" "${small[@]}" data.block_size=65 --check >"$out/check2.out" 2>"$out/check2.err"; rc=$?
set -e
[[ $rc -ne 0 ]] || fail "--check accepted data.block_size above model.n_positions"
expect_in "$out/check2.err" "data.block_size=65 exceeds model.n_positions=64"

"$bin" "${small[@]}" trainer.epochs=2 optim.lr=3e-3 run.dir="$out/scratch" >"$out/scratch.out" 2>"$out/scratch.err" ||
  { cat "$out/scratch.err"; fail "the gpt2 run from scratch failed (its stderr above)"; }
"$py" -c "
import json, math, sys
s = json.load(open(sys.argv[1]))
if not s['val_loss'] < 0.5 * math.log(256):
    sys.exit(f'FAILED: val_loss {s[\"val_loss\"]} is not under half of ln 256 = {math.log(256):.3f}')
print(f'gpt2 from scratch: val_loss {s[\"val_loss\"]:.4f} (ln 256 = {math.log(256):.4f})')" "$out/scratch/summary.json"

"$py" - "$out" <<'EOF'
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(1)
GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256)).save_pretrained(
    f"{sys.argv[1]}/hf_start")
EOF
"$bin" "${small[@]}" trainer.epochs=1 optim.lr=1e-3 model.pretrained="$out/hf_start" run.dir="$out/tuned" \
  >"$out/tuned.out" 2>"$out/tuned.err" || { cat "$out/tuned.err"; fail "the gpt2 run from Hugging Face weights failed"; }
expect_in "$out/tuned.err" "model.pretrained: 28 tensors from 1 file(s)"
expect_in "$out/tuned.err" "wrote .*tuned/hf"
"$py" - "$out" <<'EOF'
import json
import sys
import numpy as np
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel
out = sys.argv[1]
torch.set_num_threads(1)
tokens = torch.from_numpy(np.fromfile(f"{out}/val-000000.bin", dtype=np.uint16)[512:].astype(np.int64))
T, B = 32, 8
starts = range(0, len(tokens) - T, T)  # windows of T + 1 tokens, one every T
windows = torch.stack([tokens[s : s + T + 1] for s in starts])
def val_loss(model):  # the trainer's: each batch's mean (float32), times its size, summed in float64
    total, largest = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(windows), B):
            w = windows[i : i + B]
            logits = model(w[:, :T]).logits
            largest = max(largest, logits.abs().max().item())
            total += F.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1)).item() * len(w)
    return total / len(windows), largest
tuned = GPT2LMHeadModel.from_pretrained(f"{out}/tuned/hf").eval()
start = GPT2LMHeadModel.from_pretrained(f"{out}/hf_start").eval()
ember = json.load(open(f"{out}/tuned/summary.json"))["val_loss"]
got, largest = val_loss(tuned)
before, _ = val_loss(start)
bound = 2 * 1e-5 * largest
assert abs(got - ember) <= bound, f"transformers' val loss {got} vs the recipe's {ember}: over {bound:.2e}"
assert got < before, f"fine-tuning did not lower the loss: {before} -> {got}"
print(f"gpt2 from Hugging Face weights: val_loss {before:.4f} -> {got:.4f} ({len(windows)} windows); transformers "
      f"computes the recipe's {ember:.6f} from the export (difference {abs(got - ember):.1e}, bound {bound:.1e})")
EOF
# The planner sizes it: --measure counts transformers' parameters (wte tied: once) and the
# training FLOPs 3 x T x (2 x the blocks' matmul weights + 2 C V for the head + 4 T C per block).
"$bin" "${small[@]}" --measure "$out/measure.json" plan.precisions=fp32 plan.timed_steps=2 \
  >"$out/measure.out" 2>"$out/measure.err" || { cat "$out/measure.err"; fail "gpt2 --measure failed"; }
"$py" - "$out/measure.json" <<'EOF'
import json
import sys
from transformers import GPT2Config, GPT2LMHeadModel
m = json.load(open(sys.argv[1]))
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256))
params = sum(p.numel() for p in model.parameters())  # parameters() yields the tied wte once
T, C, V, L = 32, 64, 256, 2
matmul = sum(p.numel() for n, p in model.named_parameters() if ".h." in n and n.endswith(".weight") and p.dim() == 2)
flops = 3 * T * (2 * matmul + 2 * C * V + L * 4 * T * C)
if (m["parameters"], m["train_flops_per_sample"]) != (params, flops):
    sys.exit(f"FAILED: --measure: {m['parameters']} parameters, {m['train_flops_per_sample']} training FLOPs per "
             f"sequence; transformers' model {params}, the formula {flops}")
print(f"gpt2 --measure: {params} parameters (transformers' count), {flops} training FLOPs per sequence of {T}")
EOF

# ZeRO-3 with checkpointing on 2 ranks against one process, from the same Hugging Face start.
torchrun="$(dirname "$py")/torchrun"
zero=(trainer.max_steps=8 optim.lr=1e-3 sched.name=constant model.pretrained="$out/hf_start")
"$bin" "${small[@]}" "${zero[@]}" run.dir="$out/one" >"$out/one.out" 2>"$out/one.err" ||
  { cat "$out/one.err"; fail "the one-process run failed"; }
"$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${small[@]}" "${zero[@]}" data.batch_size=8 \
  dist.sharding=parameters model.activation_checkpoint_every=1 run.dir="$out/zero" >"$out/zero.out" 2>"$out/zero.err" ||
  { cat "$out/zero.out" "$out/zero.err"; fail "the sharded run failed"; }
expect_in "$out/zero.err" "x 2 ranks (gloo)"
"$py" - "$out" "$here/../tolerance.py" <<'EOF'
import importlib.util
import sys
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
spec = importlib.util.spec_from_file_location("tolerance", sys.argv[2])
tol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tol)
out = sys.argv[1]
a, b = load_file(f"{out}/zero/hf/model.safetensors"), load_file(f"{out}/one/hf/model.safetensors")
start = load_file(f"{out}/hf_start/model.safetensors")
# Not one computation: 2 ranks x 8 (sharded, other GEMM shapes, gradients summed over ranks) against 1 x 16.
# The longest float32 reduction whose order differs is the clip's squared norm over all P parameters
# (trainer.clip_grad_norm=1: per shard, then over ranks, against per tensor), n = P; AdamW (lr 1e-3, betas
# 0.9 and 0.95, weight decay 0.1) carries it through the 8 steps (tolerance.adamw_bound).
P = sum(t.numel() for t in b.values())
limit = tol.adamw_bound(tol.EPS32, n=P, steps=8, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                        max_weight=max(t.abs().max().item() for t in b.values()))
d, at = tol.max_abs(a, b)
moved, _ = tol.max_abs(b, {k: v for k, v in start.items() if k in b})
if not d <= limit:
    sys.exit(f"FAILED: ZeRO-3 on 2 ranks: {at} differs by {d:.2e} from one process (bound {limit:.1e})")
if not moved > 10 * limit:
    sys.exit(f"FAILED: the weights moved by {moved:.1e} only: the comparison would not see a difference")
GPT2LMHeadModel.from_pretrained(f"{out}/zero/hf")
print(f"gpt2 ZeRO-3 + checkpointing, 2 ranks x 8 against 1 x 16, 8 steps: weights within {d:.1e} "
      f"(bound {limit:.1e}; they moved {moved:.1e} from the start); the export loads in from_pretrained")
EOF
echo "gpt2_subset: OK"
