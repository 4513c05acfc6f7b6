#!/usr/bin/env bash
# End to end: the image_folder recipe on generated PNG folders: decoding,
# the cache (second run loads it), augmentation, a corrupt image (fail with
# its path, or skip and go on).
set -euo pipefail
bin="$1"; out="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$out"; mkdir -p "$out"
python3 "$here/make_image_folder.py" "$out/images" 30 10 >/dev/null

common=(data.root="$out/images" data.size=[36,36] augment.size=[32,32] model.width=8 model.blocks=1
        data.batch_size=30 trainer.epochs=4 trainer.threads=1 data.cache_dir="$out/cache" optim.lr=0.05)
if ! "$bin" "${common[@]}" run.dir="$out/run" >"$out/stdout" 2>"$out/stderr"; then
  cat "$out/stderr"
  if grep -q "built without OpenCV" "$out/stderr"; then echo "SKIP: Ember built without OpenCV"; exit 0; fi
  exit 1
fi
cat "$out/stdout"
grep -q "train: 90 images in 3 classes" "$out/stderr"
python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
assert s['test_accuracy'] > 0.6, s
print('image_folder run OK:', s['test_accuracy'])" "$out/run/summary.json"
ls "$out/cache"/train-36x36.cache "$out/cache"/val-36x36.cache >/dev/null

# Second run: both splits come from the cache.
"$bin" "${common[@]}" run.dir="$out/run2" trainer.epochs=1 >/dev/null 2>"$out/stderr2"
[[ $(grep -c "(from the cache)" "$out/stderr2") -eq 2 ]]

# A corrupt image: fail naming it, or skip it and list it.
printf 'not a png' >"$out/images/train/square/bad.png"
set +e
"$bin" "${common[@]}" run.dir="$out/bad" data.cache_dir="" 2>"$out/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q "bad.png" "$out/err" && grep -q "on_error" "$out/err"
"$bin" "${common[@]}" run.dir="$out/skip" data.cache_dir="" data.on_error=skip trainer.epochs=1 >/dev/null 2>"$out/skip.err"
grep -q "skipped .*bad.png" "$out/skip.err"
grep -q "train: 90 images" "$out/skip.err"
echo "image_folder_subset: OK"
