#!/usr/bin/env bash
# End to end: fashion_mnist on a subset of the real data; checks the run
# folder (summary.json fields, metrics.jsonl, resolved config) and bad input.
set -euo pipefail
bin="$1"; root="$2"; out="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"

"$bin" run.dir="$out/run" data.root="$root" data.train_subset=6000 data.test_subset=2000 data.val_size=1000 \
  trainer.epochs=2 trainer.log_every=10 trainer.progress=true early_stop.patience=3 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
expect_in "$out/stdout" '^test_accuracy='
python3 - "$out/run" <<'PY'
import json, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
for key in ["test_accuracy", "test_loss", "epochs", "train_seconds", "samples_per_second", "device", "precision", "parameters"]:
    check(key in s, f"summary.json lacks {key}: {s}")
check(s["epochs"] == 2 and s["precision"] == "fp32" and s["device"] == "cpu", s)
check(0.70 < s["test_accuracy"] <= 1.0, f"2 epochs on 5000 images should beat 0.70: {s}")
check(s["parameters"] == 218586, s)
check(0.0 <= s["val_accuracy"] <= 1.0, s)
lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
kinds = [l["kind"] for l in lines]
check(kinds.count("train_epoch") == 2 and kinds.count("val") == 2, kinds)
check(kinds.count("step") == 2 * 40 // 10, kinds)   # 5000 / 128 -> 40 steps per epoch
check(all(l["loss"] > 0 for l in lines), [l for l in lines if not l["loss"] > 0])
cfg = (run / "config.toml").read_text()
check("train_subset = 6000" in cfg and "epochs = 2" in cfg, cfg)
size = (run / "checkpoints" / "last.pt").stat().st_size
check(size > 100000, f"checkpoints/last.pt is only {size} bytes")
print("run folder OK:", s["test_accuracy"])
PY
# Not a terminal: the progress output has no control characters.
if LC_ALL=C grep -q $'[\r\x1b]' "$out/stderr"; then fail "control characters in non-tty progress output"; fi
expect_in "$out/stderr" '^epoch 2/2: train loss'

# Bad input: an unknown key (exit 2, with a suggestion) and a wrong data root (exit 1).
set +e
"$bin" run.dir="$out/bad" trainer.epoch=3 2>"$out/err1"; rc1=$?
"$bin" run.dir="$out/bad" data.root="$out/nowhere" 2>"$out/err2"; rc2=$?
set -e
expect_rc 2 "$rc1" "an unknown key (trainer.epoch)"
expect_in "$out/err1" "did you mean 'trainer.epochs'"
expect_rc 1 "$rc2" "a wrong data.root"
expect_in "$out/err2" "set data.root"
echo "recipe_subset: OK"
