#!/usr/bin/env bash
# End to end: char_gpt on a small generated text, tiny model, 30 steps.
# Checks summary.json (val_bpb, tokens/s, MFU, FLOPs/token against the
# formula computed here from the config), sample.txt, and bad input.
set -euo pipefail
bin="$1"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"

# About 40 KB of English-like text, the same every time.
python3 - "$out/text.txt" <<'PY'
import random, sys
r = random.Random(0)
words = ("the a cat dog sat on mat ran to house and saw big small red green tree bird sang "
         "in morning evening quiet loud river flows under old bridge").split()
lines = []
while sum(len(l) + 1 for l in lines) < 40000:
    lines.append(" ".join(r.choice(words) for _ in range(r.randint(4, 12))).capitalize() + ".")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY

L=2 H=2 D=32 T=32
"$bin" run.dir="$out/run" data.path="$out/text.txt" data.block_size=$T data.batch_size=16 \
  model.n_layer=$L model.n_head=$H model.n_embd=$D trainer.max_steps=30 trainer.threads=1 trainer.progress=false \
  sched.warmup_epochs=0 sample.length=64 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
expect_in "$out/stdout" '^--- char_gpt sample'
tail -n 1 "$out/stdout" | grep -q 'val_bpb=.*summary=' || fail "the last line of stdout is not the result line"
python3 - "$out/run" $L $D $T <<'PY'
import json, math, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1]); L, d, T = map(int, sys.argv[2:5])
s = json.loads((run / "summary.json").read_text())
for key in ["val_bpb", "val_loss", "tokens_per_second", "mfu", "flops_per_token", "steps", "parameters"]:
    check(key in s, f"summary.json lacks {key}: {s}")
check(s["steps"] == 30 and s["test_accuracy"] is None, s)
check(math.isfinite(s["val_bpb"]) and 0 < s["val_bpb"] < 8, s)    # 8 bits/byte = uniform guessing
# Bitwise: the recipe's formula (val_loss / std::log(2.0)) on the same double (summary.json keeps every digit).
check(s["val_bpb"] == s["val_loss"] / math.log(2), s)
check(s["tokens_per_second"] > 0 and s["mfu"] > 0, s)
# tokens/s = the run's samples/s x T, and MFU is the Monitor's (training FLOPs per sample =
# per token x T, over its logged steps). The CPU's peak is measured at run time, so on a loaded
# machine MFU can pass 1: check where the numbers come from, not a range. Bitwise: the same
# doubles (T x FLOPs/token is exact in a double).
check(s["tokens_per_second"] == s["samples_per_second"] * T, (s["tokens_per_second"], s["samples_per_second"]))
check(s["mfu"] == s["monitor"]["mfu"], (s["mfu"], s["monitor"]))
check(s["monitor"]["flops_per_sample"] == s["flops_per_token"] * T, (s["monitor"], s["flops_per_token"]))
# Training FLOPs per token = 3 x forward: per layer the Linears (qkv 3d^2, proj d^2,
# fc 4d^2, proj 4d^2: 2 FLOPs per multiply-add) and attention (2 x 2 T d), plus the tied head.
expected = 3 * (L * (2 * 12 * d * d + 2 * 2 * T * d) + 2 * d * 256)
check(s["flops_per_token"] == expected, (s["flops_per_token"], expected))
# Parameters: wte 256d, wpe Td, per layer 2 LayerNorms (4d) + Linears with bias
# (3d^2+3d, d^2+d, 4d^2+4d, 4d^2+d), ln_f 2d; the head is tied (not counted again).
params = 256 * d + T * d + L * (4 * d + 12 * d * d + 9 * d) + 2 * d
check(s["parameters"] == params, (s["parameters"], params))
sample = (run / "sample.txt").read_text(errors="replace")
check(sample.startswith("Q:") and len(sample.encode("utf-8", "surrogateescape")) >= 60, repr(sample))
print("run folder OK:", s["val_bpb"], s["tokens_per_second"], s["mfu"])
PY

# Mixed precision through the shared key: fp16-mixed logs the loss scale and
# skipped steps (metrics.jsonl, summary.json); bf16-mixed runs without a scaler.
for prec in fp16-mixed bf16-mixed; do
  "$bin" run.dir="$out/$prec" data.path="$out/text.txt" data.block_size=$T data.batch_size=16 \
    model.n_layer=$L model.n_head=$H model.n_embd=$D trainer.max_steps=20 trainer.threads=1 trainer.progress=false \
    trainer.precision=$prec trainer.log_every=5 sched.warmup_epochs=0 sample.length=16 >"$out/$prec.out" 2>&1
done
python3 - "$out" <<'PY'
import json, math, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
out = pathlib.Path(sys.argv[1])
for prec in ["fp16-mixed", "bf16-mixed"]:
    s = json.loads((out / prec / "summary.json").read_text())
    check(s["precision"] == prec and s["steps"] == 20 and 0 < s["val_bpb"] < 8, s)
    steps = [json.loads(l) for l in (out / prec / "metrics.jsonl").read_text().splitlines() if '"step"' in l]
    steps = [r for r in steps if r["kind"] == "step"]
    check(len(steps) == 4, steps)
    if prec == "fp16-mixed":
        check("skipped_steps" in s and s["skipped_steps"] >= 0, s)
        check(all(r["loss_scale"] > 0 and r["skipped_steps"] >= 0 for r in steps), steps)
        # PyTorch's schedule: 65536, halved per skipped step, no growth within 2000 steps.
        check(steps[-1]["loss_scale"] == 65536.0 / 2 ** steps[-1]["skipped_steps"], steps[-1])
    else:
        check("skipped_steps" not in s and all(r["loss_scale"] is None for r in steps), (s, steps))
print("mixed precision runs OK")
PY

# Head pruning through the keys: at the start of epoch 1, one of each layer's 2 heads goes (its
# q, k, v rows and attn.proj columns) and nothing else (prune.ratio=0); FLOPs/token follow.
"$bin" --help >"$out/help" 2>&1 || true
expect_in "$out/help" "prune.heads"
"$bin" run.dir="$out/heads" data.path="$out/text.txt" data.block_size=$T data.stride=256 data.batch_size=16 \
  model.n_layer=$L model.n_head=$H model.n_embd=$D trainer.epochs=2 trainer.threads=1 trainer.progress=false \
  sched.warmup_epochs=0 sample.length=16 prune.epochs=[1] prune.heads=0.5 prune.ratio=0 prune.timing_steps=0 \
  >"$out/heads.out" 2>&1 || { cat "$out/heads.out"; fail "the head-pruning run failed"; }
python3 - "$out/heads" $L $D $T <<'PY'
import json, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1]); L, d, T = map(int, sys.argv[2:5])
steps = [json.loads(l) for l in (run / "pruning.jsonl").read_text().splitlines()]
check(len(steps) == 1 and steps[0]["heads_ratio"] == 0.5 and steps[0]["epoch"] == 1, steps)
shapes = {s["name"]: (s["before"], s["after"]) for s in steps[0]["shapes"]}
for i in range(L):
    check(shapes[f"blocks.{i}.attn.qkv.weight"] == ([3 * d, d], [3 * d // 2, d]), shapes)
    check(shapes[f"blocks.{i}.attn.proj.weight"] == ([d, d], [d, d // 2]), shapes)
check(not any(".fc." in n for n in shapes), shapes)  # prune.ratio=0: the MLPs stay whole
plan = json.loads((run / "pruning_plan.json").read_text())
check(plan["version"] == 2 and [len(h["keep"]) for h in plan["heads"]] == [1] * L, plan)
s = json.loads((run / "summary.json").read_text())
A = d // 2  # the attention's inner width after pruning
expected = 3 * (L * (2 * (3 * d * A + A * d + 8 * d * d) + 2 * 2 * T * A) + 2 * d * 256)
check(s["flops_per_token"] == expected, (s["flops_per_token"], expected))
print("head pruning OK")
PY
set +e
"$bin" run.dir="$out/bad_heads" data.path="$out/text.txt" prune.heads=1 2>"$out/err_heads"; rc=$?
set -e
expect_rc 2 "$rc" "prune.heads=1"
expect_in "$out/err_heads" "prune.heads"

# Bad input: a missing data.path and a text too short for the block size (exit 1, clear messages).
printf 'too short\n' >"$out/short.txt"
set +e
"$bin" run.dir="$out/bad1" data.path="$out/nowhere" 2>"$out/err1"; rc1=$?
"$bin" run.dir="$out/bad2" data.path="$out/short.txt" 2>"$out/err2"; rc2=$?
set -e
cat "$out/err1" "$out/err2"
expect_rc 1 "$rc1" "a missing data.path"
expect_in "$out/err1" "apt install fortunes"
expect_in "$out/err1" "data.path="
expect_rc 1 "$rc2" "a text too short for the block size"
expect_in "$out/err2" "too short for data.block_size"
echo "char_gpt_subset: OK"
