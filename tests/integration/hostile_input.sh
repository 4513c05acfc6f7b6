#!/usr/bin/env bash
# Bad input to a recipe (fashion_mnist) on small generated IDX files: every
# bad value is refused before any work (exit 2, the key named, no run folder),
# a label out of range is named with its file and sample before training
# (exit 1), and no LibTorch stack trace reaches the user.
set -euo pipefail
bin="$1"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"

# make_idx DIR BAD_TRAIN_LABEL BAD_TEST_LABEL: 64 training and 32 test images
# of 28x28 in the IDX format; a label >= 0 replaces sample 5's.
make_idx() {
  python3 - "$@" <<'PY'
import gzip, os, random, struct, sys
root, bad_train, bad_test = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
rng = random.Random(0)
def write(name, dims, data):
    with gzip.open(os.path.join(root, name + ".gz"), "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))
for split, n, bad in (("train", 64, bad_train), ("t10k", 32, bad_test)):
    write(f"{split}-images-idx3-ubyte", [n, 28, 28], [rng.randrange(256) for _ in range(n * 784)])
    labels = [i % 10 for i in range(n)]
    if bad >= 0:
        labels[5] = bad
    write(f"{split}-labels-idx1-ubyte", [n], labels)
PY
}
make_idx "$out/good" -1 -1

# no_trace FILE: one or two lines, not LibTorch's C++ frames.
no_trace() {
  if grep -q -e "Exception raised from" -e "frame #" "$1"; then fail "$1 holds a stack trace"; fi
  [[ $(wc -l <"$1") -le 3 ]] || fail "$1: $(wc -l <"$1") lines for one error"
}

# refused CASE PATTERN ARGS...: exit 2, PATTERN in the message, no run folder.
refused() {
  local name="$1" pattern="$2"; shift 2
  local dir="$out/run_$name"
  set +e
  "$bin" run.dir="$dir" data.root="$out/good" trainer.progress=false "$@" >"$out/$name.out" 2>"$out/$name.err"
  local rc=$?
  set -e
  expect_rc 2 "$rc" "$name ($*)"
  expect_in "$out/$name.err" "$pattern"
  no_trace "$out/$name.err"
  [[ ! -e "$dir" ]] || fail "$name: the run folder was created before the value was checked"
}
refused epochs_negative 'trainer.epochs=-1 (command line) is out of range: trainer.epochs must be in \[1, 1000000\]' \
  trainer.epochs=-1
refused epochs_huge 'trainer.epochs=1000000000000000000' trainer.epochs=1000000000000000000
refused batch_zero 'data.batch_size=0 (command line) is out of range' data.batch_size=0
refused lr_zero 'optim.lr must be > 0' optim.lr=0
refused lr_nan 'optim.lr' optim.lr=nan
refused dropout 'model.dropout must be in \[0, 1)' model.dropout=1.5
refused width 'model.width' model.width=100000000
refused subset 'data.train_subset must be >= 0' data.train_subset=-5
refused max_steps 'trainer.max_steps must be in \[-1' trainer.max_steps=-2
refused optimizer_name 'optim.name' optim.name=sgdd
refused hue 'augment.hue must be in \[0, 0.5\]' augment.hue=0.7
refused config_folder 'is a folder, not a config file' --config "$out"
# The tools' keys (lib/src/recipe/tools/keys.cpp): bounds, and keys that bound each other, checked with the rest.
refused lr_find_order 'lr_find.min_lr=1 must be below lr_find.max_lr=0.1' lr_find.min_lr=1 lr_find.max_lr=0.1
refused lr_find_equal 'lr_find.min_lr=0.1 must be below lr_find.max_lr=0.1' lr_find.min_lr=0.1 lr_find.max_lr=0.1
refused lr_find_nan 'lr_find.min_lr' lr_find.min_lr=nan
refused probe_order 'plan.probe_small=64 must be below plan.probe_large=32' plan.probe_small=64
refused bs_find_start 'bs_find.start=64 is above bs_find.max_batch=8' bs_find.start=64 bs_find.max_batch=8
refused budget_huge 'bs_find.budget_gib=1e+300 (command line) is out of range' bs_find.budget_gib=1e300
refused gpu_gib_huge 'bs_find.gpu_memory_gib=1e+300 (command line) is out of range' bs_find.gpu_memory_gib=1e300
refused host_memory_negative 'plan.host_memory_gib=-1.0 (command line) is out of range' plan.host_memory_gib=-1
refused host_memory_huge 'plan.host_memory_gib' plan.host_memory_gib=1e400
refused plan_precision_name 'plan.precisions=fp32, fp8' 'plan.precisions=fp32, fp8'
refused plan_precisions_empty 'plan.precisions is empty' plan.precisions=
refused plan_verify 'plan.verify checks trainer.precision=fp32, which is not among plan.precisions=bf16-mixed' \
  plan.verify=true plan.precisions=bf16-mixed
# ... and in the tool modes, before the data loads: no output file.
refused find_lr_order 'lr_find.min_lr=1 must be below lr_find.max_lr=0.1' --find-lr "$out/lr.json" \
  lr_find.min_lr=1 lr_find.max_lr=0.1
[[ ! -e "$out/lr.json" ]] || fail "find_lr_order: lr.json was written"
refused measure_probes 'plan.probe_small=64 must be below plan.probe_large=32' --measure "$out/m.json" \
  plan.probe_small=64
[[ ! -e "$out/m.json" ]] || fail "measure_probes: m.json was written"
# A bad value in a config file names the file.
printf '[trainer]\nepochs = 0\n' >"$out/bad.toml"
refused config_file "trainer.epochs=0 ($out/bad.toml) is out of range" --config "$out/bad.toml"

# Refused before the run folder exists, although the device, the data or the
# file system decides: the corrected command must not find "a previous run".
refused cuda_graph_cpu 'trainer.cuda_graph=true: the model would be on cpu' trainer.cuda_graph=true \
  trainer.device=cpu
refused val_size 'data.val_size=64 must be in \[0, 64)' data.val_size=64
refused resume_missing "trainer.resume=$out/nothing: no such file or folder" trainer.resume="$out/nothing"
# --check: the same checks, then nothing else.
refused check_typo "unknown key 'optim.lrr'" --check optim.lrr=0.1
"$bin" --check run.dir="$out/run_check" data.root="$out/good" >"$out/check.out" 2>"$out/check.err"
expect_in "$out/check.out" '^fashion_mnist: config ok$'
[[ ! -e "$out/run_check" ]] || fail "--check created the run folder"

# max_steps=0: no step, the model as initialised is tested.
"$bin" run.dir="$out/run_zero" data.root="$out/good" trainer.progress=false trainer.max_steps=0 \
  >"$out/zero.out" 2>"$out/zero.err"
expect_in "$out/zero.out" '^test_accuracy='
python3 - "$out/run_zero/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
if s["steps"] != 0:
    raise AssertionError(f"trainer.max_steps=0 took {s['steps']} steps")
PY

# Labels out of range: named with the file and the sample, before training.
for split in train test; do
  if [[ $split == train ]]; then make_idx "$out/bad_$split" 200 -1; else make_idx "$out/bad_$split" -1 10; fi
  set +e
  "$bin" run.dir="$out/run_bad_$split" data.root="$out/bad_$split" trainer.progress=false \
    >"$out/bad_$split.out" 2>"$out/bad_$split.err"
  rc=$?
  set -e
  cat "$out/bad_$split.err"
  expect_rc 1 "$rc" "a label out of range in the $split split"
  expect_in "$out/bad_$split.err" "labels-idx1-ubyte.gz: sample 5 has label"
  no_trace "$out/bad_$split.err"
  if grep -q '^epoch' "$out/bad_$split.err"; then fail "trained before the $split labels were checked"; fi
done
echo "hostile_input: OK"
