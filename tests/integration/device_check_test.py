"""The GPU check stays alive: tools/dev/device_check.py in CPU mode on this build tree.

    python device_check_test.py --build BUILD_DIR --work DIR

With EMBER_DEVICE_ALLOW_CPU=1 and no GPU, on the binaries of BUILD_DIR:
  0. the plan: every step planned once with a basis, each row capped at twice
     its estimate; call 1 on one GPU within CALL1_WORK (420 s) of its 520 s
     budget (a 100 s margin), with several GPUs within the budget, call 2
     within its 200 s; every wave-3 row in call 1 before the speed goal, and
     the speed goal in the first 30% of call 1; the data rows in call 3; the
     wave-3 gtest filters apart from the rest of the *Cuda cases;
  1. a budget too small for any row: every GPU row is skipped (those needing
     several GPUs say so), every other row is `not run (budget)`, and OUT
     holds exactly device_check.txt, device_check.jsonl and logs.tar.gz;
  2. call 1 with time to spare: the CPU rows run and pass (the binaries load,
     the kernels' emulated launches, the doctor with --cpu-only), each GPU
     test case is listed as a row of its own and skipped (the cases skip
     themselves without a GPU), a gtest filter matching no case reads `skip`,
     and a last row says what call 2 runs; each row's seconds are printed
     (the CPU part of the plan, measured);
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
     numbers; the data rows on the CPU, on a small JPEG set made as the pack's
     is: ember_bench_data's JSON line and image_folder's summary read, nvJPEG
     refused on the CPU and the rows FAIL with its error line;
  6. a crash in a gtest process, on a fake gtest binary that dies (SIGSEGV) in
     a chosen case: that case is FAIL and the rest run in ONE new process (a
     filter naming exactly them), one more process per further crash; a death
     before the first case ends it (no loop); a hang is stopped at the row's
     cap (the case `timeout`, the rest `not run`); the rows of gtest_rows();
  7. compute-sanitizer's output mapped: clean -> ok, a finding -> FAIL, the
     tool refused by the machine ("Device not supported" and the others in
     SANITIZER_ENVIRONMENT) -> `skip (environment)` unless a kernel finding is
     there too; the doctor's JSON judged against what the set-up read;
  8. the sharding row's launcher and comparison on 2 Gloo ranks on the CPU
     (the GPU rows run the same code on NCCL), and the SyncBatchNorm row's on
     2 Gloo ranks when Fashion-MNIST is there.
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
sys.path.insert(0, str(ROOT / "tools"))  # the check's parts, in the shared package embertools
from embertools.device_check import (benches as dc_benches, cases as dc_cases, common as dc_common,  # noqa: E402
                                     goals as dc_goals, jpeg_set as dc_jpeg, long_rows as dc_long,
                                     schedule as dc_schedule)
sys.path.insert(0, str(ROOT / "tools" / "dev"))  # device_pack.make_jpeg_set: the pack's JPEG set, smaller
import device_pack  # noqa: E402
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


def short_name(name, n=48):
    return name if len(name) <= n else name[: n - 3] + "..."


def goal_judges():
    """The goals of the GPU rows on fabricated numbers: met, not met, not judged, and the text."""
    g = dc_goals.goal("CNN b128: graphs", 1.73, ">=", 2, "x Python eager")
    check(g["met"] is False and g["text"] == "CNN b128: graphs 1.73x Python eager (goal >= 2: not met)", g)
    check(dc_goals.goal("x", float("nan"), "<", 1)["met"] is None and dc_goals.goal("x", None, "<", 1)["met"] is None, "NaN, None")
    met, missed, unknown = dc_goals.goal("a", 2, ">=", 2), dc_goals.goal("b", 3, "<", 2), dc_goals.goal("c", None, "<", 2)
    check(dc_goals.goal_status([met]) == "ok" and dc_goals.goal_status([met, unknown]) == dc_goals.NOT_JUDGED
          and dc_goals.goal_status([met, missed, unknown]) == dc_goals.GOAL_NOT_MET and dc_goals.goal_status([]) == dc_goals.NOT_JUDGED,
          "goal_status: ok only when every goal is met, not met before not judged")

    fast = {"cnn b128": {"ember": 8.0, "ember-graph": 4.0, "python": 10.0, "python-fused": 9.0, "compile": 5.0}}
    check(dc_goals.goal_status(dc_goals.speed_goals(fast)) == "ok", dc_goals.speed_goals(fast))
    fused_peer = {"cnn b128": dict(fast["cnn b128"], **{"python-fused": 7.0})}  # 2.5x default, 1.75x fused
    check(dc_goals.speed_goals(fused_peer)[0]["met"] is False, ("judged against Python at its best", dc_goals.speed_goals(fused_peer)))
    slow = {"cnn b128": dict(fast["cnn b128"], **{"ember-graph": 6.0})}  # 1.5x Python fused, 0.83x compile
    check([x["met"] for x in dc_goals.speed_goals(slow)] == [False, False], dc_goals.speed_goals(slow))
    no_compile = {"cnn b128": dict(fast["cnn b128"], compile=None, errors={"compile": "torch.compile failed: gcc"})}
    g = dc_goals.speed_goals(no_compile)
    check(dc_goals.goal_status(g) == dc_goals.NOT_JUDGED and g[0]["met"] is True and "gcc" in g[1]["text"], g)

    row = {"pipeline": "224px", "output": "fp32", "achieved_gbs": 3000.0, "host_us": 30.0}
    aug = {"copy_gbs": 4000.0, "rows": [row]}
    check(dc_goals.goal_status(dc_goals.augment_goals(aug)) == "ok", dc_goals.augment_goals(aug))
    aug_slow = {"copy_gbs": 4000.0, "rows": [dict(row, achieved_gbs=2000.0)]}  # 0.5 of copy
    check(dc_goals.goal_status(dc_goals.augment_goals(aug_slow)) == dc_goals.GOAL_NOT_MET, dc_goals.augment_goals(aug_slow))
    check(dc_goals.goal_status(dc_goals.augment_goals({"copy_gbs": 1.0, "rows": []})) == dc_goals.NOT_JUDGED, "no rows")

    check(dc_goals.goal_status(dc_goals.monitor_goals({"default": {"overhead": "-0.40%", "own_time": "0.1%"}})) == "ok", "mon")
    check(dc_goals.goal_status(dc_goals.monitor_goals({"default": {"overhead": "2.50%", "own_time": "0.1%"}})) == dc_goals.GOAL_NOT_MET,
          "monitor 2.5%")
    check(dc_goals.goal_status(dc_goals.monitor_goals({})) == dc_goals.NOT_JUDGED, "monitor without its row")

    amp = {"fp16-mixed": {"ember_ms": 101.0}, "fp16-mixed no-scaler": {"ember_ms": 100.0}}
    check(dc_goals.goal_status(dc_goals.amp_goals(amp)) == "ok", dc_goals.amp_goals(amp))
    amp["fp16-mixed"]["ember_ms"] = 110.0
    check(dc_goals.goal_status(dc_goals.amp_goals(amp)) == dc_goals.GOAL_NOT_MET, dc_goals.amp_goals(amp))

    accs, secs = [0.9412, 0.9430, 0.9401], [4.1, 4.4, 4.9]
    check(dc_goals.goal_status(dc_goals.speedrun_goals(accs, secs, 60000)) == "ok", dc_goals.speedrun_goals(accs, secs, 60000))
    check(dc_goals.goal_status(dc_goals.speedrun_goals(accs, secs + [5.2], 60000)) == dc_goals.GOAL_NOT_MET, "a seed at 5.2 s")
    check(dc_goals.goal_status(dc_goals.speedrun_goals([0.9399] + accs, secs, 60000)) == dc_goals.GOAL_NOT_MET, "a seed at 93.99%")
    g = dc_goals.speedrun_goals(accs, secs, 30000)
    check(dc_goals.goal_status(g) == dc_goals.NOT_JUDGED and "30000 training images" in g[0]["text"], g)

    eager = {"batch": 128, "peak_bytes": 100 << 20, "graph_pool": False,
             "step_ops": {"eager": 52, "graph_outside": None, "graph_inside": None}}
    graph = {"batch": 128, "peak_bytes": 130 << 20, "graph_pool": True,
             "step_ops": {"eager": 52, "graph_outside": 6, "graph_inside": 46}}
    status, text = dc_benches.memory_verdict(eager, graph)
    check(status == "ok" and "eager 100.0 MiB, graph 130.0 MiB" in text and "graph_outside 6" in text, text)
    check(dc_benches.memory_verdict(eager, dict(graph, peak_bytes=90 << 20))[0] == "FAIL", "graph below eager")
    check(dc_benches.memory_verdict(eager, dict(graph, graph_pool=None))[0] == dc_goals.NOT_JUDGED, "no graph ran")
    check(dc_benches.find_field({"verify": {"x": 1}}, "x") == 1 and dc_benches.find_field({"x": 2, "v": {"x": 1}}, "x") == 2
          and dc_benches.find_field({}, "x") is None, "find_field")
    check(dc_benches.lr_suggestion("steepest ... valley rule: 0.02\noptim.lr=0.0123\n") == 0.0123
          and dc_benches.lr_suggestion("no line") is None, "lr_suggestion")

    # The data rows: nvJPEG against the CPU threads; the loader's data wait and accuracies.
    check(dc_goals.goal_status(dc_goals.decode_goals(4000.0, 5200.0)) == "ok", dc_goals.decode_goals(4000.0, 5200.0))
    g = dc_goals.decode_goals(4000.0, 2000.0)
    check(dc_goals.goal_status(g) == dc_goals.GOAL_NOT_MET and "nvJPEG 0.50x the CPU threads' images/s" in g[0]["text"], g)
    check(dc_goals.goal_status(dc_goals.decode_goals(4000.0, None)) == dc_goals.NOT_JUDGED, "no nvJPEG number")
    runs = {"CPU decode": {"data_share": 0.41, "test_accuracy": 0.96}, "nvJPEG": {"data_share": 0.08, "test_accuracy": 0.92}}
    g = dc_goals.loader_goals(runs)
    check(dc_goals.goal_status(g) == "ok" and g[0]["text"].startswith("data wait, the better run (nvJPEG) 8%"), g)
    check(dc_goals.goal_status(dc_goals.loader_goals({k: dict(r, data_share=0.3) for k, r in runs.items()}))
          == dc_goals.GOAL_NOT_MET, "both runs wait 30% of the step")
    check(dc_goals.goal_status(dc_goals.loader_goals(dict(runs, nvJPEG={"data_share": 0.05, "test_accuracy": 0.2})))
          == dc_goals.GOAL_NOT_MET, "an accuracy near chance")
    check(dc_goals.goal_status(dc_goals.loader_goals({k: dict(r, data_share=None) for k, r in runs.items()}))
          == dc_goals.NOT_JUDGED, "no data_share")
    line = dc_long.data_bench_line('[bench] note\n{"side": "ember", "images": 1536, "threads": 16, "readers": 1, '
                                   '"images_per_second": [5012.5, 5100.0], "dct_diff_mean": 0.0000, '
                                   '"dct_diff_max": 0, "samples_skipped": 0}\n')
    check(line["images_per_second"] == [5012.5, 5100.0] and line["samples_skipped"] == 0, line)
    check(dc_jpeg.class_colour(0) == (64, 64, 64) and dc_jpeg.class_colour(5) == (192, 64, 192)
          and len({dc_jpeg.class_colour(k) for k in range(dc_jpeg.CLASSES)}) == dc_jpeg.CLASSES, "class colours")


def plan_checks():
    """0. The plan, from the module: sums, caps, order."""
    check(dc_schedule.plan_problems() == [], dc_schedule.plan_problems())
    steps = dc_schedule.planned_steps()
    check(dc_common.CAP_FACTOR == 2 and all(s["cap"] == 2 * s["estimate"] and s["basis"].strip() for s in steps),
          "every row capped at twice its estimate, with a basis")
    one = dc_schedule.plan_seconds(1, gpus=1)
    check(one <= dc_common.CALL1_WORK and dc_common.CALL1_WORK + 100 <= dc_common.DEFAULT_BUDGET,
          f"call 1 estimated {one} s on one GPU (set-up included): want <= {dc_common.CALL1_WORK} s, a 100 s margin in "
          f"the {dc_common.DEFAULT_BUDGET} s budget; move a row to call 2 or 3, or shorten it")
    several = dc_schedule.plan_seconds(1, gpus=8)
    check(several > one and several <= dc_common.DEFAULT_BUDGET,
          f"call 1 with several GPUs estimated {several} s: want its rows for several GPUs in it, within the budget")
    two = dc_schedule.plan_seconds(2)
    check(two <= dc_common.CALL2_BUDGET, f"call 2 estimated {two} s, over its {dc_common.CALL2_BUDGET} s budget")
    call1 = dc_schedule.planned_steps((1,))
    names = [s["name"] for s in call1]
    wave3 = [n for n in names if n.startswith("wave 3:")]
    check(len(wave3) >= 5 and all(names.index(n) < names.index(dc_benches.SPEED_GOAL_ROW) for n in wave3),
          ("the wave-3 rows in call 1 before the speed goal", names))
    before = dc_common.SETUP_ESTIMATE + sum(s["estimate"] for s in call1[:names.index(dc_benches.SPEED_GOAL_ROW)])
    check(before <= 0.3 * dc_common.CALL1_WORK, f"the speed goal starts at ~{before} s into call 1: want it early")
    many = [s for s in dc_schedule.planned_steps() if s["gpus"] > 1]
    check(many and all(s["call"] == 1 and "GPUs" in s["name"] for s in many),
          "the rows needing several GPUs are in call 1 (skipped at once on one GPU) and say so in their names")
    check(any(s["name"].startswith("compute-sanitizer racecheck") for s in dc_schedule.planned_steps((2,))), "racecheck: call 2")
    check({dc_long.DECODE_ROW, dc_long.LOADER_ROW} <= {s["name"] for s in dc_schedule.planned_steps((3,))},
          "the data rows: call 3")
    m = dc_cases.gtest_match
    check(m("ShardingCuda.ZeroThreeMatchesDdp", dc_cases.WAVE3_SHARDING_FILTER)
          and m("SyncBatchNormCuda.TwoReplicas", dc_cases.WAVE3_SHARDING_FILTER)
          and not m("ShardingCuda.ZeroThreeMatchesDdp", dc_cases.GPU_CASES_FILTER)
          and not m("ActivationCheckpointCuda.UnderAGraph", dc_cases.GPU_CASES_FILTER)
          and m("ActivationCheckpointCuda.UnderAGraph", dc_cases.WAVE3_AC_FILTER)
          and m("Backend/OpsCuda.CudaPathMatchesTheCpuReference/3", dc_cases.GPU_CASES_FILTER)
          and m("PruneLatencyCuda.MeetsItsTarget", dc_cases.GPU_CASES_FILTER)
          and not m("FusedOptim.CudaGraphOnTheCpuIsAConfigError", dc_cases.GPU_CASES_FILTER)
          and not m("ShardingCuda.X", dc_cases.WAVE3_AC_FILTER), "gtest filters: the wave-3 suites apart from the rest")
    check(m("A.b", "") and m("A.b", "A.?") and not m("A.bc", "A.?") and not m("A.b", "*-A.*") and m("B.b", "*-A.*"),
          "gtest_match: '*', '?', negative patterns")
    r = subprocess.run([sys.executable, str(CHECK), "--plan"], capture_output=True, text=True)
    check(r.returncode == 0 and "call 1:" in r.stdout and "needs 2 GPUs" in r.stdout and dc_benches.SPEED_GOAL_ROW in r.stdout,
          r.stdout[-2000:] + r.stderr)
    return one, several, two


FAKE_GTEST = r'''
import json, os, re, signal, sys, time
CASES = [("A.", ["one", "two"]), ("B.", ["three/0  # GetParam() = 1", "three/1  # GetParam() = 2"]), ("C.", ["four"])]
NAMES = [s + t.split()[0] for s, ts in CASES for t in ts]
env = lambda k: [x for x in os.environ.get(k, "").split(",") if x]
with open(os.environ["FAKE_GTEST_CALLS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
if "--gtest_list_tests" in sys.argv:
    for suite, tests in CASES:
        print(suite)
        for t in tests:
            print("  " + t)
    sys.exit(0)
filt = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--gtest_filter=")), "*")
pos, _, neg = filt.partition("-")
pat = lambda p: re.compile("|".join(re.escape(x).replace(r"\*", ".*") for x in p.split(":") if x) or "(?!)")
chosen = [n for n in NAMES if pat(pos or "*").fullmatch(n) and not pat(neg).fullmatch(n)]
if env("FAKE_GTEST_DIE_AT_START"):
    print("terminate called after throwing an instance of 'c10::Error'", flush=True)
    os.kill(os.getpid(), signal.SIGABRT)
failed = 0
for n in chosen:
    print(f"[ RUN      ] {n}", flush=True)
    if n in env("FAKE_GTEST_CRASH"):
        print("CUDA error: an illegal memory access was encountered", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if n in env("FAKE_GTEST_HANG"):
        time.sleep(600)
    if n in env("FAKE_GTEST_FAIL"):
        print(f"fake_test.cpp:12: Failure\nExpected equality of these values:\n  1\n  2")
        print(f"[  FAILED  ] {n} (3 ms)")
        failed += 1
    elif n in env("FAKE_GTEST_SKIP"):
        print("fake_test.cpp:9: Skipped\nno CUDA device\n")
        print(f"[  SKIPPED ] {n} (0 ms)")
    else:
        print(f"[       OK ] {n} (5 ms)")
sys.stdout.flush()
if env("FAKE_GTEST_DIE_AT_EXIT"):
    os.kill(os.getpid(), signal.SIGABRT)
sys.exit(1 if failed else 0)
'''


def new_check(work, build):
    """A Check as main() makes it, for calling the rows' functions directly."""
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    c = dc_common.Check(argparse.Namespace(out=str(out), work=str(work), python=sys.executable, budget=600,
                                           binaries=str(build), data=None))
    c.bins = build
    c.env["OMP_NUM_THREADS"] = "1"
    return c


def crash_resume(work, build):
    """6. The gtest runner on a fake binary that crashes, hangs, dies at start or at exit."""
    c = new_check(work, build)
    fake = work / "fake_gtest"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_GTEST)
    fake.chmod(0o755)
    calls = work / "calls.jsonl"
    listing = subprocess.run([str(fake), "--gtest_list_tests"], capture_output=True, text=True,
                             env=dict(os.environ, FAKE_GTEST_CALLS=str(calls))).stdout
    names = dc_common.gtest_listing(listing)
    check(names == ["A.one", "A.two", "B.three/0", "B.three/1", "C.four"], names)

    def run(log, **env):
        calls.write_text("")
        for k in [k for k in c.env if k.startswith("FAKE_GTEST_")]:
            del c.env[k]
        c.env.update({f"FAKE_GTEST_{k.upper()}": v for k, v in env.items()}, FAKE_GTEST_CALLS=str(calls))
        got = dc_cases.run_gtest(c, fake, names, "*", log)
        return got, [json.loads(l) for l in calls.read_text().splitlines()]

    (res, deaths, processes, stopped), argv = run("one_crash.log", crash="A.two", fail="C.four")
    check(processes == 2 and len(argv) == 2 and stopped is None, (processes, argv))
    check(argv[1] == ["--gtest_filter=B.three/0:B.three/1:C.four"], ("one process for the rest, by name", argv))
    check(res["A.two"][0] == "FAIL" and "died in it (killed by SIGSEGV)" in res["A.two"][1]
          and "illegal memory access" in res["A.two"][1], res["A.two"])
    check(res["A.one"][0] == res["B.three/0"][0] == res["B.three/1"][0] == "ok", res)
    check(res["C.four"][0] == "FAIL" and "Failure" in res["C.four"][1], res["C.four"])
    check(deaths == [("A.two", "killed by SIGSEGV")], deaths)

    (res, deaths, processes, _), argv = run("two_crashes.log", crash="A.one,B.three/1")
    check(processes == 3 and [a[0] for a in argv[1:]] == ["--gtest_filter=A.two:B.three/0:B.three/1:C.four",
                                                          "--gtest_filter=C.four"], argv)
    check([res[n][0] for n in names] == ["FAIL", "ok", "ok", "FAIL", "ok"], res)

    (res, deaths, processes, _), argv = run("at_start.log", die_at_start="1")
    check(processes == 1 and all(r[0] == "FAIL" and "before running it" in r[1] for r in res.values()), res)

    (res, deaths, processes, _), argv = run("at_exit.log", die_at_exit="1")
    check(processes == 1 and deaths == [(None, "killed by SIGABRT")] and all(r[0] == "ok" for r in res.values()),
          (res, deaths))

    c.row_deadline, c.row_cap = time.monotonic() + 3, (3, 1.5)
    (res, deaths, processes, stopped), argv = run("hang.log", hang="B.three/0")
    c.row_deadline = c.row_cap = None
    check(stopped and "cap of 3 s" in stopped and res["B.three/0"][0] == "timeout"
          and [res[n][0] for n in ("A.one", "A.two", "B.three/1", "C.four")] == ["ok", "ok", "not run", "not run"],
          (stopped, res))

    # The rows: one per test (B.three over its two cases), then the filter's row.
    c.gtest_listing = names
    c.exe = lambda name: fake
    calls.write_text("")
    for k in [k for k in c.env if k.startswith("FAKE_GTEST_")]:
        del c.env[k]
    c.env.update(FAKE_GTEST_CALLS=str(calls), FAKE_GTEST_CRASH="A.two", FAKE_GTEST_SKIP="B.three/0,B.three/1")
    before = len(c.results.rows)
    dc_cases.gtest_rows(c, "fake cases", "A.*:B.*", "rows.log")
    dc_cases.gtest_rows(c, "no such cases", "Nothing.*", "none.log")
    rows = {r["name"]: r for r in c.results.rows[before:]}
    check(rows["gpu test A.one"]["status"] == "ok" and rows["gpu test A.two"]["status"] == "FAIL"
          and rows["gpu test B.three"]["status"] == "skip" and "gpu test C.four" not in rows, rows)
    check(rows["fake cases"]["status"] == "FAIL" and "died in A.two (killed by SIGSEGV)" in rows["fake cases"]["detail"]
          and "2 processes" in rows["fake cases"]["detail"], rows["fake cases"])
    check(rows["no such cases"]["status"] == "skip" and "no case matched" in rows["no such cases"]["detail"],
          rows["no such cases"])


def sanitizer_and_doctor():
    """7. compute-sanitizer's and the doctor's output judged, on made-up outputs."""
    v = dc_cases.sanitizer_verdict
    clean = "========= COMPUTE-SANITIZER\n[  PASSED  ] 14 tests.\n========= ERROR SUMMARY: 0 errors\n"
    check(v(0, clean)[:2] == ("ok", "14 tests, 0 errors"), v(0, clean))
    found = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 4 bytes\n=========     at "
             "augment_kernel+0x1a0\n[  PASSED  ] 14 tests.\n========= ERROR SUMMARY: 1 error\n")
    check(v(3, found)[0] == "FAIL" and "Invalid __global__ write" in v(3, found)[1] and v(3, found)[2] == 1, v(3, found))
    race = ("========= Error: Race reported between Write access at count_correct+0x80\n"
            "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    check(v(3, race)[0] == "FAIL" and "Race reported" in v(3, race)[1], v(3, race))
    # gVisor (KINDS.md): refused, then error 999 at the first allocation; the tests fail uninstrumented.
    gvisor = ("========= COMPUTE-SANITIZER\n========= Error: Device not supported. Please refer to the \"Supported "
              "Devices\" section of the sanitizer documentation\n[ RUN      ] AugmentCuda.X\nunknown error\n"
              "CUDA error 999\n[  FAILED  ] AugmentCuda.X (1 ms)\n========= ERROR SUMMARY: 2 errors\n")
    check(v(3, gvisor)[0] == "skip (environment)" and "Device not supported" in v(3, gvisor)[1], v(3, gvisor))
    for said in ("========= Error: Target application terminated before first instrumented API call\n",
                 "========= Unable to find injection library libsanitizer-collection.so\n",
                 "========= Error: Failed to initialize WDDM debugger interface.\n"):
        check(v(255, said)[0] == "skip (environment)", (said, v(255, said)))
    both = gvisor + "========= Invalid __shared__ read of size 4 bytes\n"
    check(v(3, both)[0] == "FAIL", ("a kernel finding is never the environment", v(3, both)))
    check(v(0, "[  PASSED  ] 14 tests.\n")[0] == "FAIL", "no summary: not ok")

    facts = {"nvml": {"driver": "580.159.04", "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]},
             "torch": {"version": "2.11.0+cu130", "device_count": 1}}
    checks = [{"name": n, "status": "ok", "detail": f"{n} fine", "todo": ""} for n in dc_goals.DOCTOR_GPU_CHECKS]
    checks.append({"name": "shm", "status": "warning", "detail": "/dev/shm holds 64 MiB", "todo": ""})
    expect = {"gpus": 1, "gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0+cu130"}
    good = "$ doctor.py --json\n" + json.dumps({"checks": checks, "exit": 0, "facts": facts}, indent=1)
    status, detail, numbers = dc_goals.doctor_verdict(0, good, expect)
    check(status == "ok" and "this machine: shm warning" in detail and numbers["gpus"] == "ok", (status, detail))
    check(dc_goals.doctor_verdict(0, good, dict(expect, driver="580.159.03"))[0] == "FAIL", "driver read differently")
    check(dc_goals.doctor_verdict(0, good, dict(expect, gpus=2))[0] == "FAIL", "GPU count read differently")
    checks[2] = dict(checks[2], status="failure", detail="no NVIDIA GPU visible")
    failing = json.dumps({"checks": checks, "exit": 1, "facts": facts})
    check(checks[2]["name"] == "gpus" and dc_goals.doctor_verdict(1, failing, expect)[0] == "FAIL", "the gpus check failed")
    check(dc_goals.doctor_verdict(-11, "Segmentation fault", expect)[0] == "FAIL", "no JSON")


def data_rows(work, build):
    """5. The data rows' code on the CPU: a small JPEG set made as device_pack.py makes the pack's (jpeg_set.py,
    smaller images), the shards repeated into an epoch; decode_row and loader_row with device=cpu: the CPU
    side's numbers read (ember_bench_data's JSON line, summary.json's monitor), nvJPEG refused on the CPU and
    the row FAIL with that side's first error line."""
    c = new_check(work, build)
    jpeg = work / "jpeg"
    counts = device_pack.make_jpeg_set(jpeg, build / "bin" / "ember_shards", splits=(("train", 16, 0), ("val", 8, 1)),
                                       long_side=120, say=lambda _: None)
    check(counts == {"train": 16, "val": 8} and dc_jpeg.split_images(jpeg, "train") == 16
          and not (jpeg / "images").exists(), counts)
    listed = json.loads((jpeg / "train.json").read_text())["shardlist"]
    n = dc_jpeg.repeated_manifest(jpeg / "train.json", work / "elsewhere" / "x3.json", 3)
    again = json.loads((work / "elsewhere" / "x3.json").read_text())["shardlist"]
    check(n == 48 and len(again) == 3 * len(listed) and all(Path(e["url"]).is_absolute() and Path(e["url"]).is_file()
                                                          for e in again), again)
    c.jpeg = jpeg
    dc_long.decode_row(c, "decode on the cpu", device="cpu", threads=1, per_epoch=32, batch=8, size=64, epochs=2)
    r = c.results.rows[-1]
    check(r["status"] == "FAIL" and "nvJPEG: exit 1: ember_bench_data: " in r["detail"]
          and "nvjpeg" in r["detail"].split("ember_bench_data: ", 1)[1].lower() and "CPU decode" in r["detail"]
          and r["numbers"]["cpu"]["images_per_second"] > 0 and r["numbers"]["cpu"]["images"] == 32, r)
    print(f"5. the decode row on the CPU: {r['detail']}")
    tiny = ("augment.size=[32,32]", "model.width=8", "model.blocks=1", "data.batch_size=16", "data.eval_batch_size=8",
            "trainer.epochs=2", "sched.warmup_epochs=0.5", "trainer.precision=fp32", "trainer.threads=1")
    dc_long.loader_row(c, "loader on the cpu", device="cpu", threads=1, per_epoch=32, args=tiny)
    r = c.results.rows[-1]
    check(r["status"] == "FAIL" and "nvJPEG: exit 2: error: " in r["detail"] and "data.stream.nvjpeg" in r["detail"], r)
    cpu = r["numbers"]["cpu"]
    check(cpu["samples_per_second"] > 0 and 0 <= cpu["data_share"] <= 1 and 0 <= cpu["test_accuracy"] <= 1
          and cpu["steps"] == 4 and cpu["step_ms"] > 0, cpu)
    print(f"5. the loader row on the CPU: {r['detail']}")


def distributed_rows(work, build, data):
    """8. The several-GPU rows' code on 2 Gloo ranks on the CPU."""
    c = new_check(work, build)
    dc_cases.sharding_vs_ddp(c, "sharding on 2 gloo ranks", 2, ("parameters",), device="cpu", backend="gloo")
    r = c.results.rows[-1]
    check(r["status"] == "ok" and "every rank equal to rank 0" in r["detail"]
          and r["numbers"]["parameters"]["vs_ddp"] <= 2 * 2.0 ** -52 * 3595 * 21, r)  # float64 (BlockNet, odd)
    print(f"8. sharding on 2 Gloo ranks: {r['detail']} ({r['seconds']:.0f} s)")
    if data:
        c.data = Path(data)
        dc_cases.sync_batchnorm_ranks(c, "sync batch norm on 2 gloo ranks", 2, device="cpu")
        r = c.results.rows[-1]
        check(r["status"] == "ok", r)
        print(f"8. SyncBatchNorm on 2 Gloo ranks: {r['detail']} ({r['seconds']:.0f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    build, work = Path(a.build), Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 0. The plan.
    one, several, two = plan_checks()
    print(f"0. plan: call 1 {one} s on one GPU ({several} s with several) of {dc_common.DEFAULT_BUDGET}, call 2 {two} s "
          f"of {dc_common.CALL2_BUDGET}; caps at 2x, wave 3 and the speed goal first")

    # 1. No time for any row.
    out = work / "out1"
    p = run(["--budget", "1", "--call", "1", "--call", "2", "--call", "3"], build, out, work / "w1")
    text, _ = p.communicate(timeout=300)
    check(p.returncode == 0, text)
    check_files(out)
    rows = rows_of(out)
    steps = [r for r in rows if r["status"] not in ("info",) and r["name"] != "summary"]
    check(len(steps) == sum(len(s["rows"]) for s in dc_schedule.planned_steps()), (len(steps), text))
    for r in steps:
        want = "skip" if is_gpu_row(r) else "not run (budget)"
        check(r["status"] == want, (r, text))
    several_gpus = {s["name"] for s in dc_schedule.planned_steps() if s["gpus"] > 1}
    check(all("needs 2 GPUs" in r["detail"] for r in steps if r["name"] in several_gpus), "several-GPU rows say so")
    check(any(r["call"] == 3 for r in steps), "call 3 rows are listed too")
    check([r["call"] for r in steps] == sorted(r["call"] for r in steps), "rows run call by call")
    print(f"1. budget 1 s: {len(steps)} rows, GPU rows skipped ({len(several_gpus)} needing several GPUs say so), "
          f"the others not run (budget)")

    # 2. Call 1 with time: CPU rows pass, GPU cases skip one by one.
    out = work / "out2"
    p = run(["--budget", "600", "--call", "1"], build, out, work / "w2")
    text, _ = p.communicate(timeout=900)
    check(p.returncode == 0, text)
    names = check_files(out)
    rows = {r["name"]: r for r in rows_of(out)}
    check(rows["binaries load (every library found)"]["status"] == "ok", rows)
    check(rows["kernels, emulated launches (CPU)"]["status"] == "ok", rows)
    check(rows[dc_goals.DOCTOR_ROW]["status"] == "ok" and "--cpu-only" in rows[dc_goals.DOCTOR_ROW]["detail"], rows[dc_goals.DOCTOR_ROW])
    cases = [r for n, r in rows.items() if n.startswith("gpu test ")]
    check(len(cases) >= 12, [r["name"] for r in cases])
    want = {"gpu test AugmentCuda.ParamsOnTheDeviceOrPinnedAndStridedInputs",
            "gpu test Backend/OpsCuda.CudaPathMatchesTheCpuReference",
            "gpu test ActivationCheckpointCuda.TheRecomputeDrawsTheForwardsCudaRandomNumbers"}
    check(want <= rows.keys(), f"rows missing: {sorted(want - rows.keys())}")
    for r in cases:
        check(r["status"] == "skip" and "no CUDA device" in r["detail"], r)
    for row in (dc_cases.GPU_CASES_ROW, dc_cases.WAVE3_AC_ROW, dc_cases.WAVE3_SHARDING_ROW):
        check(rows[row]["status"] == "skip", rows[row])
    if not any(n.startswith(("gpu test ShardingCuda.", "gpu test SyncBatchNormCuda.")) for n in rows):
        check("no case matched" in rows[dc_cases.WAVE3_SHARDING_ROW]["detail"], rows[dc_cases.WAVE3_SHARDING_ROW])
    check(rows["call 2 next"]["status"] == "info" and "racecheck" in rows["call 2 next"]["detail"], rows["call 2 next"])
    for n, r in rows.items():
        if is_gpu_row(r):
            check(r["status"] in ("skip", "not run (budget)"), r)
        check(r["status"] not in ("FAIL", "timeout"), r)
    check(rows["summary"]["status"] == "ok", rows["summary"])
    check("logs/gtest_emulated.log" in names and "logs/gtest_cuda.log" in names, names)
    timed = [r for r in rows_of(out) if r["seconds"] and r["name"] not in ("summary",)
             and not r["name"].startswith("gpu test ")]
    print(f"2. call 1: {len(cases)} GPU cases skipped one by one, emulated launches, loading and the doctor ok; "
          "the CPU part, measured: " + ", ".join(f"{short_name(r['name'])} {r['seconds']:.1f} s" for r in timed)
          + f"; all {rows['summary']['seconds']:.0f} s")

    # 3. Interrupted in the middle of call 1.
    out = work / "out3"
    p = run(["--budget", "600", "--call", "1"], build, out, work / "w3", start_new_session=True)
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
    goal_judges()
    print("5. goals judged: met, not met, not judged")
    data = "/usr/share/datasets/fashion-mnist"
    has_data = Path(data, "train-images-idx3-ubyte.gz").exists()
    if has_data:
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), f"data.root={data}", "data.train_subset=700",
                              "data.test_subset=200", "data.val_size=200", "trainer.epochs=1", "trainer.progress=false",
                              f"run.dir={work / 'recipe_run'}"], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stderr[-2000:])
        v = dc_common.result_values(out.stdout)
        check(0 < v["test_accuracy"] <= 1 and v["samples_per_second"] > 0 and v["epochs"] == 1, v)
        print(f"5. recipe result line: {sorted(v)}")
    out = subprocess.run([str(build / "bin" / "ember_bench_monitor"), "--device", "cpu", "--batch-size", "8",
                          "--steps", "3", "--rounds", "1"], capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    n = dc_long.monitor_numbers(out.stdout)
    check(set(n) == {"default", "full"} and all(x["overhead"].endswith("%") for x in n.values()),
          (n, out.stdout))
    out = subprocess.run([str(build / "bin" / "ember_bench_prune"), "--device", "cpu", "--blocks", "1", "--batch", "4",
                          "--steps", "1", "--rounds", "1", "--also-round-to", "8", "--latency", "1.2"],
                         capture_output=True, text=True, env=env)
    check(out.returncode == 0, out.stderr[-2000:])
    n = dc_long.prune_numbers(out.stdout)
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
    n = dc_benches.speed_numbers(js)
    check(set(n) == {"cnn b128"} and n["cnn b128"]["ember"] > 0 and n["cnn b128"]["python"] > 0, n)
    g = dc_goals.speed_goals(n)  # no ember-graph side on the CPU: not judged, and it says why
    check(dc_goals.goal_status(g) == dc_goals.NOT_JUDGED and "no ember-graph side" in g[0]["text"], g)
    check("cnn b128: eager" in dc_benches.speed_detail(n), dc_benches.speed_detail(n))
    print(f"5. speed.py's JSON read: {n}")
    if has_data:
        tiny = [f"data.root={data}", "data.train_subset=600", "data.test_subset=100", "data.val_size=0",
                "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false"]
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), "--find-lr", str(work / "lr_find.json"), *tiny,
                              "lr_find.steps=40"], capture_output=True, text=True, env=env)
        lr = dc_benches.lr_suggestion(out.stdout)
        check(out.returncode == 0 and lr is not None and lr > 0, out.stdout[-1000:] + out.stderr[-2000:])
        js = work / "measure.json"
        out = subprocess.run([str(build / "bin" / "fashion_mnist"), "--measure", str(js), *tiny,
                              "trainer.precision=fp32", "plan.precisions=fp32", "plan.verify=true",
                              "plan.timed_steps=2"], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stderr[-2000:])
        m = dc_benches.measure_memory(json.loads(js.read_text()))
        check(m["batch"] == 32 and m["peak_bytes"] > 0 and m["graph_pool"] is False, m)
        ops = m["step_ops"]
        check(isinstance(ops, dict) and ops["eager"] > 0 and ops["graph_outside"] is None, m)
        status, text = dc_benches.memory_verdict(m, m)  # the CPU ran no graph: nothing to compare
        check(status == dc_goals.NOT_JUDGED and "step_ops eager" in text, (status, text))
        print(f"5. lr-find's line read (optim.lr={lr:.3g}); --measure's JSON read: {m}")
        # The scaling row's reader: scaling.py at 1 and 2 Gloo ranks, a few steps each.
        js = work / "scaling.json"
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "scaling.py"), "--bin-dir",
                              str(build / "bin"), "--nproc", "1,2", "--batch", "16", "--warmup", "2", "--steps", "4",
                              "--repeats", "1", "--no-reference", "--data", data, "--work", str(work / "scaling"),
                              "--json", str(js)], capture_output=True, text=True, env=env)
        check(out.returncode == 0, out.stdout[-1000:] + out.stderr[-2000:])
        n = dc_benches.scaling_numbers(js)
        check(set(n) == {"1", "2"} and n["1"]["ratio"] == 1 and all(
            v["min"] <= v["per_rank"] <= v["max"] and v["per_rank"] > 0 for v in n.values())
              and n["2"]["total"] == 2 * n["2"]["per_rank"], n)  # scaling.py's median x 2: exact
        d = dc_benches.scaling_detail(n)
        check(d.startswith("1 rank: ") and "2 ranks: " in d and "(1.00x" in d, d)
        only = dc_benches.scaling_detail({"1": n["1"]})
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
    errors = dc_benches.shard_plan_errors(json.loads(out.stdout), m["parameter_bytes"] + m["buffer_bytes"], peaks)
    check([e["case"] for e in errors] == ["none/none", "parameters/full"]
          and all(e["planned"] > 0 and e["measured"] > 0 and abs(e["error"]) < 1 for e in errors), errors)
    print("5. the sharding row's plan and bs-find read: " +
          ", ".join(f"{e['case']} {100 * e['error']:+.0f}%" for e in errors))
    data_rows(work / "w5", build)
    crash_resume(work / "w6", build)
    print("6. gtest crash: the rest resumed in one process per crash; death at start, at exit, a hang at the cap")
    sanitizer_and_doctor()
    print("7. compute-sanitizer: ok, FAIL, skip (environment); the doctor's JSON against the set-up's reading")
    distributed_rows(work / "w8", build, data if has_data else None)
    if not has_data:
        print(f"SKIP: no Fashion-MNIST at {data}: the recipe's result line was not read (everything else passed)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
