#!/usr/bin/env bash
# End to end: prune_finetune on 2000 Fashion-MNIST images (dense 1 epoch,
# prune half the channels, fine-tune 1 epoch). Checks the final line,
# summary.json (MACs at least 2x fewer, accuracies present), the plan and the
# per-step report, that a longer fine-tuning resumes from the pruned
# checkpoint (the plan replayed on a freshly built model, no second pruning
# step; summary.json still reports that step's MACs and speed-ups, as in
# pruning.jsonl), and that a bad prune.* value fails before any training.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"
args=(data.root="$root" data.train_subset=2000 data.test_subset=500 trainer.epochs=1 prune.timing_steps=2
      trainer.threads=1 trainer.progress=false run.dir="$out/run")

"$bin" "${args[@]}" finetune.epochs=1 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
expect_in "$out/stdout" '^pruning step 1 of 1 at epoch 0'
expect_in "$out/stdout" '^prune_finetune: dense test accuracy .* -> pruned and fine-tuned'
python3 - "$out/run" 1 <<'PY'
import json, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1]); finetune_epochs = int(sys.argv[2])
s = json.loads((run / "summary.json").read_text())
check(s["recipe"] == "prune_finetune", s)
check(s["macs_ratio"] >= 2.0, s["macs_ratio"])
check(0.0 <= s["dense_test_accuracy"] <= 1.0 and 0.0 <= s["test_accuracy"] <= 1.0, s)
check(s["train_step_speedup"] > 0 and s["inference_speedup"] > 0, s)
check(s["epochs"] == 1 + finetune_epochs, s["epochs"])
plan = json.loads((run / "finetune" / "pruning_plan.json").read_text())
check(plan["format"] == "ember.pruning_plan" and plan["entries"], plan)
stem = [e for e in plan["entries"] if e["name"] == "stem.0.weight" and e["dim"] == 0][0]
check(stem["size"] == 16 and len(stem["keep"]) == 8, stem)
steps = [json.loads(l) for l in (run / "finetune" / "pruning.jsonl").read_text().splitlines()]
check(len(steps) == 1 and steps[0]["macs_after"] < steps[0]["macs_before"], steps)
print("summary and plan ok")
PY

# One more fine-tuning epoch: both phases resume (the dense one is complete and
# trains nothing; the fine-tuning replays the plan, then trains epoch 2 only).
# finetune.epochs changes the fine-tuning schedule: refused unless allowed.
steps=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['steps'])" "$out/run/summary.json")
set +e
"$bin" "${args[@]}" finetune.epochs=2 trainer.resume=auto >"$out/stdout_refused" 2>"$out/stderr_refused"
rc=$?
set -e
expect_rc 2 "$rc" "a resume with a changed finetune.epochs"
expect_in "$out/stderr_refused" "finetune.epochs: 1 -> 2"
expect_in "$out/stderr_refused" "run.allow_changes=true"
"$bin" "${args[@]}" finetune.epochs=2 trainer.resume=auto run.allow_changes=true >"$out/stdout2" 2>"$out/stderr2"
cat "$out/stdout2"
expect_in "$out/stderr2" "resuming with changed keys: finetune.epochs: 1 -> 2"
ls "$out/run"/config.resume-*.toml >/dev/null || fail "the resumed run's keys were not kept beside config.toml"
grep -q "^epochs = 1" <(sed -n '/^\[finetune\]/,/^\[/p' "$out/run/config.toml") || fail "config.toml was overwritten"
if grep -q '^pruning step' "$out/stdout2"; then fail "pruned again on resume"; fi
expect_in "$out/stderr2" "resuming from $out/run/checkpoints/last.pt: epoch 1, batch 0, step $steps\$"
expect_in "$out/stderr2" "resuming from $out/run/finetune/checkpoints/last.pt: epoch 1, batch 0, step $steps\$"
python3 - "$out/run" 2 "$steps" <<'PY'
import json, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
import math
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
check(s["epochs"] == 1 + int(sys.argv[2]), s["epochs"])
check(s["parameters"] < 100000, s["parameters"])
check(s.get("resumed_at_step") == int(sys.argv[3]), f"resumed after {sys.argv[3]} steps: {s}")
# The pruning step ran before the resume: its numbers come back from the checkpoint.
step = json.loads((run / "finetune" / "pruning.jsonl").read_text().splitlines()[0])
# Bitwise: the recipe divides the same doubles (whole in both JSON files; the checkpoint keeps them whole).
check(s["macs_ratio"] == step["macs_before"] / step["macs_after"] and s["macs_ratio"] >= 2.0, s)
check(s["params_ratio"] == step["params_before"] / step["params_after"], s)
check(s["train_step_speedup"] == step["train_step_ms_before"] / step["train_step_ms_after"], s)
check(s["inference_speedup"] == step["infer_ms_before"] / step["infer_ms_after"], s)
print("resume ok")
PY

# With accumulation the fine-tuning's cosine spans its optimizer steps (batches
# / k), not its batches: the last step's rate is near the schedule's end (0),
# not halfway down (issue 30: it spanned k times too many steps).
"$bin" "${args[@]}" run.dir="$out/accum" finetune.epochs=1 trainer.accumulate_grad_batches=2 \
  trainer.log_every=1 >"$out/accum.out" 2>"$out/accum.err" || { cat "$out/accum.err"; fail "accumulation run"; }
python3 - "$out/accum" <<'PY'
import json, pathlib, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
cfg = (run / "config.toml").read_text()
base = float([l for l in cfg.split("[finetune]")[1].splitlines() if l.startswith("lr = ")][0].split("=")[1])
steps = [json.loads(l) for l in (run / "finetune" / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in steps if r["kind"] == "step"]
check(len(steps) == 8, f"2000 samples / 128 = 16 batches, 8 optimizer steps: {len(steps)}")
check(steps[-1]["lr"] < 0.1 * base, f"the last step's rate {steps[-1]['lr']} is not near the end of the cosine (base {base})")
print("accumulation: the fine-tuning schedule spans its", len(steps), "steps; last rate", steps[-1]["lr"])
PY

# A latency target: pruned until the measured inference at batch 32 is 1.3x
# faster, channels at the CPU's multiple (prune.round_to=0); the per-layer
# table is written and a second run reads it instead of timing again.
lat=(run.dir="$out/latency" finetune.epochs=1 prune.target=latency prune.speedup=1.3 prune.latency_batch=32
     prune.round_to=0 prune.latency_table="$out/latency.json")
"$bin" "${args[@]}" "${lat[@]}" >"$out/latency.out" 2>"$out/latency.err" || { cat "$out/latency.err"; fail "latency run"; }
expect_in "$out/latency.out" "latency target 1.30x of the dense model's inference at batch 32"
expect_in "$out/latency.out" "latency target 1.30x: .* measured"
python3 - "$out/latency" "$out/latency.json" "$out/latency.err" <<'PY'
import json, pathlib, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
check(s["latency_goal_speedup"] == 1.3 and s["latency_ms_before"] > 0 and s["latency_ms_after"] > 0, s)
# The recipe divides the microseconds; here the milliseconds (each us / 1e3, rounded): 3 roundings of a
# float64 quotient, so within 2 eps64 of it.
check(abs(s["latency_speedup"] - s["latency_ms_before"] / s["latency_ms_after"])
      <= 2 * 2.0 ** -52 * s["latency_speedup"], s)
check(s["round_to"] in (1, 8, 16), s)
# Met: pruned, and within the 3% tolerance of 1.3x. Not met (this machine too loaded, beside the suite's
# other tests, for a width's gain to stand out of the timing noise): said, with its reason, on stderr.
if s["latency_goal_met"] == 1.0:
    check(s["macs_after"] < s["macs_before"] and s["latency_speedup"] >= 1.3 / 1.03, s)
else:
    err = pathlib.Path(sys.argv[3]).read_text()
    check("prune_finetune: warning: the latency target 1.30x was" in err, err[-2000:])
step = json.loads((run / "finetune" / "pruning.jsonl").read_text().splitlines()[0])
check(step["speedup_goal"] == 1.3 and step["latency_batch"] == 32 and step["latency_us_after"] > 0, step)
# Every pruned width is a multiple of round_to (or the group's smallest).
plan = json.loads((run / "finetune" / "pruning_plan.json").read_text())
r = int(s["round_to"])
check(all(len(e["keep"]) % r == 0 for e in plan["entries"] if e["name"].endswith(".weight") and e["dim"] == 0), plan)
table = json.loads(pathlib.Path(sys.argv[2]).read_text())
keys = list(table["entries"])
check(table["version"] == 1 and keys and all(k.startswith("cpu ") and " | Float | " in k for k in keys), keys[:3])
print(f"latency target: {s['latency_speedup']:.2f}x measured (goal 1.3x, {'met' if s['latency_goal_met'] else 'missed'}), "
      f"{len(keys)} table entries, round_to {r}")
PY
if "$bin" "${args[@]}" run.dir="$out/bad_target" prune.target=speed >"$out/bad_target.out" 2>"$out/bad_target.err"; then
  fail "prune.target=speed was accepted"
fi
expect_in "$out/bad_target.err" "unknown prune.target 'speed'"
if "$bin" "${args[@]}" run.dir="$out/bad_target" prune.target=latency prune.target_macs=0.5 \
    >"$out/bad_target.out" 2>"$out/bad_target.err"; then
  fail "prune.target=latency with prune.target_macs was accepted"
fi
expect_in "$out/bad_target.err" "prune.target=latency and prune.target_macs=0.5 both set"
[[ ! -f "$out/bad_target/checkpoints/last.pt" ]] || fail "a refused prune.target trained before failing"

# Bad input fails fast with a clear message.
if "$bin" "${args[@]}" run.dir="$out/bad" prune.importance=l3 >"$out/bad.out" 2>"$out/bad.err"; then
  fail "prune.importance=l3 was accepted"
fi
expect_in "$out/bad.err" "unknown importance 'l3'"
[[ ! -f "$out/bad/checkpoints/last.pt" ]] || fail "prune.importance=l3 trained before failing"
echo "prune_finetune subset ok"
