#!/usr/bin/env bash
# torchrun launches a recipe data-parallel, unchanged: 2 ranks on the CPU
# (Gloo), connected through torchrun's agent store; only rank 0 writes the
# run folder; the epoch's training samples are summed over ranks; a run
# stopped after epoch 1 (8 steps) and resumed starts at step 8 and ends exactly
# where the straight run does.
set -euo pipefail
torchrun="$1"; bin="$2"; root="$3"; out="$4"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"
common=(data.root="$root" data.train_subset=2500 data.val_size=500 data.test_subset=500 trainer.device=cpu
        trainer.threads=1 trainer.log_every=5 trainer.progress=false sched.name=constant)
launch() { "$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${common[@]}" "$@"; }
launch run.dir="$out/run" trainer.epochs=2 >"$out/stdout" 2>"$out/stderr" || {
  echo "torchrun failed:"; cat "$out/stdout" "$out/stderr"; exit 1; }
# resume=auto before there is a checkpoint: says so and starts afresh.
launch run.dir="$out/resumed" trainer.epochs=1 trainer.resume=auto >"$out/stdout1" 2>"$out/stderr1" || {
  cat "$out/stderr1"; exit 1; }
launch run.dir="$out/resumed" trainer.epochs=2 trainer.resume=auto >"$out/stdout2" 2>"$out/stderr2" || {
  cat "$out/stderr2"; exit 1; }
cat "$out/stdout"
expect_in "$out/stderr" "x 2 ranks (gloo)"
expect_in "$out/stderr1" "trainer.resume=auto: no checkpoint at $out/resumed/checkpoints/last.pt; starting a fresh run"
expect_in "$out/stderr2" "resuming from $out/resumed/checkpoints/last.pt: epoch 1, batch 0, step 8\$"
python3 - "$out/run" <<'PY'
import json, pathlib, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
check(s["test_accuracy"] > 0.5 and s["epochs"] == 2 and s["steps"] == 16, s)  # 1000 samples per rank / 128: 8 steps per epoch
cfg = (run / "config.toml").read_text()
check("world_size = 2" in cfg, cfg)
records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
epochs = [r for r in records if r["kind"] == "train_epoch"]
# One writer (rank 0): two epoch records, each counting both ranks' 1000 samples.
check([r["samples"] for r in epochs] == [2000, 2000], epochs)
steps = [r for r in records if r["kind"] == "step"]
check([r["step"] for r in steps] == [5, 10, 15], steps)
check((run / "checkpoints" / "last.pt").is_file(), f"no {run / 'checkpoints' / 'last.pt'}")
check("resumed_at_step" not in s, f"a straight run reports no resume: {s}")
r = json.loads((run.parent / "resumed" / "summary.json").read_text())
check(r.get("resumed_at_step") == 8, f"resumed after epoch 1 (8 steps): {r}")
check(r["steps"] == 16, r)
# Bitwise: the resumed run is the same computation as the straight one (the same 2 ranks, shapes, thread
# count and machine, from the checkpoint's exact state).
check(r["test_loss"] == s["test_loss"] and r["test_accuracy"] == s["test_accuracy"], (r, s))
print("torchrun recipe OK:", s["test_accuracy"], len(steps), "step records; resumed run equal:", r["test_loss"])
PY
