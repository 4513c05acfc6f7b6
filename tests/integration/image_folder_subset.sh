#!/usr/bin/env bash
# End to end: the image_folder recipe on generated PNG folders: decoding,
# the cache (second run loads it), augmentation, a corrupt image (fail with
# its path, or skip and go on).
set -euo pipefail
bin="$1"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
python3 "$here/make_image_folder.py" "$out/images" 30 10 >/dev/null

common=(data.root="$out/images" data.size=[36,36] augment.size=[32,32] model.width=8 model.blocks=1
        data.batch_size=30 trainer.epochs=4 trainer.threads=1 data.cache_dir="$out/cache" optim.lr=0.05)
if ! "$bin" "${common[@]}" run.dir="$out/run" >"$out/stdout" 2>"$out/stderr"; then
  cat "$out/stderr"
  if grep -q "built without OpenCV" "$out/stderr"; then skip "Ember built without OpenCV"; fi
  fail "the first image_folder run failed (its stderr above)"
fi
cat "$out/stdout"
expect_in "$out/stderr" "train: 90 images in 3 classes"
python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
if not s['test_accuracy'] > 0.6:
    sys.exit(f'FAILED: test_accuracy should be > 0.6: {s}')
print('image_folder run OK:', s['test_accuracy'])" "$out/run/summary.json"
ls "$out/cache"/train-36x36.cache "$out/cache"/val-36x36.cache >/dev/null || fail "no cache files in $out/cache"

# Second run: both splits come from the cache.
"$bin" "${common[@]}" run.dir="$out/run2" trainer.epochs=1 >/dev/null 2>"$out/stderr2"
n=$(grep -c "(from the cache)" "$out/stderr2" || true)
[[ $n -eq 2 ]] || fail "the second run should load both splits from the cache: $n '(from the cache)' lines in $out/stderr2"

# A corrupt image: fail naming it, or skip it and list it.
printf 'not a png' >"$out/images/train/square/bad.png"
set +e
"$bin" "${common[@]}" run.dir="$out/bad" data.cache_dir="" 2>"$out/err"; rc=$?
set -e
expect_rc 1 "$rc" "a corrupt image"
expect_in "$out/err" "bad.png"
expect_in "$out/err" "on_error"
"$bin" "${common[@]}" run.dir="$out/skip" data.cache_dir="" data.on_error=skip trainer.epochs=1 >/dev/null 2>"$out/skip.err"
expect_in "$out/skip.err" "skipped .*bad.png"
expect_in "$out/skip.err" "train: 90 images"
echo "image_folder_subset: OK"
