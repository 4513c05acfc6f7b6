#!/usr/bin/env bash
# SIGINT mid-training saves a checkpoint and exits 130; resuming with
# trainer.resume=auto starts from the step it stopped at and finishes the run.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"
# A step record every step: the interrupted run's last one is the step it stopped at.
args=(run.dir="$out/run" data.root="$root" data.train_subset=8000 data.test_subset=1000 trainer.epochs=3
      trainer.progress=false trainer.log_every=1)

"$bin" "${args[@]}" >"$out/stdout1" 2>"$out/stderr1" &
pid=$!
# Wait until training is under way (a few step records), then interrupt.
for _ in $(seq 1 1200); do
  if [[ $(grep -c '"kind":"step"' "$out/run/metrics.jsonl" 2>/dev/null || true) -ge 5 ]]; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -INT "$pid" 2>/dev/null || true
set +e; wait "$pid"; rc=$?; set -e
cat "$out/stderr1"
expect_rc 130 "$rc" "SIGINT during training"
expect_in "$out/stderr1" "resume with: run.dir="
[[ -f "$out/run/checkpoints/last.pt" ]] || fail "no checkpoints/last.pt after SIGINT"
[[ ! -f "$out/run/summary.json" ]] || fail "the interrupted run wrote summary.json"
if ls "$out/run/checkpoints" | grep -q '\.tmp\.'; then fail "temporary file left behind"; fi
cp "$out/run/metrics.jsonl" "$out/metrics1.jsonl"  # the resumed run appends to it

"$bin" "${args[@]}" trainer.resume=auto >"$out/stdout2" 2>"$out/stderr2"
cat "$out/stdout2"
python3 - "$out" <<'PY'
import json, pathlib, re, sys
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
out = pathlib.Path(sys.argv[1])
def steps_in(path):
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]
before = steps_in(out / "metrics1.jsonl")
check(before == list(range(1, len(before) + 1)), f"log_every=1: one record per step, got {before}")
stopped = before[-1]
s = json.loads((out / "run" / "summary.json").read_text())
check(s["epochs"] == 3 and s["test_accuracy"] > 0.7, s)
check(s.get("resumed_at_step") == stopped, f"stopped at step {stopped}, but summary.json has {s}")
said = re.findall(r"\[train::Trainer\] resuming from (\S+): epoch \d+, batch \d+, step (\d+)",
                  (out / "stderr2").read_text())
check(said == [(str(out / "run" / "checkpoints" / "last.pt"), str(stopped))],
      f"expected one 'resuming from {out}/run/checkpoints/last.pt: ... step {stopped}' line: {said}")
# The resumed run's records go on from the next step, to the end.
after = steps_in(out / "run" / "metrics.jsonl")[len(before):]
check(after == list(range(stopped + 1, s["steps"] + 1)), (stopped, s["steps"], after[:3], after[-3:]))
print(f"signal_resume: stopped at step {stopped}, resumed there, finished at step {s['steps']}")
PY
echo "signal_resume: OK"
