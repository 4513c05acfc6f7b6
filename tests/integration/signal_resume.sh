#!/usr/bin/env bash
# SIGINT mid-training saves a checkpoint and exits 130; resuming with
# trainer.resume=auto finishes the run.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
rm -rf "$out"; mkdir -p "$out"
if [[ ! -f "$root/train-images-idx3-ubyte.gz" ]]; then echo "SKIP: $root missing"; exit 0; fi
args=(run.dir="$out/run" data.root="$root" data.train_subset=20000 data.test_subset=1000 trainer.epochs=3 trainer.progress=false)

"$bin" "${args[@]}" >"$out/stdout1" 2>"$out/stderr1" &
pid=$!
# Wait until training is under way (the first step records appear), then interrupt.
for _ in $(seq 1 600); do
  [[ -s "$out/run/metrics.jsonl" ]] && break
  sleep 0.1
done
kill -INT "$pid"
set +e; wait "$pid"; rc=$?; set -e
cat "$out/stderr1"
[[ $rc -eq 130 ]] || { echo "expected exit 130 after SIGINT, got $rc"; exit 1; }
grep -q "resume with: run.dir=" "$out/stderr1"
[[ -f "$out/run/checkpoints/last.pt" ]]
[[ ! -f "$out/run/summary.json" ]]
ls "$out/run/checkpoints" | grep -q '\.tmp\.' && { echo "temporary file left behind"; exit 1; }

"$bin" "${args[@]}" trainer.resume=auto >"$out/stdout2" 2>"$out/stderr2"
cat "$out/stdout2"
python3 -c "import json,sys; s=json.load(open('$out/run/summary.json')); assert s['epochs']==3 and s['test_accuracy']>0.7, s"
echo "signal_resume: OK"
