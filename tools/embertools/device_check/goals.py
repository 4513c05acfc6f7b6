"""The rows' registry (@step: name, GPU or not, GPUs needed, rows) and the goals a row's numbers are
judged against; the recipe rows and the doctor row.
"""
import json
import re
import time

from .common import Check, ROOT, exit_text, first_failure, short


# ---- the rows -----------------------------------------------------------------
# Each step reports one or more rows; PLAN (after the rows) gives each its call,
# its estimate and the basis of it. `gpu` steps are skipped without a GPU;
# `gpus` > 1 steps are skipped on a machine with fewer GPUs ("needs N GPUs").

STEPS = {}  # name -> {"name", "fn", "gpu", "gpus", "rows"}


def step(name, gpu=True, rows=None, gpus=1):
    def register(fn):
        if name in STEPS:
            raise ValueError(f"two steps named {name!r}")
        STEPS[name] = {"name": name, "fn": fn, "gpu": gpu or gpus > 1, "gpus": gpus, "rows": rows or [name]}
        return fn
    return register


# ---- goals ----------------------------------------------------------------------
# A stated goal is judged where its row reads the number: goal() gives the
# verdict and its text, goal_status() the row's status. Pure functions of the
# numbers, so device_check_test.py checks them on fabricated ones.

GOAL_NOT_MET, NOT_JUDGED = "goal not met", "not judged"
_COMPARE = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
            "<": lambda a, b: a < b}


def goal(what, value, op, target, unit="", target_unit="", fmt="{:.2f}", missing="no number"):
    """One goal judged: {"what", "value", "goal", "met", "text"}; met is True, False, or None when
    `value` is None or NaN (then `missing` says why). The text reads
    'CNN b128: graphs 1.73x Python eager (goal >= 2: not met)'."""
    want = f"{op} {target:g}{target_unit}"
    if value is None or value != value:
        return {"what": what, "value": None, "goal": want, "met": None,
                "text": f"{what} ?{unit} (goal {want}: not judged, {missing})"}
    met = bool(_COMPARE[op](value, target))
    return {"what": what, "value": value, "goal": want, "met": met,
            "text": f"{what} {fmt.format(value)}{unit} (goal {want}: {'met' if met else 'not met'})"}


def goal_status(goals):
    """'ok' when every goal is met, 'goal not met' when one is not, else 'not judged' (also for none)."""
    if any(g["met"] is False for g in goals):
        return GOAL_NOT_MET
    if goals and all(g["met"] is True for g in goals):
        return "ok"
    return NOT_JUDGED


def goal_numbers(goals):
    """The goals as the row's JSON numbers keep them."""
    return [{k: g[k] for k in ("what", "value", "goal", "met")} for g in goals]


def speed_goals(n):
    """The GPU speed goal (tools/README.md), from speed_numbers(): the CNN at batch 128 with CUDA graphs
    >= 2x Python eager and >= 1x torch.compile (reduce-overhead). Python eager is taken at its best
    settings, like for like: the faster of its default optimizer and fused=True (Ember's is fused)."""
    cnn = dict(n.get("cnn b128", {}))
    errors = cnn.get("errors", {})
    eager = [cnn.get(s) for s in ("python", "python-fused") if cnn.get(s)]
    cnn["python"] = min(eager) if eager else None

    def ratio(peer):
        a, b = cnn.get(peer), cnn.get("ember-graph")
        return a / b if a and b else None

    def why(peer):
        gone = [s for s in (peer, "ember-graph") if not cnn.get(s)]
        return "; ".join(f"no {s} side: {short(errors.get(s, 'not run'), 120)}" for s in gone)

    return [goal("CNN b128: graphs", ratio("python"), ">=", 2, "x Python eager (its best of fused or not)",
                 missing=why("python")),
            goal("CNN b128: graphs", ratio("compile"), ">=", 1, "x torch.compile reduce-overhead",
                 missing=why("compile"))]


def augment_goals(n):
    """The augmentation bench's goals per pipeline (tools/bench/augment.cpp): the kernel at >= 0.7 of
    the device-to-device copy bandwidth, the host < 50 us per augment() call."""
    goals = []
    for r in n.get("rows", []):
        where = f"{r['pipeline']} {r['output']}"
        goals.append(goal(f"{where}: kernel", r["achieved_gbs"] / n["copy_gbs"], ">=", 0.7, " of copy bandwidth"
                          + (" (launch-bound: idle gaps included)" if r.get("launch_bound") else "")))
        goals.append(goal(f"{where}: host", r["host_us"], "<", 50, " us per augment()", " us", fmt="{:.1f}"))
    return goals or [goal("augment bench", None, ">=", 0.7, missing="no pipeline rows in its JSON")]


def monitor_goals(n):
    """The monitoring bench's goal (tools/bench/monitor.cpp): under 2% throughput cost as recipes run
    it (the `default` setting), from monitor_numbers()."""
    cost = n.get("default", {}).get("overhead")
    value = float(cost.rstrip("%")) if cost else None
    return [goal("default monitoring: throughput cost", value, "<", 2, "%", "%",
                 missing="no 'default' row in its table")]


def amp_goals(n):
    """The mixed-precision bench's aim (tools/bench/amp_step.py): loss scaling costs Ember's fp16-mixed
    step under 1.03x the step without it."""
    on, off = n.get("fp16-mixed", {}).get("ember_ms"), n.get("fp16-mixed no-scaler", {}).get("ember_ms")
    return [goal("GPT fp16-mixed: GradScaler", on / off if on and off else None, "<", 1.03,
                 "x the step without it", fmt="{:.3f}", missing="no fp16-mixed row with and without the scaler")]


def decode_goals(cpu, gpu):
    """The decode row's goal (ember_bench_data, long_rows.py), from the images/s of its two sides: nvJPEG
    (data.stream.nvjpeg) decodes into the same 224 batches on the GPU at >= 1x the CPU decoder threads,
    one per core. Why 1x: 16 cores are about one GPU's share of a DGX H100 (112 cores for 8 GPUs), and
    nvJPEG is worth turning on only when it feeds a GPU at least as fast as that share of cores does
    (its entropy decoding still runs on those threads: docs/data.md)."""
    return [goal("nvJPEG", gpu / cpu if cpu and gpu else None, ">=", 1, "x the CPU threads' images/s",
                 missing="a side gave no images/s")]


LOADER_DATA_WAIT = 0.2  # the monitor's own warning: monitor.data_wait_warning's default (monitor.h)
LOADER_ACCURACY = 0.5  # 4x chance on the JPEG set's 8 colour classes (jpeg_set.py)


def loader_goals(runs):
    """The loader row's goals (image_folder from the JPEG shards, long_rows.py), from runs = {label:
    {"data_share", "test_accuracy", ...}} (a run that failed is absent): the better run waits for data
    under LOADER_DATA_WAIT of its step time (the monitor's data_share; over it the monitor itself warns
    that the input pipeline is the bottleneck), and every run ends at test accuracy >= LOADER_ACCURACY
    (a loader that mixed up images and labels scores ~1/8)."""
    shares = {k: r.get("data_share") for k, r in runs.items() if r.get("data_share") is not None}
    best = min(shares, key=shares.get) if shares else None
    goals = [goal(f"data wait, the better run ({best or 'none'})", 100 * shares[best] if best else None, "<",
                  100 * LOADER_DATA_WAIT, "% of the step time", "%", fmt="{:.0f}",
                  missing="no run gave the monitor's data_share")]
    for k, r in runs.items():
        goals.append(goal(f"{k}: test accuracy", r.get("test_accuracy"), ">=", LOADER_ACCURACY, fmt="{:.3f}",
                          missing="no test_accuracy in its summary.json"))
    return goals


SPEEDRUN_IMAGES = 60000  # the speed run's goal is for the whole training set


def speedrun_goals(accs, secs, train_images):
    """speedrun_gpu.toml's goal over its seeds: every seed at >= 94% test accuracy in < 5 s of
    training; not judged on fewer than the 60000 training images."""
    if train_images < SPEEDRUN_IMAGES:
        why = f"{train_images} training images, not {SPEEDRUN_IMAGES} (an old pack)"
        accs, secs = [], []
    else:
        why = "no seed finished"
    return [goal("worst seed test accuracy", min(accs) if accs else None, ">=", 0.94, fmt="{:.4f}", missing=why),
            goal("worst seed training", max(secs) if secs else None, "<", 5, " s", " s", missing=why)]


def recipe_row(c: Check, name, recipe, args, log, want=None, detail=None, needs="fashion"):
    """Runs a recipe as one row: ok when it exits 0 and want(values) holds (values: the numbers of
    its result line); detail(values) says what it got. `needs`: the packed data it reads ("fashion",
    "text" or None); skipped without it. Returns the values, or None when it failed."""
    missing = {"fashion": None if c.data else "no Fashion-MNIST (tools/ember device-pack packs a subset)",
               "text": None if c.text else "no text corpus (tools/ember device-pack packs the fortunes)"}.get(needs)
    if missing:
        c.report(name, "skip", missing)
        return None
    t0 = time.monotonic()
    rc, v, out = c.recipe(recipe, log, args)
    if rc != 0:
        c.report(name, "FAIL", f"exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return None
    good, why = want(v) if want else (True, "")
    text = detail(v) if detail else ""
    c.report(name, "ok" if good else "FAIL", text + ("" if good else f" ({why})"), numbers=v,
             seconds=time.monotonic() - t0)
    return v if good else None


def accuracy_over(threshold, what):
    return lambda v: (v.get("test_accuracy", 0) > threshold, f"want test_accuracy > {threshold} {what}")


def accuracy_detail(v):
    return (f"test_accuracy {v.get('test_accuracy', 0):.4f}, {v.get('samples_per_second', 0):.0f} samples/s, "
            f"{v.get('train_seconds', 0):.0f} s training")


@step("binaries load (every library found)", gpu=False)
def load_check(c: Check):
    t0 = time.monotonic()
    bad = c.unloadable()
    n = sum(1 for e in c.executables() if e.exists())
    c.report("binaries load (every library found)", "FAIL" if bad else "ok", bad or f"{n} executables, "
             f"LD_LIBRARY_PATH = binaries, torch/lib and the wheel's nvidia libraries", seconds=time.monotonic() - t0)


@step("kernels, emulated launches (CPU)", gpu=False)
def emulated(c: Check):
    t0 = time.monotonic()
    rc, out = c.run([c.exe("ember_tests"), "--gtest_filter=*Emulated.*", "--gtest_brief=1"], "gtest_emulated.log")
    passed = re.search(r"\[  PASSED  \] (\d+) test", out)
    c.report("kernels, emulated launches (CPU)", "ok" if rc == 0 and passed else "FAIL",
             f"{passed.group(1)} tests: the augmentation and count_correct kernels' grid, per-block and per-thread "
             f"code on the CPU, bit for bit with the CPU reference, each output written once" if rc == 0 and passed
             else first_failure(out), seconds=time.monotonic() - t0)


DOCTOR_ROW = "doctor on this machine: torch, driver, GPUs, NCCL read as torch and nvidia-smi see them"
# The doctor's checks that read the GPU stack (torch in a child process, NVML through ctypes): they
# must pass on a machine the set-up found working; its other checks judge the machine (shared
# memory, RAM, disk, addresses) and are listed, not judged.
DOCTOR_GPU_CHECKS = ("torch", "driver", "gpus", "topology", "nccl")


def doctor_verdict(rc, out, expect):
    """(status, detail, numbers) of `tools/doctor.py --json` on this machine. `expect`: what the set-up
    read itself ({"gpus": torch's device count, "gpu_name", "driver": nvidia-smi's, "torch": its
    version}; {} without a GPU). FAIL when the doctor does not end with its JSON (exit 0 or 1), when one
    of DOCTOR_GPU_CHECKS fails, or when its facts disagree with `expect` (GPU count, driver, torch)."""
    try:
        j = json.loads(out[out.index("{"):])
        checks = {r["name"]: r for r in j["checks"]}
        facts = j.get("facts") or {}
    except (ValueError, KeyError, TypeError) as e:
        return "FAIL", f"{exit_text(rc)}, no JSON read ({type(e).__name__}): {first_failure(out)}", {}
    numbers = {n: r["status"] for n, r in checks.items()}
    if rc not in (0, 1):
        return "FAIL", f"{exit_text(rc)}: the doctor's own status is 0 or 1", numbers
    bad = [f"{n} failed: {short(checks[n]['detail'], 160)}" for n in DOCTOR_GPU_CHECKS
           if checks.get(n, {}).get("status") == "failure"]
    notes = []
    if expect:
        nvml, torch_facts = facts.get("nvml") or {}, facts.get("torch") or {}
        listed = nvml.get("gpus") or []
        if len(listed) != expect["gpus"]:
            bad.append(f"NVML lists {len(listed)} GPU(s), torch sees {expect['gpus']}")
        if torch_facts.get("device_count") != expect["gpus"]:
            bad.append(f"the doctor's torch probe counts {torch_facts.get('device_count')} GPU(s), "
                       f"torch sees {expect['gpus']}")
        if expect.get("driver") and nvml.get("driver") != expect["driver"]:
            bad.append(f"NVML reads driver {nvml.get('driver')}, nvidia-smi {expect['driver']}")
        if expect.get("torch") and torch_facts.get("version") != expect["torch"]:
            bad.append(f"the doctor's torch is {torch_facts.get('version')}, the set-up's {expect['torch']}")
        names = {g.get("name") for g in listed}
        if expect.get("gpu_name") and expect["gpu_name"] not in names:
            notes.append(f"NVML names the GPUs {sorted(map(str, names))}, torch {expect['gpu_name']!r}")
    machine = [f"{n} {r['status']}: {short(r['detail'], 100)}" for n, r in checks.items()
               if n not in DOCTOR_GPU_CHECKS and r["status"] in ("failure", "warning")]
    read = [f"{n} {checks[n]['status']}: {short(checks[n]['detail'], 160)}" for n in DOCTOR_GPU_CHECKS
            if n in checks and checks[n]["status"] != "skipped"]
    detail = "; ".join((bad or read) + notes + ([f"this machine: {'; '.join(machine)}"] if machine else []))
    return ("FAIL" if bad else "ok"), detail, numbers


@step(DOCTOR_ROW, gpu=False)
def doctor(c: Check):
    """tools/doctor.py (stdlib; torch in a child process, NVML through ctypes) as a user runs it on a
    node, checked against what this script's set-up read: the GPU count, the driver, torch. Without a
    GPU it runs with --cpu-only (CI keeps the row's reader alive)."""
    t0 = time.monotonic()
    args = ["--nproc", str(c.gpus())] if c.gpu else ["--cpu-only"]
    rc, out = c.run([c.python, ROOT / "tools" / "doctor.py", "--json", "--disk", c.work, *args], "doctor.log",
                    env=dict(c.env, EMBER_BUILD_DIR=str(c.bins)))
    expect = ({"gpus": c.gpus(), "gpu_name": c.info.get("gpu_name"), "driver": c.info.get("driver"),
               "torch": c.info.get("torch")} if c.gpu else {})
    status, detail, numbers = doctor_verdict(rc, out, expect)
    c.report(DOCTOR_ROW, status, detail + ("" if c.gpu else " (no GPU: --cpu-only)"), numbers=numbers,
             seconds=time.monotonic() - t0)
