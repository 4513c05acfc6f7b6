#!/usr/bin/env python3
"""Kill soak: SIGKILL a training run again and again, resume it each time, and
check that it ends bit-identical to a run that was never interrupted.

    soak.py BINARY --work DIR [--kills N] [--seed S] [--epochs E]

BINARY is the fashion_mnist recipe. It trains on small generated IDX files
(written to DIR/data: no download, no dataset package needed), once straight
through (DIR/straight), then in DIR/soak: started with trainer.resume=auto,
SIGKILLed at N moments, restarted, until a start runs to the end. Half the
kills fall at random moments (start-up, data loading, training steps,
evaluation, the summary), half the moment a checkpoint write is seen in
progress (its temporary file exists). At the end:

  - the final checkpoint of the soaked run holds the same bytes as the
    straight run's, member by member (model, optimizer, loop position, RNG
    states: an exact resume changes none of them);
  - summary.json's test accuracy and loss are the same;
  - no temporary file and no lock file is left.

Prints one line per kill and a verdict; exit 0 when it held, 1 when not, 2 on
a usage or set-up error. Standard library only. `tools/ember soak` runs it
with 20 kills; the test suite (integration.kill_soak) with a few.
"""
import argparse
import collections
import gzip
import io
import os
import pickle
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the shared package, embertools
from embertools import runs  # noqa: E402

TRAILER = 24  # ember/train/checkpoint.h: "EMBERCK1", length, CRC-32


def make_data(root: Path, seed: int):
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)

    def write(name, dims, data):
        with gzip.open(root / (name + ".gz"), "wb") as f:
            f.write(struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims))
            f.write(bytes(data))

    # 10 classes told apart by a bright square at a class-dependent place, plus noise.
    for split, n in (("train", 1536), ("t10k", 256)):
        images, labels = bytearray(), []
        for i in range(n):
            c = rng.randrange(10)
            img = bytearray(rng.randrange(180) for _ in range(784))
            y0, x0 = 2 + (c // 5) * 12, 2 + (c % 5) * 5
            for y in range(y0, y0 + 6):
                for x in range(x0, x0 + 3):
                    img[y * 28 + x] = 100 + rng.randrange(156)
            images += img
            labels.append(c)
        write(f"{split}-images-idx3-ubyte", [n, 28, 28], images)
        write(f"{split}-labels-idx1-ubyte", [n], labels)


def checkpoint_state(checkpoint: Path):
    """A checkpoint's content as {path: value}, comparable across processes.

    The archive is LibTorch's (a zip holding data.pkl and one record per
    storage). Its bytes are not: a random serialization id, class names
    numbered per process, and the optimizer's state keyed by the parameters'
    addresses. So data.pkl is read with the standard pickle module (classes as
    plain objects, tensors as their storage bytes, shape and strides) and each
    address is renamed by its place in the optimizer's parameter list."""
    data = checkpoint.read_bytes()
    if len(data) < TRAILER or data[-TRAILER:-TRAILER + 8] != b"EMBERCK1":
        raise SystemExit(f"soak: {checkpoint} is not a sealed Ember checkpoint")
    with zipfile.ZipFile(io.BytesIO(data[:-TRAILER])) as z:
        records = {n.split("/", 1)[-1]: z.read(n) for n in z.namelist()}

    class Obj:  # any TorchScript class: its attributes become the instance's
        pass

    def rebuild(storage, offset, size, stride, *_):
        return ("tensor", records["data/" + storage], offset, tuple(size), tuple(stride))

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if module.startswith("__torch__"):
                return Obj
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return rebuild
            if module == "torch" and name.endswith("Storage"):
                return name
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            raise pickle.UnpicklingError(f"unexpected class {module}.{name} in {checkpoint}")

        def persistent_load(self, pid):  # ("storage", type, key, device, numel)
            return pid[2]

    root = Reader(io.BytesIO(records["data.pkl"])).load()
    renamed = {}

    def collect(obj):
        for k, v in vars(obj).items():
            if k.startswith("params/") and k != "params/size" and isinstance(v, str):
                renamed[v] = "param" + k.split("/", 1)[1]
            elif isinstance(v, Obj):
                collect(v)

    flat = {}

    def walk(obj, prefix):
        for k, v in vars(obj).items():
            path = prefix + renamed.get(k, k)
            if isinstance(v, Obj):
                walk(v, path + ".")
            else:
                flat[path] = renamed.get(v, v) if isinstance(v, str) else v

    collect(root)
    walk(root, "")
    return flat


def leftovers(run: Path):
    out = [p for p in run.rglob("*") if ".tmp." in p.name]
    if (run / "run.lock").exists():
        out.append(run / "run.lock")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--epochs", type=int, default=6)
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        print(f"soak: {a.binary} is not an executable", file=sys.stderr)
        return 2
    shutil.rmtree(a.work, ignore_errors=True)
    make_data(a.work / "data", 1)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = [f"data.root={a.work / 'data'}", f"trainer.epochs={a.epochs}", "data.batch_size=64",
              "data.val_size=256", "trainer.threads=1", "trainer.progress=false", "trainer.log_every=4",
              "trainer.checkpoint_every=1", "model.width=8", "model.hidden=32"]

    t0 = time.monotonic()
    straight = a.work / "straight"
    r = subprocess.run([a.binary, *common, f"run.dir={straight}"], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"soak: the straight run failed ({r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return 2
    whole = time.monotonic() - t0
    trained = runs.load_summary(straight)["train_seconds"]
    startup = max(whole - trained, 0.1)  # process start, data, model; the test and summary
    print(f"straight run: {whole:.1f} s ({trained:.1f} s training), {r.stdout.strip().splitlines()[-1]}")

    rng = random.Random(a.seed)
    soak = a.work / "soak"
    kills = in_write = starts = 0
    while True:
        starts += 1
        log = open(a.work / f"start{starts}.log", "w")
        p = subprocess.Popen([a.binary, *common, f"run.dir={soak}", "trainer.resume=auto"], env=env,
                             stdout=log, stderr=subprocess.STDOUT)
        killed, during_write = False, False
        if kills < a.kills:
            if kills % 2 == 0:  # a random moment: start-up, loading, training, evaluating, writing
                # Short enough that N kills fit in one run: each start trains
                # on average about 1/(2N) of it after the start-up.
                deadline = time.monotonic() + rng.uniform(0.05, startup + 2 * (whole - startup) / a.kills)
                while p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.005)
            else:  # the moment a checkpoint write is seen in progress
                deadline = time.monotonic() + whole * 2
                ckpt = soak / "checkpoints"
                while p.poll() is None and time.monotonic() < deadline:
                    if ckpt.is_dir() and any(".tmp." in n for n in os.listdir(ckpt)):
                        break
                    time.sleep(0.0005)
            if p.poll() is None:
                ckpt = soak / "checkpoints"
                during_write = ckpt.is_dir() and any(".tmp." in n for n in os.listdir(ckpt))
                p.send_signal(signal.SIGKILL)
                killed = True
        rc = p.wait()
        log.close()
        if killed:
            kills += 1
            in_write += during_write
            steps = 0
            if (soak / "metrics.jsonl").exists():
                steps = sum(1 for line in open(soak / "metrics.jsonl") if '"kind":"step"' in line)
            print(f"kill {kills:2}: start {starts}, {'during a checkpoint write' if during_write else 'at a random moment'}"
                  f" ({steps} step records so far)")
            continue
        if rc != 0:
            print(f"soak: start {starts} failed by itself (exit {rc}); see {log.name}:", file=sys.stderr)
            print((a.work / f"start{starts}.log").read_text()[-3000:], file=sys.stderr)
            return 1
        break

    problems = []
    want = checkpoint_state(straight / "checkpoints" / "last.pt")
    got = checkpoint_state(soak / "checkpoints" / "last.pt")
    if set(want) != set(got):
        problems.append(f"the final checkpoints hold different entries: {sorted(set(want) ^ set(got))[:8]}")
    differ = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    if differ:
        problems.append(f"{len(differ)} of {len(want)} entries of the final checkpoint differ: {differ[:8]}")
    s_want, s_got = runs.load_summary(straight), runs.load_summary(soak)
    for key in ("test_accuracy", "test_loss", "steps", "epochs"):
        if s_want.get(key) != s_got.get(key):
            problems.append(f"summary.json {key}: straight {s_want.get(key)}, soaked {s_got.get(key)}")
    left = leftovers(soak)
    if left:
        problems.append(f"left behind: {[str(p.relative_to(soak)) for p in left]}")
    print(f"{kills} kills ({in_write} during a checkpoint write), {starts} starts; final checkpoint: "
          f"{len(want)} entries compared (weights, optimizer state, loop position, RNG)")
    if problems:
        for p in problems:
            print("FAILED:", p)
        return 1
    print(f"soak: OK, bit-identical to the straight run (test_accuracy {s_got['test_accuracy']}, "
          f"test_loss {s_got['test_loss']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
