#!/usr/bin/env python3
"""Ember's GPU check: the checks that need a GPU, in calls planned row by row for a short GPU lease.

    tools/ember device-check [--call N ...] [--budget SECONDS] [--binaries DIR] [--out DIR]
    tools/ember device-check --plan          # the plan: each row's call, estimate, cap and basis

Made for a lent GPU machine that has python3 with a CUDA torch but no Debian
packages, and a lease of 15 minutes of device time, the machine's start
included, at most 10 minutes a command: it runs from the prebuilt binaries
that `tools/ember device-pack` put in .device/ when that machine's torch
matches the one they were built against (same version, same CUDA major), and
builds them there otherwise, saying which it did and why.

The plan (PLAN, at the end of the rows) gives every row its call, its
expected seconds on one H100/H200 with the basis of that number, and a cap
at twice it. Rows run in the plan's order:
  call 1 (the default; one command of 540 s, budget 520 s, at most
          CALL1_WORK = 420 s of estimated work on one GPU): the binaries and the kernels' emulated launches,
          the doctor on this machine, wave 3 first (ZeRO sharding and
          SyncBatchNorm over a 2-rank replica group on CUDA, activation
          checkpointing under CUDA graphs, ZeRO-3 on NCCL with one rank, the
          planner's sharding memory against bs-find, the checkpointing bench),
          the GPU speed goal, every other GPU test case, compute-sanitizer
          memcheck, the operators from Python, a one-epoch run per precision
          mode (bf16's with its telemetry), a profiler trace, out of memory,
          NCCL with one rank, the fused optimizers' parity with torch, memory
          eager vs CUDA graph, lr-find on a graph config, plan against the
          GPU; then the rows that need several GPUs (sharding and
          SyncBatchNorm across GPUs on NCCL), which on one GPU read
          `skip` with "needs 2 GPUs";
  call 2 (at once after call 1 when 4 minutes of the lease are left; one
          command of 240 s, --call 2 --budget 200): compute-sanitizer
          racecheck, the latency target and tensor-core rounding, the
          head-pruned GPT, the GradScaler's parity with torch;
  call 3 (another lease): the long rows: the speed run's 5 seeds, the
          data rows (the pack's JPEG shards decoded into 224 batches by a
          CPU thread per core against nvJPEG, and image_folder training a
          ResNet from them both ways: images/s, the monitor's data wait), the
          benches (augmentation bandwidth, monitoring, mixed precision,
          pruning, the whole speed table, weak scaling), accuracies that take
          minutes, char_gpt's GPU config, bs-find's out-of-memory search; one
          command of it runs the first ~500 s of its 1300.
Before each row it compares the row's estimate with the time left and reports
`not run (budget)` instead of starting what would not finish; a row stops at
its cap (twice its estimate) or at the budget, whichever comes first, and
reads `timeout`; the check goes on with the next row. At the end of call 1 a
row says what call 2 runs.

The GPU test cases (the gtest suites named *Cuda, which skip themselves
without a GPU) run by gtest filter: each wave-3 suite pattern is a row of its
own, the rest is one row, and each case is a row. A filter that matches no
case in the binary reads `skip` ("no case matched"). A pattern's cases run in
one process; when it dies (a CUDA fault), the case it died in is FAIL and the
cases not yet run go on in ONE new process (a filter naming them), again
after each death.

Statuses: ok, FAIL, timeout, skip, skip (environment), info, not run (budget),
not run, interrupted; `skip (environment)` is a tool that this machine does
not let run (compute-sanitizer refused by a gVisor-hosted GPU: "Device not
supported"), not a finding about Ember. A row with a stated goal (a speed
ratio, a bandwidth, an accuracy in a time) is `ok` when every goal is met,
`goal not met` when one is not and `not judged` when a number it needs is
missing (a side that did not run, a data subset), each goal in its detail as
"graphs 1.73x Python eager (goal >= 2: not met)". The summary counts every
status; its own is the worst of FAIL/timeout, goal not met, not judged, ok.
Exit status 1 on a FAIL, timeout or goal not met.

Results: each row is appended, as soon as it is known, to OUT/device_check.txt
(the table) and OUT/device_check.jsonl (one JSON object per row: name, call,
gpu, status, detail, numbers, seconds); every log goes into OUT/logs.tar.gz,
rewritten after each row and on interruption (SIGTERM, SIGINT). Nothing else
is written to OUT ($OUT, else /tmp/ember-device-out). Scratch files live in
--work (default /tmp/ember-device-check).

Without a GPU it stops, unless EMBER_DEVICE_ALLOW_CPU=1: then the GPU rows are
reported as skipped (the GPU test cases skip themselves) and the CPU rows run,
which is how CI keeps this script alive.

Needs only the standard library; torch is imported in child processes (the
python given by EMBER_DEVICE_PYTHON, default this interpreter).
"""
import argparse
import datetime
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the shared package, embertools

from embertools.device_check.common import (CALL2_BUDGET, CAP_FACTOR, Check, DEFAULT_BUDGET, Interrupted,
    RESULT_FILES, ROOT, SETUP_ESTIMATE, StepTimeout, on_signal, short)
from embertools.device_check.goals import GOAL_NOT_MET, NOT_JUDGED
from embertools.device_check.schedule import CALLS, plan_problems, plan_seconds, plan_table, planned_steps


# ---- main -------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--call", "--tier", dest="call", type=int, action="append", choices=sorted(CALLS),
                   help="run this call's rows (repeatable; default 1; --tier is its old name)")
    p.add_argument("--budget", type=float,
                   help=f"seconds for the whole check (default {DEFAULT_BUDGET}; {CALL2_BUDGET} for --call 2 alone)")
    p.add_argument("--plan", action="store_true", help="print the plan (calls, estimates, caps, bases) and exit")
    p.add_argument("--binaries", help="use this build tree's binaries (bin/, lib/, tests/) instead of the pack")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/ember-device-out", help="result folder ($OUT)")
    p.add_argument("--work", default="/tmp/ember-device-check", help="scratch folder (logs, runs, a build)")
    p.add_argument("--data", help="Fashion-MNIST folder (default: the pack's subset, else Debian's)")
    p.add_argument("--python", default=os.environ.get("EMBER_DEVICE_PYTHON") or sys.executable,
                   help="python with torch (default: $EMBER_DEVICE_PYTHON, else this one)")
    args = p.parse_args()
    problems = plan_problems()
    if problems:
        print("error: [device-check] the plan does not match the steps: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.plan:
        print(plan_table())
        return 0
    calls = sorted(set(args.call or [1]))
    if args.budget is None:
        args.budget = CALL2_BUDGET if calls == [2] else DEFAULT_BUDGET
    if not args.budget > 0:
        print(f"error: [device-check] --budget {args.budget:g}: must be a positive number of seconds", file=sys.stderr)
        return 2

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES + ("logs.tar.gz.part",):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    c = Check(args)
    steps = planned_steps(calls)
    status = 0
    try:
        commit = ""
        if (ROOT / ".git").exists() and shutil.which("git"):
            r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            commit = r.stdout.strip()
        c.report("device check", "info", f"{datetime.datetime.now().isoformat(timespec='seconds')} on "
                 f"{os.uname().nodename}, call {','.join(map(str, calls))}, budget {args.budget:.0f} s (rows "
                 f"estimated {sum(s['estimate'] for s in steps if s['gpus'] <= 1)} s on one GPU, "
                 f"{sum(s['estimate'] for s in steps if s['gpus'] > 1)} s more with several, + set-up "
                 f"~{SETUP_ESTIMATE} s; each capped at {CAP_FACTOR}x its estimate)"
                 + (f", tree {commit}" if commit else ""))
        try:
            ready = c.describe_machine() and c.find_binaries()
        except (StepTimeout, RuntimeError, OSError, ValueError) as e:
            c.report("set-up", "FAIL", short(e, 300))
            ready = False
        c.find_data()
        c.write_logs()
        for s in steps:
            c.call = s["call"]
            c.current = s
            if not ready:
                for r in s["rows"]:
                    c.report(r, "not run", "no binaries (see the rows above)")
                continue
            if s["gpu"] and not c.gpu:
                for r in s["rows"]:
                    c.report(r, "skip", "no CUDA device" + (f"; needs {s['gpus']} GPUs" if s["gpus"] > 1 else ""))
                continue
            if s["gpus"] > 1 and s["gpus"] > c.gpus():
                for r in s["rows"]:
                    c.report(r, "skip", f"needs {s['gpus']} GPUs, this machine has {c.gpus()}")
                continue
            if s["estimate"] > c.left():
                for r in s["rows"]:
                    c.report(r, "not run (budget)", f"needs ~{s['estimate']} s, {max(c.left(), 0):.0f} s left")
                continue
            t0 = time.monotonic()
            c.row_deadline, c.row_cap = t0 + s["cap"], (s["cap"], s["estimate"])
            before = len(c.results.rows)
            try:
                s["fn"](c)
            except StepTimeout as e:
                c.report(s["rows"][0], "timeout", str(e), seconds=time.monotonic() - t0)
            except Interrupted:
                raise
            except Exception as e:  # a broken row must not stop the others
                c.report(s["rows"][0], "FAIL", f"{type(e).__name__}: {short(e, 300)}", seconds=time.monotonic() - t0)
            finally:
                c.row_deadline = c.row_cap = None
            if len(c.results.rows) == before:
                c.report(s["rows"][0], "FAIL", "the step reported nothing", seconds=time.monotonic() - t0)
            c.current = None
            c.write_logs()
        c.current = None
        if 1 in calls and 2 not in calls:
            c.call = 1
            nxt = planned_steps((2,))
            c.report("call 2 next", "info", f"tools/ember device-check --call 2 (budget {CALL2_BUDGET} s, ~"
                     f"{plan_seconds(2)} s estimated), at once while the machine is warm, if 4 minutes of the lease "
                     "are left: " + "; ".join(s["name"] for s in nxt))
        if not ready:
            status = 1
    except Interrupted as e:
        status = 143 if str(e) == "SIGTERM" else 130
        running, c.current = c.current, None
        reported = {r["name"] for r in c.results.rows}
        c.report("device check", "interrupted", f"{e} after {time.monotonic() - c.start:.0f} s")
        for s in steps:
            c.current = s
            for r in s["rows"]:
                if r not in reported:
                    c.report(r, "interrupted" if s is running else "not run (interrupted)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        rows = c.results.rows
        counts = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        failed = counts.get("FAIL", 0) + counts.get("timeout", 0) + counts.get(GOAL_NOT_MET, 0)
        worst = next((k for k in ("FAIL", "timeout", GOAL_NOT_MET, NOT_JUDGED) if counts.get(k)), "ok")
        c.current = None
        c.report("summary", "FAIL" if worst == "timeout" else worst,
                 ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), numbers=counts,
                 seconds=time.monotonic() - c.start)
        c.write_logs()
        print("\n== Ember device check ==", flush=True)
        print(c.results.txt.read_text(), end="", flush=True)
        if status == 0 and failed:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
