#!/usr/bin/env bash
# End to end: cifar_resnet on small generated CIFAR-10 files in the real
# binary format, with augmentation (padded crops, flips, colour, erasing)
# and CutMix/Mixup; checks the run folder and that a truncated file is a
# clear error.
set -euo pipefail
bin="$1"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
python3 "$here/make_cifar.py" "$out/data" 100 200 >/dev/null

common=(data.root="$out/data" model.width=8 model.blocks=1 data.batch_size=50 data.eval_batch_size=100
        trainer.epochs=3 trainer.threads=1 optim.lr=0.1)
"$bin" "${common[@]}" run.dir="$out/run" augment.brightness=0.2 augment.saturation=0.2 \
  augment.erase=0.25 >"$out/stdout" 2>"$out/stderr"
cat "$out/stdout"
python3 - "$out/run" <<'PY'
import json, sys, pathlib
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
check(s["epochs"] == 3 and s["device"] == "cpu", s)
check(s["test_accuracy"] > 0.6, f"the generated classes are easy: expected > 0.6, {s}")
cfg = (run / "config.toml").read_text()
check("crop = 'pad'" in cfg and "erase = 0.25" in cfg, cfg)
print("cifar run OK:", s["test_accuracy"])
PY
# CutMix + Mixup with soft targets: trains, and the loss is finite.
"$bin" "${common[@]}" run.dir="$out/mix" trainer.epochs=1 augment.mix.mixup_alpha=0.2 \
  augment.mix.cutmix_alpha=1.0 augment.mix.label_smoothing=0.1 >"$out/mix.stdout" 2>"$out/mix.stderr"
expect_in "$out/mix.stdout" '^test_accuracy='
python3 -c "
import json, math, sys
s = json.load(open(sys.argv[1]))
if not math.isfinite(s['test_loss']):
    sys.exit(f'FAILED: test_loss is not finite: {s}')" "$out/mix/summary.json"

# A bad augmentation key value (a config error: exit 2, as README.md promises), then a truncated
# file (exit 1); each message says what and where.
set +e
"$bin" "${common[@]}" run.dir="$out/bad2" augment.crop=rotate 2>"$out/err2"; rc2=$?
head -c 5000 "$out/data/cifar-10-batches-bin/test_batch.bin" >"$out/t.bin" && mv "$out/t.bin" "$out/data/cifar-10-batches-bin/test_batch.bin"
"$bin" "${common[@]}" run.dir="$out/bad" 2>"$out/err"; rc=$?
set -e
cat "$out/err"
expect_rc 1 "$rc" "a truncated test_batch.bin"
expect_in "$out/err" "test_batch.bin"
expect_rc 2 "$rc2" "augment.crop=rotate"
expect_in "$out/err2" "augment.crop.*unknown crop mode 'rotate'; choose none, pad or resized"
echo "cifar_resnet_subset: OK"
