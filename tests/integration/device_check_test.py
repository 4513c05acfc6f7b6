"""The GPU check stays alive: tools/device_check.py in CPU mode on this build tree.

    python device_check_test.py --build BUILD_DIR --work DIR

With EMBER_DEVICE_ALLOW_CPU=1 and no GPU, on the binaries of BUILD_DIR:
  1. a budget too small for any row: every GPU row is skipped, every other row
     is `not run (budget)`, and OUT holds exactly device_check.txt,
     device_check.jsonl and logs.tar.gz;
  2. tier 1 with time to spare: the CPU rows run and pass (the binaries load,
     the kernels' emulated launches), each GPU test case is listed as a row of
     its own and skipped (the cases skip themselves without a GPU);
  3. SIGTERM in the middle: the result files and the tarball are still written,
     the running row says `interrupted` and the rest `not run (interrupted)`;
  4. the binaries that the pack would carry need no library beyond glibc,
     libstdc++, zlib, the torch wheel's, and OpenCV's (which the pack's build
     leaves out), as device_pack.py requires of the pack;
  5. the GPU rows' readers understand what the programs print (a recipe's
     result line, the monitor and prune benches' tables), from tiny CPU runs:
     a changed output format fails here, not on a rented GPU.
Without Fashion-MNIST the recipe's result line is not read: the rest runs,
then the test exits 77 (skipped) rather than pass with a part left out.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tools" / "device_check.py"
FILES = {"device_check.txt", "device_check.jsonl", "logs.tar.gz"}


def rows_of(out):
    return [json.loads(l) for l in (out / "device_check.jsonl").read_text().splitlines()]


def check_files(out):
    check({p.name for p in out.iterdir()} == FILES, sorted(p.name for p in out.iterdir()))
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    check("logs/machine.log" in names, names)
    table = (out / "device_check.txt").read_text()
    for r in rows_of(out):
        check(r["name"] in table, (r["name"], table))
    return names


def run(args, build, out, work, **popen):
    env = dict(os.environ, EMBER_DEVICE_ALLOW_CPU="1", EMBER_DEVICE_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    cmd = [sys.executable, str(CHECK), "--binaries", str(build), "--out", str(out), "--work", str(work), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def is_gpu_row(r):
    return r["gpu"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    build, work = Path(a.build), Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 1. No time for any row.
    out = work / "out1"
    p = run(["--budget", "1", "--tier", "1", "--tier", "2", "--tier", "3"], build, out, work / "w1")
    text, _ = p.communicate(timeout=300)
    check(p.returncode == 0, text)
    check_files(out)
    rows = rows_of(out)
    steps = [r for r in rows if r["status"] not in ("info",) and r["name"] != "summary"]
    check(steps, text)
    for r in steps:
        want = "skip" if is_gpu_row(r) else "not run (budget)"
        check(r["status"] == want, (r, text))
    check(any(r["tier"] == 3 for r in steps), "tier 3 rows are listed too")
    print(f"1. budget 1 s: {len(steps)} rows, GPU rows skipped, the others not run (budget)")

    # 2. Tier 1 with time: CPU rows pass, GPU cases skip one by one.
    out = work / "out2"
    p = run(["--budget", "600", "--tier", "1"], build, out, work / "w2")
    text, _ = p.communicate(timeout=900)
    check(p.returncode == 0, text)
    names = check_files(out)
    rows = {r["name"]: r for r in rows_of(out)}
    check(rows["binaries load (every library found)"]["status"] == "ok", rows)
    check(rows["kernels, emulated launches (CPU)"]["status"] == "ok", rows)
    cases = [r for n, r in rows.items() if n.startswith("gpu test ") and n != "gpu test cases (*Cuda.*)"]
    check(len(cases) >= 12, [r["name"] for r in cases])
    want = {"gpu test AugmentCuda.ParamsOnTheDeviceOrPinnedAndStridedInputs",
            "gpu test Backend/OpsCuda.CudaPathMatchesTheCpuReference"}
    check(want <= rows.keys(), f"rows missing: {sorted(want - rows.keys())}")
    for r in cases:
        check(r["status"] == "skip" and "no CUDA device" in r["detail"], r)
    check(rows["gpu test cases (*Cuda.*)"]["status"] == "skip", rows["gpu test cases (*Cuda.*)"])
    for n, r in rows.items():
        if is_gpu_row(r):
            check(r["status"] in ("skip", "not run (budget)"), r)
        check(r["status"] not in ("FAIL", "timeout"), r)
    check(rows["summary"]["status"] == "ok", rows["summary"])
    check("logs/gtest_emulated.log" in names and "logs/gtest_cuda.log" in names, names)
    print(f"2. tier 1: {len(cases)} GPU cases skipped one by one, emulated launches and loading ok")

    # 3. Interrupted in the middle of tier 1.
    out = work / "out3"
    p = run(["--budget", "600", "--tier", "1"], build, out, work / "w3", start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        jl = out / "device_check.jsonl"
        if jl.exists() and "binaries load" in jl.read_text():
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=120)
    check(p.returncode == 143, (p.returncode, text))
    check_files(out)
    statuses = [r["status"] for r in rows_of(out)]
    check("interrupted" in statuses, statuses)
    check("not run (interrupted)" in statuses, statuses)
    print(f"3. SIGTERM: exit 143, results and logs written, {statuses.count('not run (interrupted)')} rows not run")

    # 4. What the pack carries loads on the GPU machine (OpenCV aside: the pack's build has none).
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "device_pack.py"), "--check-needed", str(build),
                        "--venv-python", sys.executable, "--allow", "libopencv_"], capture_output=True, text=True)
    check(r.returncode == 0, r.stdout + r.stderr)
    print("4. " + r.stdout.strip().splitlines()[-1])

    # 5. The readers of the GPU rows, on the same programs' CPU output.
    sys.path.insert(0, str(ROOT / "tools"))
    import device_check as dc
    env = dict(os.environ, OMP_NUM_THREADS="1")
    data = "/usr/share/datasets/fashion-mnist"
    has_data = Path(data, "train-images-idx3-ubyte.gz").exists()
    if has_data:
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), f"data.root={data}", "data.train_subset=700",
                              "data.test_subset=200", "data.val_size=200", "trainer.epochs=1", "trainer.progress=false",
                              f"run.dir={work / 'recipe_run'}"], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stderr[-2000:])
        v = dc.result_values(out.stdout)
        check(0 < v["test_accuracy"] <= 1 and v["samples_per_second"] > 0 and v["epochs"] == 1, v)
        print(f"5. recipe result line: {sorted(v)}")
    out = subprocess.run([str(build / "bin" / "ember_bench_monitor"), "--device", "cpu", "--batch-size", "8",
                          "--steps", "3", "--rounds", "1"], capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    n = dc.monitor_numbers(out.stdout)
    check(set(n) == {"default", "full"} and all(x["overhead"].endswith("%") for x in n.values()),
          (n, out.stdout))
    out = subprocess.run([str(build / "bin" / "ember_bench_prune"), "--device", "cpu", "--blocks", "1", "--batch", "4",
                          "--steps", "1", "--rounds", "1"], capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    n = dc.prune_numbers(out.stdout)
    check({"0.00", "0.30", "0.50", "0.70"} <= set(n) and n["0.00"]["train_x"] == "1.00x", (n, out.stdout))
    print("5. monitor and prune bench tables read")
    if not has_data:
        print(f"SKIP: no Fashion-MNIST at {data}: the recipe's result line was not read (everything else passed)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
