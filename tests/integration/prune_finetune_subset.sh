#!/usr/bin/env bash
# End to end: prune_finetune on 2000 Fashion-MNIST images (dense 1 epoch,
# prune half the channels, fine-tune 1 epoch). Checks the final line,
# summary.json (MACs at least 2x fewer, accuracies present), the plan and the
# per-step report, that a longer fine-tuning resumes from the pruned
# checkpoint (the plan replayed on a freshly built model, no second pruning
# step), and that a bad prune.* value fails before any training.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
rm -rf "$out"; mkdir -p "$out"
args=(data.root="$root" data.train_subset=2000 data.test_subset=500 trainer.epochs=1 prune.timing_steps=2
      trainer.threads=1 trainer.progress=false run.dir="$out/run")

"$bin" "${args[@]}" finetune.epochs=1 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
grep -q '^pruning step 1 of 1 at epoch 0' "$out/stdout"
grep -q '^prune_finetune: dense test accuracy .* -> pruned and fine-tuned' "$out/stdout"
python3 - "$out/run" 1 <<'PY'
import json, sys, pathlib
run = pathlib.Path(sys.argv[1]); finetune_epochs = int(sys.argv[2])
s = json.loads((run / "summary.json").read_text())
assert s["recipe"] == "prune_finetune", s
assert s["macs_ratio"] >= 2.0, s["macs_ratio"]
assert 0.0 <= s["dense_test_accuracy"] <= 1.0 and 0.0 <= s["test_accuracy"] <= 1.0, s
assert s["train_step_speedup"] > 0 and s["inference_speedup"] > 0, s
assert s["epochs"] == 1 + finetune_epochs, s["epochs"]
plan = json.loads((run / "finetune" / "pruning_plan.json").read_text())
assert plan["format"] == "ember.pruning_plan" and plan["entries"], plan
stem = [e for e in plan["entries"] if e["name"] == "stem.0.weight" and e["dim"] == 0][0]
assert stem["size"] == 16 and len(stem["keep"]) == 8, stem
steps = [json.loads(l) for l in (run / "finetune" / "pruning.jsonl").read_text().splitlines()]
assert len(steps) == 1 and steps[0]["macs_after"] < steps[0]["macs_before"], steps
print("summary and plan ok")
PY

# One more fine-tuning epoch: resumes the pruned checkpoint (plan replayed first).
"$bin" "${args[@]}" finetune.epochs=2 trainer.resume=auto >"$out/stdout2" 2>"$out/stderr2"
cat "$out/stdout2"
if grep -q '^pruning step' "$out/stdout2"; then echo "pruned again on resume" >&2; exit 1; fi
python3 - "$out/run" 2 <<'PY'
import json, sys, pathlib
s = json.loads((pathlib.Path(sys.argv[1]) / "summary.json").read_text())
assert s["epochs"] == 1 + int(sys.argv[2]), s["epochs"]
assert s["parameters"] < 100000, s["parameters"]
print("resume ok")
PY

# Bad input fails fast with a clear message.
if "$bin" "${args[@]}" run.dir="$out/bad" prune.importance=l3 >"$out/bad.out" 2>"$out/bad.err"; then
  echo "prune.importance=l3 was accepted" >&2; exit 1
fi
grep -q "unknown importance 'l3'" "$out/bad.err"
[[ ! -f "$out/bad/checkpoints/last.pt" ]]
echo "prune_finetune subset ok"
