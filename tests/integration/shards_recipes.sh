#!/usr/bin/env bash
# Recipes on WebDataset shards, end to end (docs/data.md):
#  1. ember_shards write shards Fashion-MNIST's IDX files (.npy + .cls); GNU tar
#     lists them, webdataset reads the same samples, verify passes;
#     fashion_mnist trains one epoch from them;
#  2. a folder of JPEGs of varied sizes (hundreds to over a thousand pixels a
#     side) is sharded with the files' own bytes; image_folder trains from the
#     shards with RandomResizedCrop, from a manifest, from http:// URLs of a
#     real server on the loopback (also through a local cache, one of whose
#     entries is damaged between two runs), and from pipe:cat;
#  3. a pipe: command that fails stops the run with its status and stderr.
# Usage: shards_recipes.sh FASHION_MNIST_BIN IMAGE_FOLDER_BIN EMBER_SHARDS_BIN PYTHON FASHION_ROOT WORK
set -euo pipefail
fashion="$1"; image_folder="$2"; shards="$3"; py="$4"; root="$5"; out="$6"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"

# 1. Fashion-MNIST as shards.
"$shards" write "$root" "$out/fm" --split train --samples-per-shard 6000 --seed 1 2>"$out/w1.err" || { cat "$out/w1.err"; fail "write train"; }
"$shards" write "$root" "$out/fm" --split test --samples-per-shard 5000 --verify 2>"$out/w2.err" || { cat "$out/w2.err"; fail "write test"; }
expect_in "$out/w1.err" "60000 samples (10 classes) in 10 shards"
expect_in "$out/w2.err" "10000 samples read, 0 disagree"
tar tf "$out/fm/train-000003.tar" >"$out/tar.list" || fail "GNU tar cannot list train-000003.tar"
[[ $(grep -cE '^[0-9]{8}\.(npy|cls)$' "$out/tar.list") == 12000 ]] || fail "GNU tar lists other members of train-000003.tar"
"$py" - "$out/fm" "$root" <<'PY'
import gzip, sys, io
import numpy as np
import webdataset as wds
out, root = sys.argv[1], sys.argv[2]
with gzip.open(f"{root}/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read()[16:], np.uint8).reshape(-1, 28, 28)
with gzip.open(f"{root}/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read()[8:], np.uint8)
seen = 0
for s in wds.WebDataset(f"{out}/test-{{000000..000001}}.tar", shardshuffle=False, empty_check=False):
    i = int(s["__key__"])
    if not (np.array_equal(np.load(io.BytesIO(s["npy"])), images[i]) and int(s["cls"]) == labels[i]):
        sys.exit(f"FAILED: webdataset reads sample {i} other than the IDX file holds")
    seen += 1
if seen != 10000:
    sys.exit(f"FAILED: webdataset read {seen} samples, 10000 written")
print("webdataset reads the 10000 test samples as the IDX files hold them")
PY
"$fashion" data.shards="$out/fm/train.json" data.test_shards="$out/fm/test.json" trainer.epochs=1 trainer.threads=2 \
  data.stream.decode_threads=1 run.dir="$out/fm-run" >"$out/fm.out" 2>"$out/fm.err" || { cat "$out/fm.err"; fail "fashion_mnist from shards"; }
"$py" -c "
import json, sys
s = json.load(open(sys.argv[1]))
if not s['test_accuracy'] > 0.8:
    sys.exit(f'FAILED: fashion_mnist from shards, one epoch: test_accuracy {s[\"test_accuracy\"]}, want > 0.8')
print('fashion_mnist from shards, one epoch: test_accuracy', s['test_accuracy'])" "$out/fm-run/summary.json"

# 2. JPEGs of varied sizes, sharded as they are.
"$py" - "$out/jpeg" <<'PY'
import random, sys
from pathlib import Path
from PIL import Image, ImageDraw
rng = random.Random(0)
colours = [(200, 60, 60), (60, 200, 60), (60, 60, 200)]
for split, n in (("train", 40), ("val", 12)):
    for label, name in enumerate(("red", "green", "blue")):
        d = Path(sys.argv[1]) / split / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            w, h = rng.randint(150, 1400), rng.randint(150, 1400)
            img = Image.new("RGB", (w, h), tuple(c + rng.randint(-30, 30) for c in colours[label]))
            draw = ImageDraw.Draw(img)
            for _ in range(8):  # some structure, in other colours
                x, y = rng.randint(0, w - 1), rng.randint(0, h - 1)
                draw.ellipse([x, y, x + w // 6, y + h // 6], fill=tuple(rng.randint(0, 255) for _ in range(3)))
            img.save(d / f"{i:03d}.jpg", quality=85)
PY
for split in train val; do
  "$shards" write "$out/jpeg/$split" "$out/js" --name "$split" --samples-per-shard 16 2>"$out/j-$split.err" \
    || { cat "$out/j-$split.err"; fail "write the $split JPEG shards"; }
done
expect_in "$out/j-train.err" "120 samples (3 classes) in 8 shards"
common=(data.num_classes=3 augment.size=[64,64] augment.scale=[0.25,1.0] model.width=8 model.blocks=1
        data.batch_size=24 data.eval_batch_size=36 trainer.epochs=4 trainer.threads=2 optim.lr=0.05
        data.stream.decode_threads=2 data.stream.streams=2 data.stream.shuffle_block=16)
"$image_folder" "${common[@]}" data.shards="$out/js/train.json" data.test_shards="$out/js/val.json" \
  run.dir="$out/if-run" >"$out/if.out" 2>"$out/if.err" || { cat "$out/if.err"; fail "image_folder from JPEG shards"; }
"$py" -c "
import json, sys
s = json.load(open(sys.argv[1]))
if not s['test_accuracy'] > 0.6:
    sys.exit(f'FAILED: image_folder from JPEG shards: test_accuracy {s[\"test_accuracy\"]}, want > 0.6')
print('image_folder from JPEG shards (RandomResizedCrop 64 of 150..1400 px JPEGs): test_accuracy', s['test_accuracy'])
" "$out/if-run/summary.json"

# The ImageNet-style config (recipes/image_folder/imagenet.toml: RandomResizedCrop 224 from 0.08, flip, label
# smoothing, a ResNet, cosine after warm-up, on_error=skip), its sizes made small: it trains end to end.
"$image_folder" --config "$here/../../recipes/image_folder/imagenet.toml" data.shards="$out/js/train.json" \
  data.test_shards="$out/js/val.json" data.num_classes=3 augment.size=[64,64] model.width=8 model.blocks=1 \
  data.batch_size=24 data.eval_batch_size=36 trainer.epochs=4 trainer.threads=2 optim.lr=0.05 sched.warmup_epochs=0.5 \
  data.stream.decode_threads=2 data.stream.streams=2 data.stream.shuffle_block=16 run.dir="$out/in-run" \
  >"$out/in.out" 2>"$out/in.err" || { cat "$out/in.err"; fail "image_folder with imagenet.toml"; }
"$py" -c "
import json, sys
s = json.load(open(sys.argv[1]))
if not (s['test_accuracy'] > 0.5 and s['shard_samples_skipped'] == 0):
    sys.exit(f'FAILED: imagenet.toml, small: test_accuracy {s[\"test_accuracy\"]}, want > 0.5; skipped {s[\"shard_samples_skipped\"]}')
print('imagenet.toml (small sizes): test_accuracy', s['test_accuracy'])
" "$out/in-run/summary.json"
grep -q 'label_smoothing = 0.1' "$out/in-run/config.toml" || fail "imagenet.toml's label smoothing is not in the run's config"

# nvJPEG decodes on a GPU: asked for on the CPU, the run is refused before any work.
set +e
"$image_folder" "${common[@]}" data.shards="$out/js/train.json" data.test_shards="$out/js/val.json" \
  data.stream.nvjpeg=true trainer.device=cpu run.dir="$out/nvjpeg-run" >/dev/null 2>"$out/nvjpeg.err"; rc=$?
set -e
expect_rc 2 "$rc" "data.stream.nvjpeg on the CPU"
expect_in "$out/nvjpeg.err" "data.stream.nvjpeg decodes JPEG images on the GPU: it needs trainer.device=cuda"

# The same shards over HTTP (a brace pattern, counts cached) and through pipe:cat: the same run, bitwise.
port_file="$out/port"
"$py" -c "
import http.server, functools, sys, threading
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
log = open(sys.argv[3], 'a', buffering=1)  # one line per request: the cache test counts them
http.server.SimpleHTTPRequestHandler.log_message = lambda self, f, *a: log.write((f % a) + '\n')
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)
s.handle_error = lambda *a: None  # a reader that stops early resets its connection: not news
open(sys.argv[2], 'w').write(str(s.server_address[1]))
s.serve_forever()" "$out/js" "$port_file" "$out/requests.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -s "$port_file" ]] && break; sleep 0.1; done
port=$(cat "$port_file")
"$image_folder" "${common[@]}" data.shards="http://127.0.0.1:$port/train-{000000..000007}.tar" \
  data.test_shards="http://127.0.0.1:$port/val-{000000..000002}.tar" data.stream.count_cache="$out/counts" \
  run.dir="$out/http-run" >"$out/http.out" 2>"$out/http.err" || { cat "$out/http.err"; fail "image_folder from http:// shards"; }
"$image_folder" "${common[@]}" data.shards="pipe:cat $out/js/train-{000000..000007}.tar" \
  data.test_shards="pipe:cat $out/js/val-{000000..000002}.tar" run.dir="$out/pipe-run" >"$out/pipe.out" 2>"$out/pipe.err" \
  || { cat "$out/pipe.err"; fail "image_folder from pipe:cat shards"; }
ls "$out/counts"/*.json >/dev/null || fail "no sample-count cache in $out/counts"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {name: json.loads((out / name / "summary.json").read_text()) for name in ("if-run", "http-run", "pipe-run")}
keys = ("test_accuracy", "test_loss")
for name in ("http-run", "pipe-run"):
    if any(runs[name][k] != runs["if-run"][k] for k in keys):
        sys.exit(f"FAILED: {name} ended at {[runs[name][k] for k in keys]}, the manifest's run at {[runs['if-run'][k] for k in keys]}")
print("http:// and pipe:cat shards train to the manifest run's test loss and accuracy, to the last digit")
PY

# The same over http:// through a local cache: each shard fetched once; a cache entry damaged
# between two runs (one byte, same size) is fetched again, never used; the same run to the last digit.
requests() { grep -c "GET /$1 " "$out/requests.log" || true; }
cached=(data.shards="http://127.0.0.1:$port/train-{000000..000007}.tar" data.stream.count_cache="$out/counts"
        data.test_shards="http://127.0.0.1:$port/val-{000000..000002}.tar" data.stream.cache_dir="$out/cache")
before3=$(requests train-000003.tar); before5=$(requests train-000005.tar)
"$image_folder" "${common[@]}" "${cached[@]}" run.dir="$out/cache-run1" >"$out/cache1.out" 2>"$out/cache1.err" \
  || { cat "$out/cache1.err"; fail "image_folder from http:// shards through the cache"; }
[[ $(( $(requests train-000003.tar) - before3 )) == 1 ]] || fail "the cached run fetched train-000003.tar $(( $(requests train-000003.tar) - before3 )) times, want once"
"$py" - "$out/cache" <<'PY'
import sys
from pathlib import Path
entries = [p for p in Path(sys.argv[1]).iterdir() if p.name.endswith("train-000003.tar")]
if len(entries) != 1:
    sys.exit(f"FAILED: {len(entries)} cache entries for train-000003.tar")
data = bytearray(entries[0].read_bytes())
data[len(data) // 2] ^= 0x10
entries[0].write_bytes(bytes(data))
print(f"damaged the cache entry {entries[0].name} (one byte of {len(data)})")
PY
"$image_folder" "${common[@]}" "${cached[@]}" run.dir="$out/cache-run2" >"$out/cache2.out" 2>"$out/cache2.err" \
  || { cat "$out/cache2.err"; fail "image_folder from http:// shards through a damaged cache"; }
[[ $(( $(requests train-000003.tar) - before3 )) == 2 ]] || fail "the damaged entry of train-000003.tar was not fetched again"
[[ $(( $(requests train-000005.tar) - before5 )) == 1 ]] || fail "the good entry of train-000005.tar was fetched again"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
want = json.loads((out / "if-run" / "summary.json").read_text())
for name in ("cache-run1", "cache-run2"):
    got = json.loads((out / name / "summary.json").read_text())
    if [got["test_accuracy"], got["test_loss"]] != [want["test_accuracy"], want["test_loss"]]:
        sys.exit(f"FAILED: {name} ended at {got['test_accuracy']} {got['test_loss']}, the manifest's run at {want['test_accuracy']} {want['test_loss']}")
print("http:// shards through the cache: each fetched once, the damaged entry fetched again; the same run to the last digit")
PY

# 3. A failing pipe: command stops the run with its status and stderr.
set +e
"$image_folder" "${common[@]}" data.shards="pipe:echo 'AccessDenied: s3://bucket' >&2; exit 7" \
  data.test_shards="$out/js/val.json" run.dir="$out/fail-run" >/dev/null 2>"$out/fail.err"; rc=$?
set -e
[[ $rc -ne 0 ]] || fail "a failing pipe: command did not stop the run"
expect_in "$out/fail.err" "exited with status 7"
expect_in "$out/fail.err" "AccessDenied: s3://bucket"
echo "shards_recipes: OK"
