"""GoogleTest cases by filter (the GPU cases, wave 3's, under compute-sanitizer) and the rows that run
a Python or recipe check beside them: ops, telemetry, the profiler, out of memory, plan vs run,
bs-find, NCCL, sharding and SyncBatchNorm on several GPUs, the parity tests.
"""
import glob
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from embertools.ranks import free_port, rank_env
from .common import Check, MAX_LOG_BYTES, ROOT, SANITIZED, StepTimeout, exit_text, first_failure, short
from .goals import accuracy_detail, accuracy_over, goal, goal_numbers, goal_status, recipe_row, step


# ---- GoogleTest cases by filter ------------------------------------------------------

def gtest_match(name, filt):
    """Whether gtest's --gtest_filter=filt selects the case `name`: 'POSITIVE[-NEGATIVE]', each a
    ':'-separated list of patterns where '*' matches any string and '?' one character."""
    def any_of(patterns):
        return any(re.fullmatch(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."), name)
                   for p in patterns.split(":") if p)
    positive, _, negative = filt.partition("-")
    return any_of(positive or "*") and not any_of(negative)


_GTEST_LINE = re.compile(r"^\[ +(RUN|OK|FAILED|SKIPPED) +\] ([^\s,]+)(.*)$")


def parse_gtest_log(out):
    """The cases a gtest process ran, from its output: [(name, status, seconds, detail)] in order, status
    'ok', 'FAIL' or 'skip', or None for a case it started and never finished (it died or was stopped
    in it); detail: a failure's first lines, a skip's message."""
    cases, current, body = [], None, []
    for line in out.splitlines():
        m = _GTEST_LINE.match(line)
        if m and m[1] == "RUN":
            if current:  # cannot happen in one process's log; kept as unfinished if it does
                cases.append((current, None, 0.0, ""))
            current, body = m[2], []
        elif m and current and m[2] == current:
            ms = re.search(r"\((\d+) ms\)\s*$", m[3])
            status = {"OK": "ok", "FAILED": "FAIL", "SKIPPED": "skip"}[m[1]]
            text = "\n".join(body)
            if status == "FAIL":
                detail = first_failure(text)
            elif status == "skip":
                said = re.search(r"Skipped\s*\n(.*)", text)
                detail = short(said.group(1) if said and said.group(1).strip() else "skipped", 120)
            else:
                detail = ""
            cases.append((current, status, int(ms.group(1)) / 1e3 if ms else 0.0, detail))
            current, body = None, []
        elif current:
            body.append(line)
    if current:
        cases.append((current, None, 0.0, ""))
    return cases


def run_gtest(c: Check, binary, names, filt, log):
    """Runs the cases `names` (those `filt` selects) of the gtest binary in one process. When the process
    dies (a CUDA fault, an abort), the case it died in is FAIL and the cases not yet run go on in ONE
    new process, by a filter naming them; again after each death, so there are at most 1 + deaths
    processes. Returns (cases, deaths, processes, stopped): cases {name: (status, detail, seconds)} for
    every name; deaths [(case or None, how)]; processes: how many it started; stopped: None, or why the
    row's cap or the budget stopped the process (then the case it was in is `timeout` and the ones after
    it `not run`)."""
    results, deaths, processes = {}, [], 0
    remaining, current = list(names), filt
    while remaining:
        part = log if not deaths else log.replace(".log", f".resumed{len(deaths)}.log")
        processes += 1
        try:
            rc, out = c.run([binary, f"--gtest_filter={current}"], part)
        except StepTimeout as e:
            out = (c.logs / part).read_text(errors="replace") if (c.logs / part).exists() else ""
            for name, status, secs, detail in parse_gtest_log(out):
                results[name] = (status, detail, secs) if status else ("timeout", f"running when {e}", secs)
            for n in names:
                results.setdefault(n, ("not run", f"the process was stopped before it: {e}", 0.0))
            return results, deaths, processes, str(e)
        crashed, progress = None, 0
        for name, status, secs, detail in parse_gtest_log(out):
            if status is None:
                crashed = name
            else:
                results[name] = (status, detail, secs)
                progress += 1
        if crashed is None and rc in (0, 1):  # gtest's own exits: all passed, some failed
            for n in remaining:
                results.setdefault(n, ("FAIL", f"the binary did not run it ({exit_text(rc)})", 0.0))
            break
        last = next((l for l in reversed(out.splitlines()) if l.strip() and not l.startswith("$ ")), "")
        how = exit_text(rc)
        deaths.append((crashed, how))
        if crashed:
            results[crashed] = ("FAIL", f"the test process died in it ({how}): {short(last, 160)}", 0.0)
        remaining = [n for n in names if n not in results]
        if crashed is None and not progress:  # died before its first case: another process would too
            for n in remaining:
                results[n] = ("FAIL", f"the test process died before running it ({how}): {short(last, 160)}", 0.0)
            break
        current = ":".join(remaining)
    return results, deaths, processes, None


# The GPU test cases of issue 28's CUDA findings: what each checks, shown in its row's detail.
FINDINGS = {
    "GraphStepCuda.LateParameterMatchesEagerBitwise":
        "issue 28.1: optimizer state of a parameter whose first gradient comes at the captured step",
    "GraphStepCuda.GradientsStayTheGraphsAcrossEpochs": "issue 28.6: .grad is the graph's in epoch 2",
    "GraphStepCuda.OpsOutsideTheGraphPerStep": "issue 28.4: ATen ops launched outside the graph per replay, bounded",
    "GraphStepCuda.MemoryProbeCoversAGraphRun": "issue 28.3: the memory probe measures what a graph run holds",
    "FusedOptimCuda.DefaultOptionsDoNotSyncPerStep": "issue 28.4/11: host syncs per step with default options",
    "FusedOptimCuda.SyncFreeRatesWithinFp32RoundingOfHostRates":
        "issue 28.8: device-side learning rates against the host's",
    "LrFinderCuda.RunsOnACudaGraphConfig": "issue 28.2: lr-find on a trainer.cuda_graph=true config",
    "MonitorCuda.NvmlSamplesThisDevice": "issue 28.7: NVML matched to this CUDA device (MIG too)",
}

# The GPU test cases as rows: wave 3's suites each a row of their own (they may land after this
# script: a pattern that matches nothing reads `skip`), then every other *Cuda suite.
WAVE3_SHARDING_ROW = "wave 3: ZeRO stages and SyncBatchNorm over a 2-rank replica group (cuda)"
WAVE3_SHARDING_FILTER = "ShardingCuda.*:SyncBatchNormCuda.*"
WAVE3_AC_ROW = "wave 3: activation checkpointing on CUDA, with CUDA graphs (cuda)"
WAVE3_AC_FILTER = "ActivationCheckpointCuda.*"
GPU_CASES_FILTER = "*Cuda.*-" + ":".join([WAVE3_SHARDING_FILTER, WAVE3_AC_FILTER])
GPU_CASES_ROW = "GPU test cases: *Cuda.* but the wave-3 suites (cuda)"


def gtest_rows(c: Check, row, filt, log):
    """The cases of ember_tests that `filt` selects, run by run_gtest(): one row per test (a parameterised
    test is one row over its cases, naming the failed ones), then the row `row` over them all."""
    t0 = time.monotonic()
    names = [n for n in c.gtest_names() if gtest_match(n, filt)]
    if not names:
        c.report(row, "skip", f"no case matched --gtest_filter={filt} in ember_tests (the cases have not landed "
                 "in this build)", seconds=time.monotonic() - t0)
        return
    cases, deaths, processes, stopped = run_gtest(c, c.exe("ember_tests"), names, filt, log)
    tests = {}
    for n in names:
        suite, test = n.split(".", 1)
        tests.setdefault(f"{suite}.{test.split('/')[0]}", []).append(n)
    for test, members in sorted(tests.items(), key=lambda kv: kv[0] not in FINDINGS):  # issue 28's first
        results = [cases[n] for n in members]
        secs = sum(r[2] for r in results)
        if len(members) == 1:
            status, detail, _ = results[0]
        else:
            failed = [n.split("/", 2)[-1] + (f": {r[1]}" if r[1] else "")
                      for n, r in zip(members, results) if r[0] in ("FAIL", "timeout")]
            n_ok = sum(1 for r in results if r[0] == "ok")
            worst = next((s for s in ("timeout", "FAIL", "not run") if any(r[0] == s for r in results)), None)
            status = worst or ("ok" if n_ok else "skip")
            detail = (f"{len(members)} cases, {n_ok} ok, {len(failed)} failed"
                      + (f": {short('; '.join(failed), 300)}" if failed else "")
                      + ("" if failed or n_ok else f"; {results[0][1]}"))
        if test in FINDINGS:
            detail = f"{FINDINGS[test]}" + (f": {detail}" if detail else "")
        c.report(f"gpu test {test}", status, detail, seconds=secs, gpu=True)
    counts = {s: sum(1 for r in cases.values() if r[0] == s) for s in ("ok", "FAIL", "skip", "timeout", "not run")}
    notes = []
    for case, how in deaths:
        notes.append(f"the process died in {case} ({how})" if case else f"the process died outside a case ({how})")
    if processes > 1:
        notes.append(f"{processes} processes in all: the cases after each death ran in one new process")
    if stopped:
        notes.append(stopped)
    absent = [f for f in FINDINGS if gtest_match(f, filt) and f not in tests]
    if absent:
        notes.append(f"issue 28 cases not in this binary: {', '.join(absent)}")
    died_outside = any(case is None for case, _ in deaths)
    status = ("timeout" if stopped else "FAIL" if counts["FAIL"] or died_outside else
              "ok" if counts["ok"] else "skip")
    c.report(row, status, f"{len(names)} cases: {counts['ok']} ok, {counts['FAIL']} failed, {counts['skip']} skipped"
             + (f", {counts['timeout']} stopped, {counts['not run']} not run" if stopped else "")
             + "".join(f"; {n}" for n in notes), numbers=counts, seconds=time.monotonic() - t0)


@step(WAVE3_SHARDING_ROW, gpu=False)
def wave3_sharding_cases(c: Check):
    """The lead's ShardingCuda.* (each ZeRO stage over dist::ProcessGroup::create_replicas(0, 2) on CUDA:
    every collective of a 2-rank group, with no second process) and SyncBatchNormCuda.* (SyncBatchNorm's
    CUDA code over such a group: at one real rank it would be plain batch norm)."""
    gtest_rows(c, WAVE3_SHARDING_ROW, WAVE3_SHARDING_FILTER, "gtest_wave3_sharding.log")


@step(WAVE3_AC_ROW, gpu=False)
def wave3_checkpoint_cases(c: Check):
    """ActivationCheckpointCuda.*: the recompute's CUDA random numbers, CharGpt under autocast, and
    checkpointing refused or handled under CUDA graphs."""
    gtest_rows(c, WAVE3_AC_ROW, WAVE3_AC_FILTER, "gtest_wave3_checkpoint.log")


@step(GPU_CASES_ROW, gpu=False)
def gpu_tests(c: Check):
    gtest_rows(c, GPU_CASES_ROW, GPU_CASES_FILTER, "gtest_cuda.log")


# What compute-sanitizer prints when this machine does not let it instrument the GPU, not when it found
# something: seen on a gVisor-hosted H200 here («Device not supported», then error 999 at the first
# allocation: .library/device/KINDS.md, 2026-11-04) and, in public logs, under WSL and with a broken
# install. The program may run on uninstrumented (and fail there, as after error 999): not a finding.
SANITIZER_ENVIRONMENT = (
    "Device not supported",  # "Error: Device not supported. Please refer to the "Supported Devices" section ..."
    "Target application terminated before first instrumented API call",  # nothing was instrumented
    "Unable to find injection library",  # "... libsanitizer-collection.so": the tool's own files are missing
    "debugger interface",  # "Error: Failed to initialize WDDM debugger interface." (WSL)
)
# A finding in the kernels (memcheck, racecheck, initcheck, synccheck reports): never an environment skip.
SANITIZER_FINDING = re.compile(r"Invalid __\w+__|Race reported|Uninitialized __global__|Barrier error|"
                               r"Misaligned|Malloc/Free error")


def sanitizer_verdict(rc, out):
    """(status, detail, errors) of a compute-sanitizer run of the sanitized gtest cases: `ok` when it
    exits 0 with 0 errors/hazards and the tests passed; `skip (environment)` when it says it could not
    instrument this GPU (SANITIZER_ENVIRONMENT) and reports no finding in a kernel; else FAIL with the
    first finding. errors: the summary's count, None without one."""
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", out) or re.findall(r"RACECHECK SUMMARY: (\d+) hazard", out)
    passed = re.search(r"\[  PASSED  \] (\d+) test", out)
    errors = int(summary[-1]) if summary else None
    lines = [l.strip("= ").strip() for l in out.splitlines()]
    finding = next((l for l in lines if SANITIZER_FINDING.search(l)), None)
    refused = next((l for l in lines if any(m in l for m in SANITIZER_ENVIRONMENT)), None)
    if refused and not finding:
        return ("skip (environment)",
                f"compute-sanitizer cannot instrument this machine's GPU: \"{short(refused, 160)}\" ({exit_text(rc)}; "
                "gVisor-hosted GPUs refuse it, Firecracker ones run it): not a finding", errors)
    if rc == 0 and errors == 0 and passed:
        return "ok", f"{passed.group(1)} tests, 0 errors", errors
    # The first report line: "Invalid __global__ write of size 4 bytes", "Error: Race reported between ...".
    first = finding or next((l for l in lines if re.search(r"Program hit|Error|error", l) and "SUMMARY" not in l
                             and l.startswith(("Program", "Error", "Warning"))), None)
    return ("FAIL", f"{errors if errors is not None else '?'} errors/hazards, {exit_text(rc)}: "
            f"{short(first or first_failure(out))}", errors)


def sanitizer(c: Check, tool):
    name = f"compute-sanitizer {tool} (augment, count_correct)"
    cs = shutil.which("compute-sanitizer") or next(
        iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer") +
                    glob.glob("/usr/local/cuda*/compute-sanitizer/compute-sanitizer") +
                    glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"))), None)
    if not cs:
        c.report(name, "skip", "compute-sanitizer not found")
        return
    t0 = time.monotonic()
    rc, out = c.run([cs, f"--tool={tool}", "--error-exitcode=3", "--print-limit=50", c.exe("ember_tests"),
                     f"--gtest_filter={SANITIZED}", "--gtest_brief=1"], f"sanitizer_{tool}.log")
    status, detail, errors = sanitizer_verdict(rc, out)
    c.report(name, status, detail, numbers={"errors": errors}, seconds=time.monotonic() - t0)


@step("compute-sanitizer memcheck (augment, count_correct)")
def memcheck(c: Check):
    sanitizer(c, "memcheck")


@step("compute-sanitizer racecheck (augment, count_correct)")
def racecheck(c: Check):
    sanitizer(c, "racecheck")


@step("augment operators from Python (CUDA)")
def python_ops(c: Check):
    t0 = time.monotonic()
    lib = next(f for f in (c.bins / "lib" / "libember.so", c.bins / "lib" / "libember.so.0") if f.exists())
    rc, out = c.run([c.python, ROOT / "tests" / "augment" / "ops_test.py", lib],
                    "python_augment_ops.log")
    cuda = re.search(r"test_cuda_dispatch_equals_cpu .*\.\.\. (\w+)", out)
    ran = re.search(r"Ran (\d+) test", out)
    ok = rc == 0 and cuda and cuda.group(1) == "ok"
    c.report("augment operators from Python (CUDA)", "ok" if ok else "FAIL",
             f"{ran.group(1)} tests through torch.ops.ember, CUDA dispatch equals CPU" if ok else
             f"exit {rc}; CUDA case: {cuda.group(1) if cuda else 'not run'}: {first_failure(out)}",
             seconds=time.monotonic() - t0)


PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")


def fashion_short(c: Check, precision):
    """~70 steps on 9000 images and a test pass: ~6 s with the start-up."""
    run = c.runs_dir(f"fashion-{precision}")
    v = recipe_row(c, f"fashion_mnist {precision}, 1 epoch (cuda)", "fashion_mnist",
                   [f"data.root={c.data}", "trainer.device=cuda", f"trainer.precision={precision}", "trainer.epochs=1",
                    "data.train_subset=10000", "data.test_subset=2000", "data.val_size=1000", "trainer.log_every=10",
                    f"run.dir={run}"], f"fashion_{precision}.log",
                   want=accuracy_over(0.7, "after one epoch on 9000 images"), detail=accuracy_detail)
    if precision == "bf16-mixed" and v is not None:
        telemetry(c, run / "metrics.jsonl")


def telemetry(c: Check, metrics):
    """The monitoring's GPU fields in the last step record of a cuda run."""
    steps = [json.loads(l) for l in metrics.read_text().splitlines() if '"kind":"step"' in l.replace(" ", "")]
    if not steps:
        c.report("telemetry (fashion bf16, cuda)", "FAIL", f"no step records in {metrics.name}")
        return
    r = steps[-1]
    want = ["step_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "gpu_mem_allocated_mib",
            "gpu_mem_peak_mib", "gpu_util", "gpu_power_w", "gpu_temp_c", "gpu_sm_clock_mhz", "mfu"]
    missing = [k for k in want if r.get(k) is None]
    # NVML reports no utilization on a MIG instance (the Monitor says so at fit start): not a failure there.
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout \
        if shutil.which("nvidia-smi") else ""
    mig = "MIG-" in listing
    if mig and "gpu_util" in missing:
        missing.remove("gpu_util")
    f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
    detail = (f"step {f('step_ms', '%.2f')} ms (data {f('data_ms', '%.2f')} fwd {f('forward_ms', '%.2f')} bwd "
              f"{f('backward_ms', '%.2f')} opt {f('optimizer_ms', '%.2f')}), "
              f"mem {f('gpu_mem_allocated_mib', '%.0f')} MiB "
              f"peak {f('gpu_mem_peak_mib', '%.0f')}, util {f('gpu_util', '%.0f')}%, {f('gpu_power_w', '%.0f')} W, "
              f"{f('gpu_temp_c', '%.0f')} C, sm {f('gpu_sm_clock_mhz', '%.0f')} MHz, mfu {f('mfu', '%.4f')}")
    c.report("telemetry (fashion bf16, cuda)", "FAIL" if missing else "ok",
             detail + (f"; null: {', '.join(missing)}" if missing else "")
             + ("; a MIG instance: NVML gives no utilization" if mig else ""), numbers={k: r.get(k) for k in want})


for _p in PRECISIONS:
    step(f"fashion_mnist {_p}, 1 epoch (cuda)",
         rows=[f"fashion_mnist {_p}, 1 epoch (cuda)"]
         + (["telemetry (fashion bf16, cuda)"] if _p == "bf16-mixed" else []))(
        lambda c, p=_p: fashion_short(c, p))


@step("profiler trace, 3 steps (cuda)")
def profiler(c: Check):
    run = c.runs_dir("profile")
    trace = run / "trace.json"

    def counts(_):
        events = json.loads(trace.read_text()).get("traceEvents", []) if trace.exists() else []
        return (sum(1 for e in events if e.get("cat") == "kernel"),
                sum(1 for e in events if e.get("name") == "ember::forward"))

    def want(v):
        kernels, ranges = counts(v)
        return kernels > 0 and ranges >= 3, "want CUDA kernel events and 3 ember::forward ranges"

    recipe_row(c, "profiler trace, 3 steps (cuda)", "fashion_mnist",
               [f"data.root={c.data}", "trainer.device=cuda", "trainer.epochs=1", "data.train_subset=2000",
                "data.test_subset=500", "data.val_size=200", "trainer.profile_steps=3", f"run.dir={run}"],
               "profile.log", want=want,
               detail=lambda v: "{} CUDA kernel events, {} ember::forward ranges in trace.json".format(*counts(v)))
    if trace.exists() and trace.stat().st_size < MAX_LOG_BYTES:
        shutil.copy(trace, c.logs / "profile_trace.json")


@step("GPU out of memory: caught, explained, run folder intact (cuda)")
def out_of_memory(c: Check):
    name = "GPU out of memory: caught, explained, run folder intact (cuda)"
    if not c.data:
        c.report(name, "skip", "no Fashion-MNIST (tools/ember device-pack packs a subset)")
        return
    t0 = time.monotonic()
    run = c.runs_dir("oom")
    # One batch of every training image through 4096/8192-channel convolutions:
    # hundreds of GiB of activations, far beyond an H200.
    rc, _, out = c.recipe("fashion_mnist", "oom.log",
                          [f"data.root={c.data}", "trainer.device=cuda", "trainer.epochs=1", "model.width=4096",
                           "data.batch_size=1000000", "data.val_size=0", f"run.dir={run}"])
    lines = [l for l in out.splitlines() if l.startswith("error:")]
    said = lines[-1] if lines else ""
    ok = (rc == 1 and "out of memory:" in said and "data.batch_size" in said and "GiB" in said
          and "Exception raised from" not in out and (run / "config.toml").exists()
          and not (run / "summary.json").exists() and not (run / "run.lock").exists())
    c.report(name, "ok" if ok else "FAIL",
             f"exit {rc}: {said[:300]}" if ok
             else f"exit {rc}, want 1 and an explained error: {said[:300] or first_failure(out)}",
             seconds=time.monotonic() - t0)


PLAN_ROW = "plan vs run: memory and step time, fashion_mnist bf16 (cuda)"


@step(PLAN_ROW)
def plan_vs_run(c: Check):
    """`tools/ember plan` as a user would run it before renting: a measurement on
    this machine's CPU, planned for this GPU; then the GPU itself measured at the
    same batch. Goals: memory within 15%, step time within 30% (MFU calibrated
    from the bf16 1-epoch run above, when it exists)."""
    if not c.data:
        c.report(PLAN_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs a subset)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("plan")
    common = [f"data.root={c.data}", "data.train_subset=10000", "data.test_subset=2000",
              "trainer.precision=bf16-mixed", "plan.precisions=bf16-mixed", "plan.timed_steps=30"]
    rc_cpu, _, out_cpu = c.recipe("fashion_mnist", "plan_cpu.log",
                                  ["--measure", work / "cpu.json", "trainer.device=cpu", *common])
    rc_gpu, _, out_gpu = c.recipe("fashion_mnist", "plan_cuda.log",
                                  ["--measure", work / "cuda.json", "trainer.device=cuda", "plan.verify=true", *common])
    if rc_cpu != 0 or rc_gpu != 0:
        c.report(PLAN_ROW, "FAIL", f"--measure exit {rc_cpu} (cpu), {rc_gpu} (cuda): "
                 f"{first_failure(out_cpu if rc_cpu else out_gpu)}", seconds=time.monotonic() - t0)
        return
    # Calibration: the 1-epoch bf16 run's summary, in a folder named as plan.py looks for.
    calib = work / "runs"
    bf16_run = c.work / "runs" / "fashion-bf16-mixed"
    if (bf16_run / "summary.json").exists():
        (calib / "fashion_mnist-bf16").mkdir(parents=True, exist_ok=True)
        shutil.copy(bf16_run / "summary.json", calib / "fashion_mnist-bf16" / "summary.json")
    rc, out = c.run([c.python, ROOT / "tools" / "plan" / "plan.py", work / "cpu.json", "--json", "--runs-dir", calib],
                    "plan_json.log")
    try:
        plan = json.loads(out[out.index("{"):])
        gpu_name = str(c.info.get("gpu_name", ""))
        rows = [r for r in plan["rows"] if r["precision"] == "bf16-mixed"
                and r["gpu"].split("-")[0].lower() in gpu_name.lower()]
        row = rows[0]
        cuda = json.loads((work / "cuda.json").read_text())
        held = cuda["parameter_bytes"] + cuda["buffer_bytes"]
        measured_mem = cuda["verify"]["measured_peak_bytes"] + held
        predicted_mem = row["memory_needed_bytes"] - plan["assumptions"]["context_bytes"]
        measured_step = cuda["measured"]["step_seconds"]
        predicted_step = row["step_seconds"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        c.report(PLAN_ROW, "FAIL", f"plan.py: {e!r}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    mem_err = (predicted_mem - measured_mem) / measured_mem
    step_err = (predicted_step - measured_step) / measured_step
    gpu_verify = cuda["verify"]
    gpu_line_err = ((gpu_verify["predicted_peak_bytes"] - gpu_verify["measured_peak_bytes"])
                    / gpu_verify["measured_peak_bytes"])
    goals = [goal("memory planned on the CPU", 100 * abs(mem_err), "<=", 15, "% off", "%", fmt="{:.0f}"),
             goal("step time planned", 100 * abs(step_err), "<=", 30, "% off", "%", fmt="{:.0f}")]
    c.report(PLAN_ROW, goal_status(goals),
             f"{row['gpu']} batch 128: memory planned on the CPU {predicted_mem / 2**20:.0f} MiB vs measured "
             f"{measured_mem / 2**20:.0f} MiB ({100 * mem_err:+.0f}%); step {predicted_step * 1e3:.2f} ms "
             f"planned (MFU {row['mfu']:.3g}, {plan['mfu']['bf16-mixed']['source']}) vs {measured_step * 1e3:.2f} ms "
             f"({100 * step_err:+.0f}%); GPU probes' line vs GPU at 128: {100 * gpu_line_err:+.1f}%; "
             + "; ".join(g["text"] for g in goals),
             numbers={"memory_error": mem_err, "step_error": step_err, "gpu_line_error": gpu_line_err,
                      "goals": goal_numbers(goals)},
             seconds=time.monotonic() - t0)


BS_FIND_ROW = "bs-find: CUDA out of memory recovered, 2 GiB cap (cuda)"


@step(BS_FIND_ROW)
def bs_find(c: Check):
    """The batch-size finder on a GPU capped at 2 GiB (bs_find.gpu_memory_gib):
    real out-of-memory errors on the way up, each caught and the search going on."""
    if not c.data:
        c.report(BS_FIND_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs a subset)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("bs_find")
    rc, _, out = c.recipe("fashion_mnist", "bs_find.log",
                          ["--find-batch-size", work / "bs.json", f"data.root={c.data}", "trainer.device=cuda",
                           "model.width=64", "data.train_subset=20000", "bs_find.gpu_memory_gib=2"])
    try:
        r = json.loads((work / "bs.json").read_text())
        ooms = [t["batch"] for t in r["trials"] if t["peak_bytes"] < 0]
        fit = {t["batch"]: t for t in r["trials"]}[r["largest"]]
        ok = rc == 0 and ooms and fit["fits"] and 0 < r["recommended"] <= r["largest"] < min(ooms)
        detail = (f"largest {r['largest']} (peak {fit['peak_bytes'] / 2**20:.0f} MiB), recommended {r['recommended']}, "
                  f"{len(r['trials'])} sizes, out of memory at {ooms}")
    except (OSError, ValueError, KeyError) as e:
        ok, detail = False, f"exit {rc}: {e!r}: {first_failure(out)}"
    c.report(BS_FIND_ROW, "ok" if ok else "FAIL", detail if ok else f"exit {rc}: {detail}",
             seconds=time.monotonic() - t0)


@step("DDP on NCCL, 1 rank (cuda)")
def nccl(c: Check):
    name = "DDP on NCCL, 1 rank (cuda)"
    t0 = time.monotonic()
    out_base = c.work / "nccl"
    env = rank_env(0, 1, 29517, base=c.env)
    rc, out = c.run([c.exe("ember_ddp_worker"), "--out", out_base, "--device", "cuda", "--backend", "nccl",
                     "--force-group", "1", "--batch", "64"], "nccl.log", env=env)
    res = Path(f"{out_base}.rank0.json")
    got = json.loads(res.read_text()) if res.exists() else {}
    ok = rc == 0 and got.get("backend") == "nccl" and got.get("steps", 0) > 0
    c.report(name, "ok" if ok else "FAIL", json.dumps(got) if ok else f"exit {rc}: {first_failure(out)}",
             numbers=got, seconds=time.monotonic() - t0)


SHARDING_ROW = "wave 3: ZeRO-3 on NCCL, 1 rank: reduce-scatter, all-gather, parameter sharding = DDP (cuda)"
SHARDING_GPUS_ROW = "sharded data parallel on NCCL across 2 GPUs: collectives, each stage = DDP (cuda)"
SYNC_BN_GPUS_ROW = "SyncBatchNorm on NCCL across 2 GPUs: prune_finetune with dist.sync_batchnorm=true (cuda)"


# The weights' comparison, in the python with torch: {stage: {"vs_ddp": worst relative difference of rank 0's
# tensors from DDP's rank 0 (||a - b|| / ||b||), "replicas": the worst of every other rank's from its rank 0}}.
_COMPARE_WEIGHTS = """
import json, sys
from safetensors.torch import load_file
def worst(a, b):
    if a.keys() != b.keys():
        raise SystemExit(f"tensors differ: {sorted(a.keys() ^ b.keys())}")
    return max(((a[k].double() - b[k].double()).norm() / b[k].double().norm().clamp_min(1e-12)).item() for k in b)
files = json.loads(sys.argv[1])
ref = load_file(files["none"][0])
out = {"_bound": 2 * 2.0 ** -52 * sum(t.numel() for t in ref.values()) * 21}
for stage, paths in files.items():
    mine = [load_file(p) for p in paths]
    out[stage] = {"vs_ddp": worst(mine[0], ref), "replicas": max([worst(m, mine[0]) for m in mine[1:]] or [0.0])}
print(json.dumps(out))
"""


def sharding_vs_ddp(c: Check, name, world, stages, device="cuda", backend="nccl"):
    """ember_ddp_worker on `world` ranks (rank r on cuda:r; one rank with --force-group 1: a group of one,
    whose collectives still run): the backend's reduce-scatter (sum, max) and all-gather, then DDP and
    each dist.sharding stage in `stages` on BlockNet (AdamW, clipping, accumulation, 21 steps) in float64:
    each stage must end at DDP's weights within 2 eps64 x P x 21 relative per tensor (P = 3595 parameters:
    3.4e-11; the stages sum the same gradients in another grouping: tests/dist/sharding_test.py's
    float64_bound), every rank at its rank 0's exactly (the same all-gathered bytes)."""
    t0 = time.monotonic()
    force = ["--force-group", "1"] if world == 1 else []

    def launch(tag, args):
        port = free_port()
        return c.run_all([([c.exe("ember_ddp_worker"), "--out", c.work / tag, "--device",
                            f"{device}:{r}" if device == "cuda" else device, "--backend", backend, *force, *args],
                           rank_env(r, world, port, base=c.env)) for r in range(world)], f"{tag}.log")

    failed = [f"collectives, rank {r}: exit {rc}: {first_failure(out)}"
              for r, (rc, out) in enumerate(launch(f"sharding{world}_collectives", ["--check-collectives", "1"]))
              if rc != 0]
    if failed:
        c.report(name, "FAIL", "; ".join(failed), seconds=time.monotonic() - t0)
        return
    common = ["--batch", str(48 // world), "--samples", "240", "--model", "blocks", "--odd", "1", "--optimizer",
              "adamw", "--clip", "0.5", "--accumulate", "2", "--epochs", "7", "--dtype", "float64"]
    files = {}
    for stage in ("none", *stages):
        tag = f"sharding{world}_{stage}"
        for r, (rc, out) in enumerate(launch(tag, [*common, "--sharding", stage])):
            if rc != 0:
                failed.append(f"{stage}, rank {r}: exit {rc}: {first_failure(out)}")
        files[stage] = [str(c.work / f"{tag}.rank{r}.safetensors") for r in range(world)]
    worst = {}
    if not failed:
        rc, out = c.run([c.python, "-c", _COMPARE_WEIGHTS, json.dumps(files)], f"sharding{world}_compare.log")
        try:
            worst = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            failed.append(f"comparison: exit {rc}: {first_failure(out)}")
    limit = worst.pop("_bound", 0.0)
    bad = [f"{k} differs from DDP by {v['vs_ddp']:.1e} relative (float64 bound {limit:.1e})"
           for k, v in worst.items() if v["vs_ddp"] > limit]
    bad += [f"{k}: a rank differs from rank 0 by {v['replicas']:.1e}" for k, v in worst.items() if v["replicas"] != 0]
    ok = not failed and worst and not bad
    detail = (f"{backend}, {world} rank(s): reduce-scatter sum/max and all-gather right; against DDP: " +
              ", ".join(f"{k} {v['vs_ddp']:.1e}" for k, v in worst.items() if k != "none")
              + ("; every rank equal to rank 0" if world > 1 else "")) if ok else "; ".join(failed + bad)
    c.report(name, "ok" if ok else "FAIL", detail, numbers=worst, seconds=time.monotonic() - t0)


@step(SHARDING_ROW)
def sharding_nccl(c: Check):
    """ZeRO-3 (parameter sharding) against DDP on NCCL with one rank: NCCL's reduce-scatter and all-gather
    on CUDA tensors, and every shard is the whole unit. ZeRO-1/2 over a group of two on one GPU:
    WAVE3_SHARDING_ROW's cases; across GPUs: SHARDING_GPUS_ROW."""
    sharding_vs_ddp(c, SHARDING_ROW, 1, ("parameters",))


@step(SHARDING_GPUS_ROW, gpus=2)
def sharding_gpus(c: Check):
    """Two ranks, one GPU each, on NCCL: every stage's shards really split, the collectives cross GPUs."""
    sharding_vs_ddp(c, SHARDING_GPUS_ROW, 2, ("optimizer", "gradients", "parameters"))


def sync_batchnorm_ranks(c: Check, name, world, device="cuda"):
    """prune_finetune (ResNet-14, batch norms) on `world` ranks through tools/launch.py with
    dist.sync_batchnorm=true: each rank's batch norms all-reduce their statistics over the group (NCCL
    on GPUs). ok when every rank ends and rank 0 says it trained on `world` ranks of that backend; the
    equality with one process at twice the batch is checked on the CPU (integration.prune_finetune_ddp)."""
    if not c.data:
        c.report(name, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    t0 = time.monotonic()
    backend = "nccl" if device == "cuda" else "gloo"
    rc, out = c.run([c.python, ROOT / "tools" / "launch.py", "--nproc", str(world), c.exe("prune_finetune"),
                     f"data.root={c.data}", "data.train_subset=2000", "data.test_subset=500", "data.batch_size=50",
                     "trainer.epochs=1", "finetune.epochs=1", "prune.timing_steps=2", f"trainer.device={device}",
                     "dist.sync_batchnorm=true", "trainer.progress=false", f"run.dir={c.runs_dir('sync_bn')}"],
                    "sync_batchnorm.log")
    said = f"x {world} ranks ({backend})"
    result = next((l for l in out.splitlines() if l.startswith("prune_finetune: dense test accuracy")), None)
    ok = rc == 0 and said in out and result and "has no batch norm" not in out
    c.report(name, "ok" if ok else "FAIL",
             f"{world} ranks on {backend}, batch norms synchronised: {short(result, 200)}" if ok else
             f"exit {rc}" + ("" if said in out else f", no '{said}' line") + f": {first_failure(out)}",
             seconds=time.monotonic() - t0)


@step(SYNC_BN_GPUS_ROW, gpus=2)
def sync_batchnorm_gpus(c: Check):
    sync_batchnorm_ranks(c, SYNC_BN_GPUS_ROW, 2)


@step("GradScaler parity with torch.amp.GradScaler (cuda)")
def grad_scaler_parity(c: Check):
    name = "GradScaler parity with torch.amp.GradScaler (cuda)"
    t0 = time.monotonic()
    rc, out = c.run([c.python, ROOT / "tests" / "parity" / "grad_scaler_parity.py", c.exe("ember_parity_grad_scaler"),
                     c.work / "grad_scaler_parity", "--device", "cuda"], "grad_scaler_parity.log")
    scenarios = re.findall(r"^(OK|FAIL) (\w+):", out, re.M)
    ok = rc == 0 and scenarios and all(s == "OK" for s, _ in scenarios)
    c.report(name, "ok" if ok else "FAIL",
             f"{len(scenarios)} scenarios: the same scale trajectory, skips and weights on the GPU" if ok else
             f"exit {rc}; {', '.join(f'{n} {s}' for s, n in scenarios) or 'no scenario ran'}: {first_failure(out)}",
             seconds=time.monotonic() - t0)


@step("fused optimizers: GradScaler parity with torch fused=True, no host sync (cuda)")
def fused_parity(c: Check):
    name = "fused optimizers: GradScaler parity with torch fused=True, no host sync (cuda)"
    t0 = time.monotonic()
    rc, out = c.run([c.python, ROOT / "tests" / "parity" / "grad_scaler_parity.py", c.exe("ember_parity_grad_scaler"),
                     c.work / "grad_scaler_parity", "--device", "cuda", "--fused"], "fused_parity.log")
    scenarios = re.findall(r"^(OK|FAIL) (\w+):", out, re.M)
    ok = rc == 0 and scenarios and all(s == "OK" for s, _ in scenarios)
    c.report(name, "ok" if ok else "FAIL",
             f"{len(scenarios)} scenarios: FusedSGD/FusedAdam stepped by GradScaler::step_async bitwise equal to "
             "torch.optim.SGD/Adam(fused=True), skips decided on the device" if ok else
             f"exit {rc}; {', '.join(f'{n} {s}' for s, n in scenarios) or 'no scenario ran'}: {first_failure(out)}",
             seconds=time.monotonic() - t0)
