#!/usr/bin/env bash
# Streamed shards through a recipe (fashion_mnist), at 1, 2 and 3 Gloo ranks
# (torchrun), killed and resumed (docs/data.md "Order and resume"):
#  - 7 shards of unequal sizes (100..250 samples, 1200 in all), 48 samples a
#    step at every world size (1 x 48, 2 x 24, 3 x 16), loader threads 1 or 2;
#  - each rank appends the sample ids of every batch it trains on to a log
#    (data.stream.served_log): step by step, the ranks' batches interleaved
#    are the one-process run's batch, and each epoch serves every sample once;
#  - SIGKILL during epoch 2 of 2 ranks: resumed from the last checkpoint at 2
#    ranks with other thread counts, it trains on the same samples and ends
#    bitwise where the uninterrupted 2-rank run ends (the same computation:
#    the same ranks, shapes, thread count per rank and machine, from the
#    checkpoint's exact state); resumed at 1 rank (2 -> 1), on the same samples;
#  - SIGTERM mid-epoch of one process (a checkpoint at that step), resumed
#    mid-epoch at 3 ranks (1 -> 3): the same samples from that step on.
# Weights are compared bitwise only at the same world size: at another, the
# gradients are summed over ranks in another order, which the loader does not
# own (dist.sharding checks that resume in float64).
# Usage: shards_resume.sh TORCHRUN FASHION_MNIST PYTHON FASHION_ROOT WORK
set -euo pipefail
torchrun="$1"; bin="$2"; py="$3"; root="$4"; out="$5"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
[[ -f "$root/train-images-idx3-ubyte.gz" ]] || skip "no Fashion-MNIST at $root"

"$py" - "$root" "$out/sh" <<'PY'
import gzip, io, sys, tarfile
from pathlib import Path
import numpy as np
root, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True)
def idx(name, offset, shape):
    with gzip.open(f"{root}/{name}") as f:
        return np.frombuffer(f.read()[offset:], np.uint8).reshape(shape)
images, labels = idx("train-images-idx3-ubyte.gz", 16, (-1, 28, 28)), idx("train-labels-idx1-ubyte.gz", 8, (-1,))
def shard(path, ids):
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in ids:
            b = io.BytesIO()
            np.save(b, images[i])
            for ext, data in (("npy", b.getvalue()), ("cls", str(int(labels[i])).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
at = 0
for s, n in enumerate((100, 250, 130, 220, 160, 190, 150)):
    shard(out / f"train-{s}.tar", range(at, at + n))
    at += n
shard(out / "test-0.tar", range(50000, 50300))
PY

common=(data.shards="$out/sh/train-{0..6}.tar" data.test_shards="$out/sh/test-0.tar" data.stream.count_cache="$out/counts"
        data.stream.streams=6 data.stream.shuffle_block=64 trainer.epochs=2 trainer.threads=1 trainer.progress=false
        trainer.log_every=1 sched.name=constant trainer.device=cpu model.width=64)  # ~50 ms steps: a kill lands mid-epoch
one() { "$bin" "${common[@]}" data.batch_size=48 "$@"; }
ranks() { local n="$1"; shift; "$torchrun" --standalone --nproc-per-node "$n" --no-python "$bin" "${common[@]}" \
            data.batch_size=$((48 / n)) "$@"; }
run_or_fail() { local name="$1"; shift; "$@" >"$out/$name.out" 2>"$out/$name.err" || { cat "$out/$name.out" "$out/$name.err"; fail "$name"; }; }
tree() { echo "$1"; local c; for c in $(pgrep -P "$1"); do tree "$c"; done; }  # a process and its descendants
# Batches trained on so far: the served log's lines (written and flushed as each batch is taken;
# metrics.jsonl is flushed at epoch ends, too late to aim a kill mid-epoch).
served_lines() { [[ -f "$1" ]] && wc -l <"$1" || echo 0; }

# Uninterrupted runs at 1, 2 and 3 ranks, other loader thread counts.
run_or_fail s1 one run.dir="$out/s1" data.stream.decode_threads=2 data.stream.readers=2 data.stream.served_log="$out/s1.log"
run_or_fail s2 ranks 2 run.dir="$out/s2" data.stream.decode_threads=1 data.stream.readers=1 \
  data.stream.served_log="$out/s2.{rank}.log"
run_or_fail s3 ranks 3 run.dir="$out/s3" data.stream.decode_threads=2 data.stream.readers=1 \
  data.stream.served_log="$out/s3.{rank}.log"
expect_in "$out/s2.err" "x 2 ranks (gloo)"

# SIGKILL of 2 ranks during epoch 2 (25 steps an epoch): torchrun and its ranks at once.
"$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${common[@]}" data.batch_size=24 \
  run.dir="$out/k" data.stream.decode_threads=2 data.stream.readers=2 data.stream.served_log="$out/k.{rank}.log" \
  >"$out/k.out" 2>"$out/k.err" &
leader=$!
for _ in $(seq 1 1200); do
  # epoch 2 under way: the epoch-1 checkpoint is written
  if [[ $(served_lines "$out/k.0.log") -ge 27 ]]; then break; fi
  kill -0 "$leader" 2>/dev/null || break
  sleep 0.02
done
kill -9 $(tree "$leader") 2>/dev/null || true  # torchrun starts its ranks in sessions of their own
set +e; wait "$leader"; set -e
[[ -f "$out/k/checkpoints/last.pt" ]] || { cat "$out/k.err"; fail "no epoch-1 checkpoint before the SIGKILL"; }
[[ ! -f "$out/k/summary.json" ]] || fail "the run finished before the SIGKILL: make it longer"
cp -r "$out/k" "$out/k1"
run_or_fail k2 ranks 2 run.dir="$out/k" trainer.resume=auto data.stream.decode_threads=1 data.stream.readers=1 \
  data.stream.served_log="$out/k2.{rank}.log"
expect_in "$out/k2.err" "resuming from $out/k/checkpoints/last.pt: epoch 1, batch 0, step 25"
run_or_fail k1 one run.dir="$out/k1" trainer.resume=auto data.stream.decode_threads=1 data.stream.served_log="$out/k1r.log"
expect_in "$out/k1.err" "dist.world_size: 2 -> 1"

# SIGTERM of one process mid-epoch 2 (a checkpoint at that step), resumed at 3 ranks.
(exec "$bin" "${common[@]}" data.batch_size=48 run.dir="$out/t" data.stream.decode_threads=2 \
   data.stream.served_log="$out/t.log" >"$out/t.out" 2>"$out/t.err") &  # $! is the recipe's own pid
pid=$!
for _ in $(seq 1 1200); do
  if [[ $(served_lines "$out/t.log") -ge 28 ]]; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.02
done
kill -TERM "$pid" 2>/dev/null || true
set +e; wait "$pid"; rc=$?; set -e
expect_rc 130 "$rc" "SIGTERM mid-epoch"
run_or_fail t3 ranks 3 run.dir="$out/t" trainer.resume=auto data.stream.decode_threads=1 \
  data.stream.served_log="$out/t3.{rank}.log"
expect_in "$out/t3.err" "dist.world_size: 1 -> 3"

"$py" - "$out" <<'PY'
import json, re, sys
from collections import Counter
from pathlib import Path
out = Path(sys.argv[1])
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
def served(pattern, ranks, killed=False):
    """{(epoch, batch): ids of all ranks interleaved as the order splits them} from the served logs
    (killed: the ranks died at different batches; the batches all of them logged)."""
    per_rank = []
    for r in range(ranks):
        lines = {}
        for line in (out / pattern.format(rank=r)).read_text().splitlines():
            e, b, *ids = map(int, line.split())
            lines[(e, b)] = ids  # a batch served again after a resume: the later one is what trained
        per_rank.append(lines)
    steps = {}
    for key in per_rank[0]:
        if killed and not all(key in p for p in per_rank):
            continue
        check(all(key in p for p in per_rank), f"{pattern}: batch {key} missing on a rank")
        parts = [p[key] for p in per_rank]
        steps[key] = [parts[r][k] for k in range(len(parts[0])) for r in range(ranks)]
    return steps
def resumed_at(err):
    m = re.search(r"resuming from .*: epoch (\d+), batch (\d+), step (\d+)", (out / err).read_text())
    check(m, f"{err}: no resume line")
    return int(m[1]), int(m[2])
ref = served("s1.log", 1)
check(len(ref) == 50 and all(len(v) == 48 for v in ref.values()), f"s1: {len(ref)} batches")
for e in (0, 1):
    ids = Counter(i for (ep, _), v in ref.items() if ep == e for i in v)
    check(sorted(ids) == list(range(1200)) and set(ids.values()) == {1}, f"epoch {e}: not every sample once")
check(ref[(0, 0)] != ref[(1, 0)], "epoch 2 repeats epoch 1's order")
for name, ranks in (("s2.{rank}.log", 2), ("s3.{rank}.log", 3)):
    check(served(name, ranks) == ref, f"{name}: {ranks} ranks trained on other samples than one process")
print("1, 2 and 3 ranks (other loader threads) train step by step on the same 48 samples; each epoch serves all 1200 once")
# SIGKILL at 2 ranks, resumed at 2 and at 1.
e, b = resumed_at("k2.err")
killed = {k: v for k, v in served("k.{rank}.log", 2, killed=True).items() if k < (e, b)}
check(len(killed) == 25, f"{len(killed)} batches before the checkpoint")
check({**killed, **served("k2.{rank}.log", 2)} == ref, "killed at 2 ranks, resumed at 2: other samples")
check({**killed, **served("k1r.log", 1)} == ref, "killed at 2 ranks, resumed at 1: other samples")
s2, k2 = (json.loads((out / d / "summary.json").read_text()) for d in ("s2", "k"))
check(k2.get("resumed_at_step") == 25, k2)
check((k2["test_loss"], k2["test_accuracy"]) == (s2["test_loss"], s2["test_accuracy"]),
      f"killed and resumed at 2 ranks: {k2['test_loss']} {k2['test_accuracy']}, straight {s2['test_loss']} {s2['test_accuracy']}")
print(f"SIGKILL at 2 ranks (epoch 2): resumed at 2 ranks (other thread counts) bitwise the straight run "
      f"(test_loss {s2['test_loss']}); at 1 rank on the same samples")
# SIGTERM of one process mid-epoch, resumed at 3 ranks.
e, b = resumed_at("t3.err")
check(e == 1 and b > 0, f"the SIGTERM checkpoint is at epoch {e}, batch {b}: not mid-epoch 2")
before = {k: v for k, v in served("t.log", 1).items() if k < (e, b)}
check({**before, **served("t3.{rank}.log", 3)} == ref, "stopped at 1 process mid-epoch, resumed at 3 ranks: other samples")
print(f"SIGTERM of one process at epoch 2 batch {b}: resumed at 3 ranks on the same samples to the end")
PY
echo "shards_resume: OK"
