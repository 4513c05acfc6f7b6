#!/usr/bin/env bash
# prune_finetune on 2 Gloo ranks (torchrun): dense training, pruning (every
# rank the same weights by the same rule; their architectures compared after
# the step), fine-tuning under DDP rebuilt on the pruned parameters. Checks
# the run's summary, the plan, and that the fine-tuning really ran on both
# ranks in step (the optimizer steps of 1000 samples per rank at batch 50);
# dist.sharding and taylor importance with several ranks are refused.
set -euo pipefail
torchrun="$1"; bin="$2"; root="$3"; out="$4"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"
args=(data.root="$root" data.train_subset=2000 data.test_subset=500 data.batch_size=50 trainer.epochs=1
      prune.timing_steps=2 trainer.threads=1 trainer.progress=false finetune.epochs=1 run.dir="$out/run")
"$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${args[@]}" >"$out/stdout" 2>"$out/stderr" \
  || { tail -30 "$out/stderr"; exit 1; }
expect_in "$out/stderr" "x 2 ranks (gloo)"
expect_in "$out/stdout" '^prune_finetune: dense test accuracy .* -> pruned and fine-tuned'
python3 - "$out/run" <<'PY'
import json, pathlib, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
check(s["macs_ratio"] >= 2.0 and 0 <= s["test_accuracy"] <= 1, s)
plan = json.loads((run / "finetune" / "pruning_plan.json").read_text())
check(plan["entries"], plan)
# 2000 samples over 2 ranks at 50: 20 optimizer steps per epoch, dense and fine-tuning alike.
steps = [json.loads(l) for l in (run / "finetune" / "metrics.jsonl").read_text().splitlines()
         if json.loads(l).get("kind") == "train_epoch"]
check(steps and steps[-1]["step"] == 20 and steps[-1]["samples"] == 2000, steps[-1:])
print(f"2 ranks: MACs {s['macs_ratio']:.2f}x fewer, test accuracy {s['test_accuracy']:.4f}")
PY
for bad in dist.sharding=optimizer prune.importance=taylor; do
  set +e
  "$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${args[@]}" run.dir="$out/bad" "$bad" \
    >"$out/bad.out" 2>"$out/bad.err"
  rc=$?
  set -e
  [[ $rc != 0 ]] || fail "$bad on 2 ranks was accepted"
  expect_in "$out/bad.err" "\[prune_finetune\]"
done
echo "dist.sharding and taylor importance refused on 2 ranks"
