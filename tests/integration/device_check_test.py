"""The GPU check stays alive: tools/dev/device_check.py in CPU mode on this build tree.

    python device_check_test.py --build BUILD_DIR --work DIR

With EMBER_DEVICE_ALLOW_CPU=1 and no GPU, on the binaries of BUILD_DIR:
  1. a budget too small for any row: every GPU row is skipped, every other row
     is `not run (budget)`, and OUT holds exactly device_check.txt,
     device_check.jsonl and logs.tar.gz; the estimates of tiers 1 and 2 with
     the set-up fit the default budget (one 540 s command on the GPU machine);
  2. tier 1 with time to spare: the CPU rows run and pass (the binaries load,
     the kernels' emulated launches), each GPU test case is listed as a row of
     its own and skipped (the cases skip themselves without a GPU);
  3. SIGTERM in the middle: the result files and the tarball are still written,
     the running row says `interrupted` and the rest `not run (interrupted)`;
  4. the binaries that the pack would carry need no library beyond glibc,
     libstdc++, zlib, the torch wheel's, and OpenCV's (which the pack's build
     leaves out), as device_pack.py requires of the pack;
  5. the GPU rows' readers understand what the programs print (a recipe's
     result line, the monitor and prune benches' tables, speed.py's and
     scaling.py's JSON, lr-find's optim.lr= line, --measure's JSON), from
     tiny CPU runs: a changed output format fails here, not on a rented GPU;
     and the goals are judged right (met, not met, not judged) on fabricated
     numbers.
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
CHECK = ROOT / "tools" / "dev" / "device_check.py"
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


def goal_judges(dc):
    """The goals of the GPU rows on fabricated numbers: met, not met, not judged, and the text."""
    g = dc.goal("CNN b128: graphs", 1.73, ">=", 2, "x Python eager")
    check(g["met"] is False and g["text"] == "CNN b128: graphs 1.73x Python eager (goal >= 2: not met)", g)
    check(dc.goal("x", float("nan"), "<", 1)["met"] is None and dc.goal("x", None, "<", 1)["met"] is None, "NaN, None")
    met, missed, unknown = dc.goal("a", 2, ">=", 2), dc.goal("b", 3, "<", 2), dc.goal("c", None, "<", 2)
    check(dc.goal_status([met]) == "ok" and dc.goal_status([met, unknown]) == dc.NOT_JUDGED
          and dc.goal_status([met, missed, unknown]) == dc.GOAL_NOT_MET and dc.goal_status([]) == dc.NOT_JUDGED,
          "goal_status: ok only when every goal is met, not met before not judged")

    fast = {"cnn b128": {"ember": 8.0, "ember-graph": 4.0, "python": 10.0, "python-fused": 9.0, "compile": 5.0}}
    check(dc.goal_status(dc.speed_goals(fast)) == "ok", dc.speed_goals(fast))
    fused_peer = {"cnn b128": dict(fast["cnn b128"], **{"python-fused": 7.0})}  # 2.5x default, 1.75x fused
    check(dc.speed_goals(fused_peer)[0]["met"] is False, ("judged against Python at its best", dc.speed_goals(fused_peer)))
    slow = {"cnn b128": dict(fast["cnn b128"], **{"ember-graph": 6.0})}  # 1.5x Python fused, 0.83x compile
    check([x["met"] for x in dc.speed_goals(slow)] == [False, False], dc.speed_goals(slow))
    no_compile = {"cnn b128": dict(fast["cnn b128"], compile=None, errors={"compile": "torch.compile failed: gcc"})}
    g = dc.speed_goals(no_compile)
    check(dc.goal_status(g) == dc.NOT_JUDGED and g[0]["met"] is True and "gcc" in g[1]["text"], g)

    row = {"pipeline": "224px", "output": "fp32", "achieved_gbs": 3000.0, "host_us": 30.0}
    aug = {"copy_gbs": 4000.0, "rows": [row]}
    check(dc.goal_status(dc.augment_goals(aug)) == "ok", dc.augment_goals(aug))
    aug_slow = {"copy_gbs": 4000.0, "rows": [dict(row, achieved_gbs=2000.0)]}  # 0.5 of copy
    check(dc.goal_status(dc.augment_goals(aug_slow)) == dc.GOAL_NOT_MET, dc.augment_goals(aug_slow))
    check(dc.goal_status(dc.augment_goals({"copy_gbs": 1.0, "rows": []})) == dc.NOT_JUDGED, "no rows")

    check(dc.goal_status(dc.monitor_goals({"default": {"overhead": "-0.40%", "own_time": "0.1%"}})) == "ok", "mon")
    check(dc.goal_status(dc.monitor_goals({"default": {"overhead": "2.50%", "own_time": "0.1%"}})) == dc.GOAL_NOT_MET,
          "monitor 2.5%")
    check(dc.goal_status(dc.monitor_goals({})) == dc.NOT_JUDGED, "monitor without its row")

    amp = {"fp16-mixed": {"ember_ms": 101.0}, "fp16-mixed no-scaler": {"ember_ms": 100.0}}
    check(dc.goal_status(dc.amp_goals(amp)) == "ok", dc.amp_goals(amp))
    amp["fp16-mixed"]["ember_ms"] = 110.0
    check(dc.goal_status(dc.amp_goals(amp)) == dc.GOAL_NOT_MET, dc.amp_goals(amp))

    accs, secs = [0.9412, 0.9430, 0.9401], [4.1, 4.4, 4.9]
    check(dc.goal_status(dc.speedrun_goals(accs, secs, 60000)) == "ok", dc.speedrun_goals(accs, secs, 60000))
    check(dc.goal_status(dc.speedrun_goals(accs, secs + [5.2], 60000)) == dc.GOAL_NOT_MET, "a seed at 5.2 s")
    check(dc.goal_status(dc.speedrun_goals([0.9399] + accs, secs, 60000)) == dc.GOAL_NOT_MET, "a seed at 93.99%")
    g = dc.speedrun_goals(accs, secs, 30000)
    check(dc.goal_status(g) == dc.NOT_JUDGED and "30000 training images" in g[0]["text"], g)

    eager = {"batch": 128, "peak_bytes": 100 << 20, "graph_pool": False,
             "step_ops": {"eager": 52, "graph_outside": None, "graph_inside": None}}
    graph = {"batch": 128, "peak_bytes": 130 << 20, "graph_pool": True,
             "step_ops": {"eager": 52, "graph_outside": 6, "graph_inside": 46}}
    status, text = dc.memory_verdict(eager, graph)
    check(status == "ok" and "eager 100.0 MiB, graph 130.0 MiB" in text and "graph_outside 6" in text, text)
    check(dc.memory_verdict(eager, dict(graph, peak_bytes=90 << 20))[0] == "FAIL", "graph below eager")
    check(dc.memory_verdict(eager, dict(graph, graph_pool=None))[0] == dc.NOT_JUDGED, "no graph ran")
    check(dc.find_field({"verify": {"x": 1}}, "x") == 1 and dc.find_field({"x": 2, "v": {"x": 1}}, "x") == 2
          and dc.find_field({}, "x") is None, "find_field")
    check(dc.lr_suggestion("steepest ... valley rule: 0.02\noptim.lr=0.0123\n") == 0.0123
          and dc.lr_suggestion("no line") is None, "lr_suggestion")


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
    check([r["tier"] for r in steps] == sorted(r["tier"] for r in steps), "rows run tier by tier")
    sys.path.insert(0, str(ROOT / "tools" / "dev"))
    import device_check as dc
    planned = sum(s["estimate"] for s in dc.STEPS if s["tier"] in (1, 2)) + dc.SETUP_ESTIMATE
    check(planned <= dc.DEFAULT_BUDGET,
          f"tiers 1 and 2 estimated {planned} s with the set-up, over the {dc.DEFAULT_BUDGET} s budget: "
          "move a row to tier 3 or shorten it")
    print(f"1. budget 1 s: {len(steps)} rows, GPU rows skipped, the others not run (budget); "
          f"tiers 1 + 2 estimated {planned} s of {dc.DEFAULT_BUDGET}")

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
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "dev" / "device_pack.py"), "--check-needed", str(build),
                        "--venv-python", sys.executable, "--allow", "libopencv_"], capture_output=True, text=True)
    check(r.returncode == 0, r.stdout + r.stderr)
    print("4. " + r.stdout.strip().splitlines()[-1])

    # 5. The readers of the GPU rows, on the same programs' CPU output.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    goal_judges(dc)
    print("5. goals judged: met, not met, not judged")
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
                          "--steps", "1", "--rounds", "1", "--also-round-to", "8", "--latency", "1.2"],
                         capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    n = dc.prune_numbers(out.stdout)
    check({"0.00", "0.30", "0.50", "0.70", "0.50 r8", "latency"} <= set(n) and n["0.00"]["train_x"] == "1.00x",
          (n, out.stdout))
    check(n["latency"]["goal"] == "1.20" and float(n["latency"]["when_pruned"]) > 0
          and any(k.startswith("same MACs r") for k in n), (n, out.stdout))
    print("5. monitor and prune bench tables read")
    js = work / "speed.json"
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "speed.py"), "--binary",
                          str(build / "bin" / "ember_bench_speed"), "--models", "cnn", "--batches", "128", "--sides",
                          "ember", "python", "--reps", "1", "--steps", "1", "--warmup", "0", "--threads", "1",
                          "--json", str(js)], capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stdout[-1000:] + out.stderr[-2000:])
    n = dc.speed_numbers(js)
    check(set(n) == {"cnn b128"} and n["cnn b128"]["ember"] > 0 and n["cnn b128"]["python"] > 0, n)
    g = dc.speed_goals(n)  # no ember-graph side on the CPU: not judged, and it says why
    check(dc.goal_status(g) == dc.NOT_JUDGED and "no ember-graph side" in g[0]["text"], g)
    check("cnn b128: eager" in dc.speed_detail(n), dc.speed_detail(n))
    print(f"5. speed.py's JSON read: {n}")
    if has_data:
        tiny = [f"data.root={data}", "data.train_subset=600", "data.test_subset=100", "data.val_size=0",
                "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false"]
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), "--find-lr", str(work / "lr_find.json"), *tiny,
                              "lr_find.steps=40"], capture_output=True, text=True, env=env)
        lr = dc.lr_suggestion(out.stdout)
        check(out.returncode == 0 and lr is not None and lr > 0, out.stdout[-1000:] + out.stderr[-2000:])
        js = work / "measure.json"
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), "--measure", str(js), *tiny,
                              "trainer.precision=fp32", "plan.precisions=fp32", "plan.verify=true",
                              "plan.timed_steps=2"], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stderr[-2000:])
        m = dc.measure_memory(json.loads(js.read_text()))
        check(m["batch"] == 32 and m["peak_bytes"] > 0 and m["graph_pool"] is False, m)
        ops = m["step_ops"]
        check(isinstance(ops, dict) and ops["eager"] > 0 and ops["graph_outside"] is None, m)
        status, text = dc.memory_verdict(m, m)  # the CPU ran no graph: nothing to compare
        check(status == dc.NOT_JUDGED and "step_ops eager" in text, (status, text))
        print(f"5. lr-find's line read (optim.lr={lr:.3g}); --measure's JSON read: {m}")
        # The scaling row's reader: scaling.py at 1 and 2 Gloo ranks, a few steps each.
        js = work / "scaling.json"
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "scaling.py"), "--bin-dir",
                              str(build / "bin"), "--nproc", "1,2", "--batch", "16", "--warmup", "2", "--steps", "4",
                              "--repeats", "1", "--no-reference", "--data", data, "--work", str(work / "scaling"),
                              "--json", str(js)], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stdout[-1000:] + out.stderr[-2000:])
        n = dc.scaling_numbers(js)
        check(set(n) == {"1", "2"} and n["1"]["ratio"] == 1 and all(
            v["min"] <= v["per_rank"] <= v["max"] and v["per_rank"] > 0 for v in n.values())
              and n["2"]["total"] == 2 * n["2"]["per_rank"], n)  # scaling.py's median x 2: exact
        d = dc.scaling_detail(n)
        check(d.startswith("1 rank: ") and "2 ranks: " in d and "(1.00x" in d, d)
        only = dc.scaling_detail({"1": n["1"]})
        check("scaling needs several GPUs" in only and "x," not in only, only)
        check("| ranks | samples/s per rank" in out.stdout, out.stdout)
        print(f"5. scaling.py's JSON read: {d}")
    # The sharding row's reader: a CPU measurement planned for 8 ranks against bs-find's one rank of 8.
    text = work / "text.txt"
    text.write_text("\n".join(f"the cat {i % 7} sat on the mat {i % 5}" for i in range(3000)) + "\n")
    gpt = [str(build / "bin" / "char_gpt"), f"data.path={text}", "model.n_layer=2", "model.n_embd=32",
           "model.n_head=2", "data.block_size=32", "trainer.precision=fp32", "trainer.progress=false"]
    out = subprocess.run([*gpt, "--measure", str(work / "gpt.json"), "data.batch_size=8", "plan.precisions=fp32",
                          "plan.timed_steps=1"], capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "plan" / "plan.py"), str(work / "gpt.json"), "--json",
                          "--world-size", "8", "--sharding", "all", "--activation-checkpoint", "all"],
                         capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    peaks = {}
    for sharding, ac in (("none", "none"), ("parameters", "full")):
        js = work / f"bs_{sharding}.json"
        r = subprocess.run([*gpt, "--find-batch-size", str(js), "bs_find.world_size=8", f"dist.sharding={sharding}",
                            f"model.activation_checkpoint_every={int(ac == 'full')}", "bs_find.start=8",
                            "bs_find.max_batch=8"], capture_output=True, text=True, env=env)
        check(r.returncode == 0, r.stderr[-2000:])
        peaks[(sharding, ac)] = json.loads(js.read_text())["trials"][0]["peak_bytes"]
    m = json.loads((work / "gpt.json").read_text())
    errors = dc.shard_plan_errors(json.loads(out.stdout), m["parameter_bytes"] + m["buffer_bytes"], peaks)
    check([e["case"] for e in errors] == ["none/none", "parameters/full"]
          and all(e["planned"] > 0 and e["measured"] > 0 and abs(e["error"]) < 1 for e in errors), errors)
    print("5. the sharding row's plan and bs-find read: " +
          ", ".join(f"{e['case']} {100 * e['error']:+.0f}%" for e in errors))
    if not has_data:
        print(f"SKIP: no Fashion-MNIST at {data}: the recipe's result line was not read (everything else passed)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
