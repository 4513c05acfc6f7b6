#!/usr/bin/env bash
# A recipe under torchrun with dist.sharding=parameters and activation
# checkpointing (char_gpt, 2 Gloo ranks, a tiny model), stopped after 10
# steps, resumed in ONE process with the per-rank batch doubled (the samples
# per step unchanged) and no sharding, ends where one process training
# straight through ends (its weights, to a bound derived from float32
# rounding: the recipe trains in float32; dist.sharding checks the same
# resume in float64, tightly); its checkpoint exports as one safetensors file
# with every parameter; summary.json reports the bytes each rank kept.
# Then the tools: bs-find measures one rank of N (bs_find.world_size) with
# sharding and checkpointing on, and refuses sharding without N; --measure
# measures each checkpointing mode, from which the planner predicts the peak
# at another batch (within 15% of the measured one).
set -euo pipefail
torchrun="$1"; bin="$2"; out="$3"; plan="$4"; py="$5"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
python3 - "$out/text.txt" <<'PY'
import random, sys
r = random.Random(1)
words = "the a cat dog sat on mat ran to house and saw big small red tree bird sang river".split()
open(sys.argv[1], "w").write("\n".join(" ".join(r.choice(words) for _ in range(8)) for _ in range(2500)) + "\n")
PY
common=(data.path="$out/text.txt" data.block_size=32 model.n_layer=3 model.n_head=2 model.n_embd=32
        trainer.threads=1 trainer.progress=false sched.name=constant sched.warmup_epochs=0 sample.length=16
        trainer.val_every=1000)
# One process, 20 steps of 32 sequences.
"$bin" "${common[@]}" run.dir="$out/straight" data.batch_size=32 trainer.max_steps=20 \
  >"$out/straight.out" 2>"$out/straight.err" || { cat "$out/straight.err"; exit 1; }
# 2 ranks x 16, parameters sharded, blocks checkpointed: 10 steps, then a stop.
"$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${common[@]}" run.dir="$out/sharded" \
  data.batch_size=16 trainer.max_steps=10 dist.sharding=parameters model.activation_checkpoint_every=1 \
  >"$out/sharded.out" 2>"$out/sharded.err" || { cat "$out/sharded.out" "$out/sharded.err"; exit 1; }
expect_in "$out/sharded.err" "x 2 ranks (gloo)"
cp "$out/sharded/summary.json" "$out/sharded_part.json"  # (the resume writes its own)
# One process x 32 continues it to step 20.
"$bin" "${common[@]}" run.dir="$out/sharded" data.batch_size=32 trainer.max_steps=20 trainer.resume=auto \
  >"$out/resumed.out" 2>"$out/resumed.err" || { cat "$out/resumed.err"; exit 1; }
expect_in "$out/resumed.err" "resuming from $out/sharded/checkpoints/last.pt: .*step 10"
expect_in "$out/resumed.err" "dist.world_size: 2 -> 1"
"$bin" "${common[@]}" --export "$out/model.safetensors" trainer.resume="$out/sharded" \
  >"$out/export.out" 2>"$out/export.err" || { cat "$out/export.err"; exit 1; }
"$bin" "${common[@]}" --export "$out/straight.safetensors" trainer.resume="$out/straight" \
  >"$out/export.out" 2>"$out/export.err" || { cat "$out/export.err"; exit 1; }
"$py" - "$out" "$here/../tolerance.py" <<'PY'
import importlib.util, json, math, pathlib, struct, sys
from safetensors.torch import load_file
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
spec = importlib.util.spec_from_file_location("tolerance", sys.argv[2])
tol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tol)
out = pathlib.Path(sys.argv[1])
straight = json.loads((out / "straight" / "summary.json").read_text())
sharded = json.loads(((out / "sharded" / "summary.json").read_text()))
check(sharded["steps"] == 20 and sharded.get("resumed_at_step") == 10, sharded)
# Not the same computation: 10 steps on 2 ranks x 16 (sharded, other GEMM shapes, sums over ranks) against
# 1 x 32, so a bound (tolerance.adamw_bound): the longest float32 reduction whose order differs is the
# clip's squared norm over all P parameters (trainer.clip_grad_norm=1: per shard, then over ranks, against
# per tensor), n = P; AdamW (lr 5e-3, betas 0.9 and 0.99, weight decay 0.1) carries the moments' error
# into every one of the 20 steps.
a, b = load_file(out / "model.safetensors"), load_file(out / "straight.safetensors")
P = sum(t.numel() for t in b.values())
limit = tol.adamw_bound(tol.EPS32, n=P, steps=20, lr=5e-3, betas=(0.9, 0.99), weight_decay=0.1,
                        max_weight=max(t.abs().max().item() for t in b.values()))
d, at = tol.max_abs(a, b)
rel = abs(sharded["val_loss"] - straight["val_loss"]) / straight["val_loss"]
check(d <= limit, f"resumed at another world size: {at} differs by {d:.2e} from one process straight through "
                  f"(bound {limit:.1e}; val_loss {sharded['val_loss']} vs {straight['val_loss']})")
print(f"sharded 2 ranks -> 1 process: weights within {d:.1e} of one process straight through (bound {limit:.1e}), "
      f"val_loss {sharded['val_loss']:.6f} vs {straight['val_loss']:.6f} ({rel:.1e})")
# The export: a safetensors header naming every parameter (tied wte once).
raw = (out / "model.safetensors").read_bytes()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
names = [k for k in header if k != "__metadata__"]
check("wte.weight" in names and "blocks.2.fc.weight" in names, names)
elements = sum(math.prod(header[k]["shape"]) for k in names)
check(elements >= straight["parameters"], (elements, straight["parameters"]))
# The sharded part's summary: each rank kept about half of AdamW's two moments (8 bytes a parameter).
part = json.loads((out / "sharded_part.json").read_text())["monitor"]
share = part["sharded_optimizer_state_bytes_per_rank"] / (8 * straight["parameters"])
check(0.49 < share < 0.56, f"optimizer state per rank: {share:.3f} of the whole ({part})")
check(part["sharded_parameter_bytes_per_rank"] < 4 * straight["parameters"], part)  # the blocks' shards only
print(f"export: {len(names)} tensors, {elements} elements; optimizer state per rank {share:.3f}")
PY

# bs-find, one rank of 2, batch 16 only: DDP, then ZeRO-3 with checkpointing.
tiny=("${common[@]}" trainer.precision=fp32 bs_find.start=16 bs_find.max_batch=16)
# (with a stated budget and communication reserve: the budget is their difference)
"$bin" --find-batch-size "$out/bs_ddp.json" "${tiny[@]}" bs_find.world_size=2 bs_find.budget_gib=4 \
  bs_find.comm_reserve_gib=0.5 >"$out/bs.out" 2>"$out/bs.err" || { cat "$out/bs.err"; exit 1; }
expect_in "$out/bs.err" "one rank of 2 (dist.sharding=none)"
"$bin" --find-batch-size "$out/bs_z3.json" "${tiny[@]}" bs_find.world_size=2 dist.sharding=parameters \
  model.activation_checkpoint_every=1 >"$out/bs.out" 2>"$out/bs.err" || { cat "$out/bs.err"; exit 1; }
set +e
"$bin" --find-batch-size "$out/bs_refused.json" "${tiny[@]}" dist.sharding=optimizer >"$out/bs.out" 2>"$out/bs.err"
rc=$?
set -e
[[ $rc == 2 ]] || { echo "bs-find with dist.sharding and no bs_find.world_size: exit $rc, want 2"; exit 1; }
expect_in "$out/bs.err" "say how many with bs_find.world_size=N"
# --measure with the checkpointing modes, and a check at batch 48 with full checkpointing.
meas=("${common[@]}" trainer.precision=fp32 plan.precisions=fp32 plan.timed_steps=1 plan.probe_small=8
      plan.probe_large=16)
"$bin" --measure "$out/measure.json" "${meas[@]}" data.batch_size=16 >"$out/m.out" 2>"$out/m.err" \
  || { cat "$out/m.err"; exit 1; }
"$bin" --measure "$out/verify_full.json" "${meas[@]}" data.batch_size=48 plan.verify=true \
  plan.activation_checkpoint=false model.activation_checkpoint_every=1 >"$out/m.out" 2>"$out/m.err" \
  || { cat "$out/m.err"; exit 1; }
"$py" "$plan" "$out/measure.json" --activation-checkpoint all --json >"$out/plan.json" 2>"$out/plan.err" \
  || { cat "$out/plan.err"; exit 1; }
python3 - "$out" <<'PY'
import json, pathlib, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
out = pathlib.Path(sys.argv[1])
ddp, z3 = (json.loads((out / f).read_text()) for f in ("bs_ddp.json", "bs_z3.json"))
check(ddp["world_size"] == 2 and z3["sharding"] == "parameters" and z3["activation_checkpoint_every"] == 1, z3)
check(ddp["budget_bytes"] == int(3.5 * 2**30) and "bs_find.comm_reserve_gib" in ddp["budget_source"], ddp)
check("comm_reserve" not in z3["budget_source"], z3["budget_source"])  # the CPU: no NCCL, no reserve
peak = lambda j: j["trials"][0]["peak_bytes"]
check(0 < peak(z3) < 0.8 * peak(ddp), f"one rank of 2 at batch 16: ZeRO-3 + checkpointing {peak(z3)} B, DDP {peak(ddp)} B")
m = json.loads((out / "measure.json").read_text())
check(m["activation_checkpoint"] == "none" and m["activation_checkpoint_every"] == 0, m.get("activation_checkpoint"))
modes = m["memory"]["fp32"]["activation_checkpoint"]
check(set(modes) == {"full", "light"}, modes)
none_a = m["memory"]["fp32"]["per_sample_bytes"]
check(modes["full"]["per_sample_bytes"] < modes["light"]["per_sample_bytes"] < none_a, (modes, none_a))
acts = json.loads((out / "plan.json").read_text())["configurations"]["activations"]["fp32"]
check(acts["full"]["source"] == "measured", acts["full"])
v = json.loads((out / "verify_full.json").read_text())["verify"]
predicted = acts["full"]["fixed_bytes"] + acts["full"]["per_sample_bytes"] * v["batch"]
err = (predicted - v["measured_peak_bytes"]) / v["measured_peak_bytes"]
check(abs(err) < 0.15, f"full checkpointing at batch {v['batch']}: planned {predicted:.0f} B, measured "
                       f"{v['measured_peak_bytes']} B ({100 * err:+.1f}%)")
print(f"bs-find one rank of 2 at batch 16: ZeRO-3 + checkpointing {peak(z3) / 2**20:.1f} MiB vs DDP "
      f"{peak(ddp) / 2**20:.1f} MiB; planned full checkpointing at batch {v['batch']} {100 * err:+.1f}% off the measured")
PY
