#!/usr/bin/env bash
# End to end: fashion_mnist on a subset of the real data; checks the run
# folder (summary.json fields, metrics.jsonl, resolved config) and bad input.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
rm -rf "$out"; mkdir -p "$out"
if [[ ! -f "$root/train-images-idx3-ubyte.gz" ]]; then echo "SKIP: $root missing"; exit 0; fi

"$bin" run.dir="$out/run" data.root="$root" data.train_subset=6000 data.test_subset=2000 data.val_size=1000 \
  trainer.epochs=2 trainer.log_every=10 trainer.progress=true early_stop.patience=3 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
grep -q '^test_accuracy=' "$out/stdout"
python3 - "$out/run" <<'PY'
import json, sys, pathlib
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
for key in ["test_accuracy", "test_loss", "epochs", "train_seconds", "samples_per_second", "device", "precision", "parameters"]:
    assert key in s, f"summary.json lacks {key}: {s}"
assert s["epochs"] == 2 and s["precision"] == "fp32" and s["device"] == "cpu", s
assert 0.70 < s["test_accuracy"] <= 1.0, f"2 epochs on 5000 images should beat 0.70: {s}"
assert s["parameters"] == 218586, s
assert 0.0 <= s["val_accuracy"] <= 1.0
lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
kinds = [l["kind"] for l in lines]
assert kinds.count("train_epoch") == 2 and kinds.count("val") == 2, kinds
assert kinds.count("step") == 2 * 40 // 10, kinds   # 5000 / 128 -> 40 steps per epoch
assert all(l["loss"] > 0 for l in lines)
cfg = (run / "config.toml").read_text()
assert "train_subset = 6000" in cfg and "epochs = 2" in cfg, cfg
assert (run / "checkpoints" / "last.pt").stat().st_size > 100000
print("run folder OK:", s["test_accuracy"])
PY
# Not a terminal: the progress output has no control characters.
if LC_ALL=C grep -q $'[\r\x1b]' "$out/stderr"; then echo "control characters in non-tty progress output"; exit 1; fi
grep -q '^epoch 2/2: train loss' "$out/stderr"

# Bad input: an unknown key (exit 2, with a suggestion) and a wrong data root (exit 1).
set +e
"$bin" run.dir="$out/bad" trainer.epoch=3 2>"$out/err1"; rc1=$?
"$bin" run.dir="$out/bad" data.root="$out/nowhere" 2>"$out/err2"; rc2=$?
set -e
[[ $rc1 -eq 2 ]] && grep -q "did you mean 'trainer.epochs'" "$out/err1"
[[ $rc2 -eq 1 ]] && grep -q "set data.root" "$out/err2"
echo "recipe_subset: OK"
