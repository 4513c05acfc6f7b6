#!/usr/bin/env python3
"""Ember's GPU check: the checks that need a GPU, most important first, under a time budget.

    tools/ember device-check [--budget SECONDS] [--tier N ...] [--binaries DIR] [--out DIR]

Made for a lent GPU machine that has python3 with a CUDA torch but no Debian
packages, and a loan of minutes: it runs from the prebuilt binaries that
`tools/ember device-pack` put in .device/ when that machine's torch matches
the one they were built against (same version, same CUDA major), and builds
them there otherwise, saying which it did and why.

Rows run in a fixed priority order, tier by tier:
  tier 1, correctness: every GPU test case (issue 28's CUDA findings among
          them: late parameter under capture, .grad across epochs, ops outside
          the graph, host syncs with default options, sync-free rates, lr-find
          on a graph config, NVML on this device), compute-sanitizer memcheck
          and racecheck on the augmentation and count_correct kernels, the
          augmentation operators from Python, a short fashion_mnist run per
          precision mode (with its telemetry), a profiler trace, out of memory,
          plan and bs-find against the GPU, NCCL with one rank, the GradScaler's
          and the fused optimizers' parity with torch;
  tier 2, the GPU findings' tools and the speed goal: memory eager vs CUDA
          graph (plan --measure), lr-find on speedrun_gpu.toml (CUDA graphs),
          the CNN step at batch 128 with CUDA graphs against Python eager and
          torch.compile (the GPU speed goal, tools/README.md);
  tier 3, what a second call has time for, most important first: sharded
          data parallelism on NCCL with one rank (reduce-scatter and
          all-gather, each dist.sharding stage against DDP), the GPU
          speed run (5 seeds, its goal judged), activation checkpointing's
          memory and time on the GPU, weak scaling (fashion_mnist's
          samples/s per rank; NCCL across the GPUs there are, 1 rank on
          one GPU), the augmentation kernel's
          bandwidth, the monitoring overhead, the mixed-precision GPT bench
          at H200 size, accuracies that take minutes, the pruned ResNet's step
          times, char_gpt's GPU config, the whole small-model speed table.
The default runs tiers 1 and 2 with a budget that fits one 9-minute command
(their estimates: 387 s + 115 s + ~15 s of set-up = 517 s).
Before each row it compares the row's expected seconds on an H200 with the time
left and reports `not run (budget)` instead of starting what would not finish;
a row that runs over is stopped at the budget.

Statuses: ok, FAIL, timeout, skip, info, not run (budget), interrupted; a row
with a stated goal (a speed ratio, a bandwidth, an accuracy in a time) is `ok`
when every goal is met, `goal not met` when one is not and `not judged` when a
number it needs is missing (a side that did not run, a data subset), each goal
in its detail as "graphs 1.73x Python eager (goal >= 2: not met)". The summary
counts every status; its own is the worst of FAIL/timeout, goal not met, not
judged, ok. Exit status 1 on a FAIL, timeout or goal not met.

Results: each row is appended, as soon as it is known, to OUT/device_check.txt
(the table) and OUT/device_check.jsonl (one JSON object per row: name, tier,
status, detail, numbers, seconds); every log goes into OUT/logs.tar.gz,
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
import glob
import gzip
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / ".device"
RESULT_FILES = ("device_check.txt", "device_check.jsonl", "logs.tar.gz")
DEFAULT_BUDGET = 520  # tiers 1 + 2 inside a 540 s command, with time for start-up and the tarball
# Seconds the set-up takes from the budget before the first row (torch imported to describe the
# GPU, nvidia-smi, ldd on each executable, the test binary's listing): tiers 1 and 2's row
# estimates plus this must stay within DEFAULT_BUDGET (device_check_test.py checks it).
SETUP_ESTIMATE = 15
MAX_LOG_BYTES = 2 << 20  # per log in the tarball (the tail is kept)
# Executables the rows run, by folder of the binaries' layout (a build tree or .device/build).
RECIPES = ("fashion_mnist", "char_gpt", "cifar_resnet", "prune_finetune")
BENCHES = ("ember_bench_amp_step", "ember_bench_augment", "ember_bench_monitor", "ember_bench_prune",
           "ember_bench_heads", "ember_bench_ddp", "ember_bench_speed", "ember_bench_sharding", "ember_bench_activation_checkpoint")
TESTS = ("ember_tests", "ember_ddp_worker", "ember_parity_grad_scaler")
# The GPU test cases that compute-sanitizer runs: the two custom kernels.
SANITIZED = "AugmentCuda.*:*OpsCuda.*"


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived."""


class StepTimeout(Exception):
    """A command ran past the time the budget left it."""


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def result_values(out):
    """The numbers of a recipe's result line (key=value ... summary=PATH), by key."""
    values = {}
    for line in out.splitlines():
        if re.fullmatch(r"[a-z_]+=\S+( [a-z_]+=\S+)*", line.strip()) and " summary=" in line:
            values = {k: float(v) for k, v in re.findall(r"([a-z_]+)=([-+]?(?:[0-9.]+(?:e[-+]?\d+)?|nan|inf))(?=\s|$)",
                                                         line)}
    return values


def short(text, n=200):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


class Results:
    """The table and the JSON lines, appended row by row."""

    def __init__(self, out: Path):
        self.out = out
        self.rows = []
        self.txt = out / "device_check.txt"
        self.jsonl = out / "device_check.jsonl"

    def add(self, name, status, detail="", numbers=None, seconds=0.0, tier=0, block=None, gpu=False):
        row = {"name": name, "tier": tier, "gpu": gpu, "status": status, "detail": detail, "numbers": numbers or {},
               "seconds": round(seconds, 1)}
        self.rows.append(row)
        line = f"{name:<60} {status:<17} {seconds:6.1f}s  {detail}"
        text = line + "\n" + "".join(f"    | {b}\n" for b in (block or "").splitlines())
        with open(self.txt, "a") as f:
            f.write(text)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(text, end="", flush=True)


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.logs = self.work / "logs"
        self.python = args.python
        self.start = time.monotonic()
        self.deadline = self.start + args.budget
        self.results = Results(self.out)
        self.tier = 0
        self.env = dict(os.environ)
        self.bins = None  # the binaries' folder (build-tree layout)
        self.gpu = False
        self.info = {}
        self.data = None  # Fashion-MNIST folder
        self.text = None  # char_gpt's corpus
        self.current = None  # the step running now
        self.manifest = {}
        self.load_problem = None  # unloadable()'s answer

    # ---- time and processes ------------------------------------------------

    def left(self):
        return self.deadline - time.monotonic()

    def report(self, name, status, detail="", numbers=None, seconds=0.0, block=None, gpu=None):
        """One row; `gpu` (whether it needs a GPU) defaults to its step's."""
        if gpu is None:
            gpu = bool(self.current and self.current["gpu"])
        self.results.add(name, status, detail, numbers, seconds, self.tier, block, gpu)

    def run(self, cmd, log, limit=None, env=None, cwd=None, budgeted=True):
        """Runs cmd (output to logs/<log>), stopped at `limit` seconds or, when
        `budgeted` (rows; not the set-up), at the budget. Returns (exit status, output)."""
        if budgeted:
            limit = self.left() if limit is None else min(limit, self.left())
        if limit <= 0:
            raise StepTimeout("no time left")
        path = self.logs / log
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n".encode())
            f.flush()
            proc = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                    env=env or self.env, cwd=cwd, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                self.kill(proc)
                f.write(f"\n[device-check] stopped after {limit:.0f} s\n".encode())
                raise StepTimeout(f"stopped after {limit:.0f} s")
            except BaseException:
                self.kill(proc)
                raise
        return rc, path.read_text(errors="replace")

    @staticmethod
    def kill(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()



    # ---- the tarball -------------------------------------------------------

    def write_logs(self):
        """OUT/logs.tar.gz from the logs folder; each file's last MAX_LOG_BYTES."""
        tmp = self.out / "logs.tar.gz.part"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.logs.rglob("*")) if self.logs.exists() else []:
                if not path.is_file():
                    continue
                data = path.read_bytes()
                if len(data) > MAX_LOG_BYTES:
                    data = b"[... cut ...]\n" + data[-MAX_LOG_BYTES:]
                info = tarfile.TarInfo(str(Path("logs") / path.relative_to(self.logs)))
                info.size = len(data)
                info.mtime = int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, self.out / "logs.tar.gz")

    # ---- environment -------------------------------------------------------

    def describe_machine(self):
        code = r"""
import json, os, platform, site, sys, glob, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
roots = {os.path.dirname(os.path.dirname(torch.__file__))} | set(site.getsitepackages())
nvidia = sorted({d for r in roots for d in glob.glob(os.path.join(r, "nvidia", "*", "lib"))})
d = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
     "torch_lib": lib, "nvidia_libs": nvidia, "gpu": torch.cuda.is_available(),
     "cmake_prefix": torch.utils.cmake_prefix_path}
if d["gpu"]:
    p = torch.cuda.get_device_properties(0)
    d.update(gpu_name=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
             sms=p.multi_processor_count, gpus=torch.cuda.device_count())
print("INFO " + json.dumps(d))
"""
        rc, out = self.run([self.python, "-c", code], "machine.log", 120, budgeted=False)
        line = [x for x in out.splitlines() if x.startswith("INFO ")]
        if rc != 0 or not line:
            raise RuntimeError(f"{self.python} cannot import torch: {short(out[-400:])}")
        self.info = json.loads(line[-1][5:])
        i = self.info
        self.report("torch", "info", f"{i['torch']} (CUDA {i['cuda']}), python {i['python']} ({self.python})")
        if i["gpu"]:
            smi = shutil.which("nvidia-smi")
            driver = ""
            if smi:
                rc, out = self.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], "nvidia-smi.log", 30,
                                   budgeted=False)
                driver = f", driver {out.splitlines()[-1].strip()}" if rc == 0 else ""
            self.gpu = True
            self.report("gpu", "info", f"{i['gpu_name']}, {i['gpu_mem_gib']} GiB, sm_{i['capability'].replace('.', '')}"
                        f", {i['sms']} SMs, {i['gpus']} GPU(s){driver}", numbers={"capability": i["capability"]})
        elif os.environ.get("EMBER_DEVICE_ALLOW_CPU") == "1":
            self.report("gpu", "info", "none: EMBER_DEVICE_ALLOW_CPU=1, GPU rows are skipped")
        else:
            self.report("gpu", "FAIL", "torch sees no CUDA device (EMBER_DEVICE_ALLOW_CPU=1 runs the CPU rows only)")
            return False
        paths = [i["torch_lib"], *i["nvidia_libs"]]
        self.env["LD_LIBRARY_PATH"] = ":".join(paths + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        return True

    def find_binaries(self):
        """Sets self.bins: --binaries, the pack when it matches this torch, else a build here."""
        if self.args.binaries:
            self.bins = Path(self.args.binaries).resolve()
            if not (self.bins / "tests" / "ember_tests").exists():
                self.report("binaries", "FAIL", f"{self.bins} is not a build tree of Ember (no tests/ember_tests)")
                return False
            self.add_lib_path()
            self.report("binaries", "info", f"build tree {self.bins} (--binaries)")
            return True
        why = self.pack_mismatch()
        if why is None:
            self.bins = PACK / "build"
            self.add_lib_path()
            bad = self.unloadable()
            if not bad:
                m = self.manifest
                self.report("binaries", "info", f"prebuilt pack: built {m['built']} from {m['commit']} against torch "
                            f"{m['torch']} (CUDA {m['cuda']}), sm_{m['cuda_archs']}; this torch matches",
                            numbers={"mode": "prebuilt"})
                return True
            why = f"the prebuilt binaries do not load here ({bad})"
        self.report("binaries", "info", f"building here: {why}", numbers={"mode": "build"})
        return self.build_here()

    def pack_mismatch(self):
        """None when the pack fits this machine, else why not."""
        mf = PACK / "manifest.json"
        if not mf.exists() or not (PACK / "build" / "tests" / "ember_tests").exists():
            return "no prebuilt pack in .device/ (tools/ember device-pack makes one)"
        self.manifest = m = json.loads(mf.read_text())
        here_v, here_cuda = self.info["torch"].split("+")[0], (self.info["cuda"] or "none").split(".")[0]
        pack_v, pack_cuda = m["torch"].split("+")[0], str(m["cuda"]).split(".")[0]
        if (here_v, here_cuda) != (pack_v, pack_cuda):
            return f"pack built for torch {pack_v} CUDA {pack_cuda}, this machine has torch {here_v} CUDA {here_cuda}"
        cap = self.info.get("capability")
        if cap and cap.replace(".", "") not in str(m["cuda_archs"]).split(";"):
            return f"pack compiled for sm_{m['cuda_archs']}, this GPU is sm_{cap.replace('.', '')}"
        return None

    def add_lib_path(self):
        self.env["LD_LIBRARY_PATH"] = f"{self.bins / 'lib'}:{self.env.get('LD_LIBRARY_PATH', '')}"

    def executables(self):
        return ([self.bins / "bin" / r for r in RECIPES] + [self.bins / "bin" / b for b in BENCHES] +
                [self.bins / "tests" / t for t in TESTS])

    def unloadable(self):
        """'' when every executable finds its libraries, else what is missing (checked once)."""
        if self.load_problem is None:
            self.load_problem = self.find_unloadable()
        return self.load_problem

    def find_unloadable(self):
        ldd = shutil.which("ldd")
        missing = []
        for exe in self.executables():
            if not exe.exists():
                missing.append(f"{exe.name} absent")
                continue
            if ldd:
                rc, out = self.run([ldd, exe], "ldd.log", 60, budgeted=False)
                missing += [f"{exe.name}: {short(l, 160)}" for l in out.splitlines() if "not found" in l]
                if rc != 0 and "not a dynamic" not in out:
                    missing.append(f"{exe.name}: ldd exit {rc}")
        if not missing:
            rc, out = self.run([self.bins / "tests" / "ember_tests", "--gtest_list_tests"], "load.log", 120,
                               budgeted=False)
            if rc != 0:
                missing.append(short(out.splitlines()[-1] if out.strip() else f"exit {rc}"))
        return "; ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")

    def build_here(self):
        """Configures and builds the rows' targets against this machine's torch."""
        est = 420
        self.tier = 0
        if self.left() < est:
            self.report("build", "not run (budget)", f"a build takes ~{est} s; {self.left():.0f} s left")
            return False
        build = self.work / "build"
        inc = PACK / "include"
        cap = (self.info.get("capability") or "9.0").replace(".", "")
        args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_PREFIX_PATH={self.info['cmake_prefix']}", f"-DEMBER_PYTHON={self.python}",
                f"-DEMBER_CUDA_ARCHITECTURES={cap}", "-DEMBER_OPENCV=OFF", "-DCMAKE_SKIP_RPATH=ON"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else "")
        if nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        if (PACK / "googletest").is_dir():
            args.append(f"-DEMBER_GTEST_SOURCE_DIR={PACK / 'googletest'}")
        if inc.is_dir():
            args += [f"-DEMBER_TOMLPP_INCLUDE_DIR={inc}", f"-DEMBER_NLOHMANN_INCLUDE_DIR={inc}",
                     f"-DZLIB_INCLUDE_DIR={inc}"]
        libz = next((p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                                 "/usr/lib64/libz.so.1") if os.path.exists(p)), None)
        if libz:
            args.append(f"-DZLIB_LIBRARY={libz}")
        t0 = time.monotonic()
        try:
            rc, out = self.run(args, "build.log")
            if rc == 0:
                targets = [*RECIPES, *BENCHES, *TESTS]
                rc, out = self.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 4), "--target", *targets],
                                   "build.log")
        except StepTimeout as e:
            self.report("build", "timeout", str(e), seconds=time.monotonic() - t0)
            return False
        if rc != 0:
            err = [l for l in out.splitlines() if "error" in l.lower()]
            self.report("build", "FAIL", short(err[0] if err else out[-300:]), seconds=time.monotonic() - t0)
            return False
        self.bins = build
        self.load_problem = None
        self.add_lib_path()
        self.report("build", "ok", f"built against torch {self.info['torch']} for sm_{cap} in {build}",
                    seconds=time.monotonic() - t0)
        return True

    def find_data(self):
        for d in [self.args.data, PACK / "data" / "fashion-mnist", "/usr/share/datasets/fashion-mnist"]:
            if d and (Path(d) / "train-images-idx3-ubyte.gz").exists():
                self.data = Path(d)
                break
        for t in [PACK / "data" / "fortunes", "/usr/share/games/fortunes"]:
            if Path(t).is_dir():
                self.text = Path(t)
                break

    # ---- helpers for rows --------------------------------------------------

    def exe(self, name):
        for sub in ("bin", "tests"):
            if (self.bins / sub / name).exists():
                return self.bins / sub / name
        raise RuntimeError(f"{name} is not in {self.bins}")

    def recipe(self, name, log, args, limit=None):
        """Runs a recipe; returns (exit status, the key=value pairs of its last lines, output)."""
        rc, out = self.run([self.exe(name), *args, "trainer.progress=false"], log, limit)
        return rc, result_values(out), out

    def runs_dir(self, name):
        d = self.work / "runs" / name
        shutil.rmtree(d, ignore_errors=True)
        d.parent.mkdir(parents=True, exist_ok=True)
        return d


# ---- the rows -----------------------------------------------------------------
# Each step reports one or more rows. `estimate` is its expected seconds on an
# H200 with 16 cores, none measured yet (calibrate them from device_check.jsonl's
# `seconds`): a process that starts CUDA takes ~3 s (LibTorch's CUDA libraries,
# the context, cuBLAS/cuDNN handles), python with torch ~4 s; the estimates
# leave about 1.5x on top. `gpu` steps are skipped without a GPU.

STEPS = []


def step(name, tier, estimate, gpu=True, rows=None):
    def register(fn):
        STEPS.append({"name": name, "tier": tier, "estimate": estimate, "gpu": gpu, "fn": fn,
                      "rows": rows or [name]})
        return fn
    return register


def first_failure(out):
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if "Failure" in l or "error:" in l.lower() or "Error" in l:
            return short(" ".join(lines[i:i + 3]))
    return short(lines[-1] if lines else "no output")


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
    """The GPU speed goal (tools/README.md, tier 2), from speed_numbers(): the CNN at batch 128 with CUDA graphs
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


@step("binaries load (every library found)", 1, 5, gpu=False)
def load_check(c: Check):
    t0 = time.monotonic()
    bad = c.unloadable()
    n = sum(1 for e in c.executables() if e.exists())
    c.report("binaries load (every library found)", "FAIL" if bad else "ok", bad or f"{n} executables, "
             f"LD_LIBRARY_PATH = binaries, torch/lib and the wheel's nvidia libraries", seconds=time.monotonic() - t0)


@step("kernels, emulated launches (CPU)", 1, 10, gpu=False)
def emulated(c: Check):
    t0 = time.monotonic()
    rc, out = c.run([c.exe("ember_tests"), "--gtest_filter=*Emulated.*", "--gtest_brief=1"], "gtest_emulated.log")
    passed = re.search(r"\[  PASSED  \] (\d+) test", out)
    c.report("kernels, emulated launches (CPU)", "ok" if rc == 0 and passed else "FAIL",
             f"{passed.group(1)} tests: the augmentation and count_correct kernels' grid, per-block and per-thread "
             f"code on the CPU, bit for bit with the CPU reference, each output written once" if rc == 0 and passed
             else first_failure(out), seconds=time.monotonic() - t0)


def gtest_cases(c: Check, filt, log, json_name):
    """Runs the filtered cases in one process; {name: (status, detail, seconds)} and whether it finished."""
    report = c.work / json_name
    report.unlink(missing_ok=True)
    rc, out = c.run([c.exe("ember_tests"), f"--gtest_filter={filt}", f"--gtest_output=json:{report}"], log)
    cases = {}
    if report.exists():
        for suite in json.loads(report.read_text()).get("testsuites", []):
            for t in suite.get("testsuite", []):
                name = f"{suite['name']}.{t['name']}"
                secs = float(str(t.get("time", "0")).rstrip("s") or 0)
                if t.get("failures"):
                    cases[name] = ("FAIL", short(t["failures"][0].get("failure", ""), 300), secs)
                elif t.get("result") == "SKIPPED":
                    msg = re.search(r"Skipped\s*\n?(.*)", out.split(f"[ RUN      ] {name}")[-1])
                    cases[name] = ("skip", short(msg.group(1) if msg else "skipped", 120), secs)
                else:
                    cases[name] = ("ok", "", secs)
        return cases, True
    # No report: the process died. What finished is in the log; the rest is unknown.
    for m in re.finditer(r"\[ +(OK|FAILED|SKIPPED) +\] (\S+) \((\d+) ms\)", out):
        status = {"OK": "ok", "FAILED": "FAIL", "SKIPPED": "skip"}[m.group(1)]
        cases[m.group(2)] = (status, "", int(m.group(3)) / 1e3)
    started = re.findall(r"\[ RUN      \] (\S+)", out)
    for name in started:
        if name not in cases:
            cases[name] = ("FAIL", f"the test process died in it (exit {rc}): {short(out.splitlines()[-1])}", 0.0)
    return cases, False


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


# ~26 cases in one process: the CUDA start-up, then seconds each (the batch-size search, the
# graph-vs-eager runs and the memory probe the longest); failed ones again alone.
@step("gpu test cases (*Cuda.*)", 1, 60, gpu=False)
def gpu_tests(c: Check):
    t0 = time.monotonic()
    rc, listing = c.run([c.exe("ember_tests"), "--gtest_filter=*Cuda.*", "--gtest_list_tests"], "gtest_cuda.log")
    names, suite = [], None
    for line in listing.splitlines()[1:]:
        if not line.startswith(" ") and line.endswith("."):
            suite = line[:-1]
        elif line.startswith("  ") and suite:
            names.append(f"{suite}.{line.split()[0]}")
    if rc != 0 or not names:
        c.report("gpu test cases (*Cuda.*)", "FAIL", f"cannot list them: {short(listing[-300:])}")
        return
    cases, whole = gtest_cases(c, "*Cuda.*", "gtest_cuda.log", "gtest_cuda.json")
    # A failure can poison the CUDA context for the cases after it: run each
    # failed or unfinished case again in a process of its own.
    again = [n for n in names if cases.get(n, ("FAIL",))[0] == "FAIL"]
    for n in again:
        one, _ = gtest_cases(c, n, "gtest_cuda_rerun.log", "gtest_rerun.json")
        status, detail, secs = one.get(n, ("FAIL", "no result", 0.0))
        if status != "FAIL" and n in cases:
            detail = f"passed alone; failed after others in one process: {cases[n][1]}"
            status = "FAIL"
        cases[n] = (status, detail, secs)
    # One row per test; a parameterised test (Suite.Test/param: the operator
    # harness) is one row over its cases, naming the failed ones.
    rows = {}
    for n in names:
        suite, test = n.split(".", 1)
        rows.setdefault(f"{suite}.{test.split('/')[0]}", []).append(n)
    for row, members in sorted(rows.items(), key=lambda kv: kv[0] not in FINDINGS):  # issue 28's first
        results = [cases.get(n, ("FAIL", "no result", 0.0)) for n in members]
        secs = sum(r[2] for r in results)
        if len(members) == 1:
            status, detail, _ = results[0]
        else:
            failed = [n.split("/", 2)[-1] + (f": {r[1]}" if r[1] else "")
                      for n, r in zip(members, results) if r[0] == "FAIL"]
            n_ok = sum(1 for r in results if r[0] == "ok")
            status = "FAIL" if failed else ("ok" if n_ok else "skip")
            detail = (f"{len(members)} cases, {n_ok} ok, {len(failed)} failed"
                      + (f": {short('; '.join(failed), 300)}" if failed else "")
                      + ("" if failed or n_ok else f"; {results[0][1]}"))
        if row in FINDINGS:
            detail = f"{FINDINGS[row]}" + (f": {detail}" if detail else "")
        c.report(f"gpu test {row}", status, detail, seconds=secs, gpu=True)
    counts = {s: sum(1 for n in names if cases.get(n, ("FAIL",))[0] == s) for s in ("ok", "FAIL", "skip")}
    absent = [f for f in FINDINGS if f not in rows]
    c.report("gpu test cases (*Cuda.*)", "FAIL" if counts["FAIL"] else ("skip" if not counts["ok"] else "ok"),
             f"{len(names)} cases: {counts['ok']} ok, {counts['FAIL']} failed, {counts['skip']} skipped"
             + ("" if whole else "; the process died, cases rerun alone")
             + (f"; issue 28 cases not in this binary: {', '.join(absent)}" if absent else ""), numbers=counts,
             seconds=time.monotonic() - t0)


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
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", out) or re.findall(r"RACECHECK SUMMARY: (\d+) hazard", out)
    passed = re.search(r"\[  PASSED  \] (\d+) test", out)
    errors = int(summary[-1]) if summary else None
    ok = rc == 0 and errors == 0 and passed
    # The first finding: "========= Invalid __global__ write of size 4 bytes", "... Race reported ...".
    finding = next((l.strip("= ") for l in out.splitlines()
                    if l.startswith("=========") and re.search(r"Invalid|[Rr]ace|[Hh]azard|Error|error", l)
                    and "SUMMARY" not in l), None)
    c.report(name, "ok" if ok else "FAIL",
             f"{passed.group(1)} tests, 0 errors" if ok else
             f"{errors if errors is not None else '?'} errors/hazards, exit {rc}: {short(finding or first_failure(out))}",
             numbers={"errors": errors}, seconds=time.monotonic() - t0)


@step("compute-sanitizer memcheck (augment, count_correct)", 1, 40)
def memcheck(c: Check):
    sanitizer(c, "memcheck")


@step("compute-sanitizer racecheck (augment, count_correct)", 1, 50)
def racecheck(c: Check):
    sanitizer(c, "racecheck")


@step("augment operators from Python (CUDA)", 1, 15)
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
              f"{f('backward_ms', '%.2f')} opt {f('optimizer_ms', '%.2f')}), mem {f('gpu_mem_allocated_mib', '%.0f')} MiB "
              f"peak {f('gpu_mem_peak_mib', '%.0f')}, util {f('gpu_util', '%.0f')}%, {f('gpu_power_w', '%.0f')} W, "
              f"{f('gpu_temp_c', '%.0f')} C, sm {f('gpu_sm_clock_mhz', '%.0f')} MHz, mfu {f('mfu', '%.4f')}")
    c.report("telemetry (fashion bf16, cuda)", "FAIL" if missing else "ok",
             detail + (f"; null: {', '.join(missing)}" if missing else "")
             + ("; a MIG instance: NVML gives no utilization" if mig else ""), numbers={k: r.get(k) for k in want})


for _p in PRECISIONS:
    step(f"fashion_mnist {_p}, 1 epoch (cuda)", 1, 12,
         rows=[f"fashion_mnist {_p}, 1 epoch (cuda)"] + (["telemetry (fashion bf16, cuda)"] if _p == "bf16-mixed" else []))(
        lambda c, p=_p: fashion_short(c, p))


@step("profiler trace, 3 steps (cuda)", 1, 12)
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


@step("GPU out of memory: caught, explained, run folder intact (cuda)", 1, 12)
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
             f"exit {rc}: {said[:300]}" if ok else f"exit {rc}, want 1 and an explained error: {said[:300] or first_failure(out)}",
             seconds=time.monotonic() - t0)


PLAN_ROW = "plan vs run: memory and step time, fashion_mnist bf16 (cuda)"


@step(PLAN_ROW, 1, 35)
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
    gpu_line_err = (gpu_verify["predicted_peak_bytes"] - gpu_verify["measured_peak_bytes"]) / gpu_verify["measured_peak_bytes"]
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


@step(BS_FIND_ROW, 1, 30)
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


@step("DDP on NCCL, 1 rank (cuda)", 1, 10)
def nccl(c: Check):
    name = "DDP on NCCL, 1 rank (cuda)"
    t0 = time.monotonic()
    out_base = c.work / "nccl"
    env = dict(c.env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29517")
    rc, out = c.run([c.exe("ember_ddp_worker"), "--out", out_base, "--device", "cuda", "--backend", "nccl",
                     "--force-group", "1", "--batch", "64"], "nccl.log", env=env)
    res = Path(f"{out_base}.rank0.json")
    got = json.loads(res.read_text()) if res.exists() else {}
    ok = rc == 0 and got.get("backend") == "nccl" and got.get("steps", 0) > 0
    c.report(name, "ok" if ok else "FAIL", json.dumps(got) if ok else f"exit {rc}: {first_failure(out)}",
             numbers=got, seconds=time.monotonic() - t0)


SHARDING_ROW = "sharded data parallel on NCCL, 1 rank: collectives, each stage = DDP (cuda)"


@step(SHARDING_ROW, 3, 30)
def sharding_nccl(c: Check):
    """NCCL's reduce-scatter (sum, max) and all-gather on CUDA tensors with a group of one, then each
    dist.sharding stage (BlockNet, AdamW, clipping, accumulation) against DDP in the same group: with one
    rank every shard is the whole unit, so the stages must reach DDP's weights to 1e-6."""
    t0 = time.monotonic()
    env = dict(c.env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29518")
    common = ["--device", "cuda", "--backend", "nccl", "--force-group", "1", "--batch", "48", "--samples", "240",
              "--model", "blocks", "--odd", "1", "--optimizer", "adamw", "--clip", "0.5", "--accumulate", "2",
              "--epochs", "7"]
    rc, out = c.run([c.exe("ember_ddp_worker"), "--out", c.work / "nccl_coll", "--device", "cuda", "--backend",
                     "nccl", "--force-group", "1", "--check-collectives", "1"], "sharding_nccl.log", env=env)
    if rc != 0:
        c.report(SHARDING_ROW, "FAIL", f"collectives: exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    worst, failed = {}, []
    weights = {}
    for stage in ("none", "optimizer", "gradients", "parameters"):
        base = c.work / f"nccl_{stage}"
        rc, out = c.run([c.exe("ember_ddp_worker"), "--out", base, *common, "--sharding", stage],
                        f"sharding_nccl_{stage}.log", env=env)
        if rc != 0:
            failed.append(f"{stage}: exit {rc}: {first_failure(out)}")
            continue
        weights[stage] = Path(f"{base}.rank0.safetensors")
    if not failed:
        rc, out = c.run([c.python, "-c", (
            "import sys, json; from safetensors.torch import load_file\n"
            "ref = load_file(sys.argv[1]); out = {}\n"
            "for path in sys.argv[2:]:\n"
            "    got = load_file(path)\n"
            "    out[path] = max(((got[k].double() - ref[k].double()).norm() / ref[k].double().norm().clamp_min(1e-12)).item() for k in ref)\n"
            "print(json.dumps(out))"), weights["none"], *[weights[s] for s in ("optimizer", "gradients", "parameters")]],
            "sharding_nccl_compare.log")
        try:
            diffs = json.loads(out.strip().splitlines()[-1])
            worst = {Path(k).name.split(".")[0]: v for k, v in diffs.items()}
        except (ValueError, IndexError):
            failed.append(f"comparison: exit {rc}: {first_failure(out)}")
    bad = {k: v for k, v in worst.items() if v > 1e-6}
    ok = not failed and worst and not bad
    detail = ("reduce-scatter sum/max and all-gather right; stages vs DDP: " +
              ", ".join(f"{k} {v:.1e}" for k, v in worst.items())) if ok else "; ".join(
                  failed + [f"{k} differs from DDP by {v:.1e} relative" for k, v in bad.items()])
    c.report(SHARDING_ROW, "ok" if ok else "FAIL", detail, numbers=worst, seconds=time.monotonic() - t0)


@step("GradScaler parity with torch.amp.GradScaler (cuda)", 1, 30)
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


@step("fused optimizers: GradScaler parity with torch fused=True, no host sync (cuda)", 1, 30)
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


# ---- benches -----------------------------------------------------------------------
# Rows of tiers 2 and 3 alike: the order of the steps in this file is their
# order within a tier (main() runs tier by tier).

def bench_row(c: Check, name, cmd, log, limit=None, numbers=lambda out: {}, detail=lambda n, out: "", goals=None):
    """Runs a bench as one row. Without `goals` it is ok when the bench exits 0; with them
    (goals(numbers, output) -> [goal(...)]) the goals decide (goal_status), each one in the detail
    with its number, and a bench whose numbers cannot be read is `not judged`."""
    t0 = time.monotonic()
    rc, out = c.run(cmd, log, limit)
    if rc != 0:
        c.report(name, "FAIL", f"exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return None
    table = "\n".join(l for l in out.splitlines() if not l.startswith(("[bench", "rep ", "$ ")))
    status, judged = "ok", []
    try:  # the bench ran: a number it printed differently must not lose its table
        n = numbers(out)
        text = detail(n, out)
        if goals:
            judged = goals(n, out)
            status = goal_status(judged)
    except Exception as e:
        n, text = {}, f"(numbers not read: {type(e).__name__}: {short(e, 100)}; see the table)"
        if goals:
            status, text = NOT_JUDGED, "goals not judged " + text
    if judged:
        text = "; ".join([g["text"] for g in judged] + ([text] if text else []))
        n = dict(n, goals=goal_numbers(judged))
    c.report(name, status, text, numbers=n, seconds=time.monotonic() - t0, block=table[-3000:])
    return n


def speed_numbers(js):
    """{"cnn b128": {"ember": ms, "ember-graph": ms, "python": ms, ..., "errors": {side: why}}} from
    speed.py's --json; a side that did not run has None (and its reason under "errors")."""
    data = json.loads(js.read_text())
    rows = {}
    for r in data["rows"]:
        case = {side: v.get("median_ms") for side, v in r["sides"].items()}
        errors = {side: v["error"] for side, v in r["sides"].items() if "error" in v}
        rows[f"{r['model']} b{r['batch']}"] = dict(case, errors=errors) if errors else case
    return rows


def speed_detail(n, _=None):
    """Per case: Ember with CUDA graphs and eager against Python eager, and graphs against Python
    eager at its best (the faster of its default optimizer and fused=True: speed.py's like for like)."""
    parts = []
    for case, s in n.items():
        py, graph, eager = s.get("python"), s.get("ember-graph"), s.get("ember")
        best = min((v for v in (py, s.get("python-fused")) if v), default=None)
        x = [f"graphs {py / graph:.2f}x" if py and graph else "", f"eager {py / eager:.2f}x" if py and eager else ""]
        text = ", ".join(t for t in x if t)
        if text:
            text += " Python eager"
        if best and graph:
            text += f"{'; ' if text else ''}graphs {best / graph:.2f}x Python at its best (fused or not)"
        parts.append(f"{case}: {text or 'no ratio (see the table)'}")
    return "; ".join(parts)


def speed_cmd(c: Check, js, *args):
    return [c.python, ROOT / "tools" / "bench" / "speed.py", "--binary", c.exe("ember_bench_speed"), "--device",
            "cuda", "--json", js, *args]


# ---- tier 2: the GPU findings' tools and the speed goal ------------------------------

MEMORY_ROW = "memory eager vs graph (plan --measure, cuda)"


def find_field(j, key):
    """j[key], else the first j[x][key] one object down (where a writer nests it); None when absent."""
    if key in j:
        return j[key]
    return next((v[key] for v in j.values() if isinstance(v, dict) and key in v), None)


def measure_memory(j):
    """What the memory row reads from a --measure JSON made with plan.verify=true: the training loop's
    measured peak at the config's batch, whether the probe ran a real CUDA graph
    (memory_includes_graph_pool) and the ATen ops launched per step (step_ops)."""
    return {"batch": j["verify"]["batch"], "peak_bytes": j["verify"]["measured_peak_bytes"],
            "graph_pool": find_field(j, "memory_includes_graph_pool"), "step_ops": find_field(j, "step_ops")}


def memory_verdict(eager, graph):
    """(status, detail) of the memory row from measure_memory() of the eager and the graph run: ok when
    the graph run's peak is at least the eager one's (a graph run holds its private pool beside eager
    allocations); not judged when the graph run's probe ran no CUDA graph."""
    mib = 1 << 20
    e, g = eager["peak_bytes"], graph["peak_bytes"]
    ops = graph["step_ops"] or eager["step_ops"]
    pool = lambda m: "absent" if m["graph_pool"] is None else json.dumps(m["graph_pool"])
    text = (f"batch {graph['batch']} bf16-mixed: measured peak eager {e / mib:.1f} MiB, graph {g / mib:.1f} MiB "
            f"({g / max(e, 1):.2f}x; want graph >= eager); memory_includes_graph_pool eager {pool(eager)}, "
            f"graph {pool(graph)}; step_ops "
            + (", ".join(f"{k} {'n/a' if ops.get(k) is None else format(ops[k], 'g')}"
                         for k in ("eager", "graph_inside", "graph_outside", "data_loading") if k in ops)
               if isinstance(ops, dict) else "absent"))
    if graph["graph_pool"] is not True:
        return NOT_JUDGED, ("the graph run's JSON does not say memory_includes_graph_pool=true (its probe ran no "
                            "CUDA graph, or the binary predates the field): nothing to compare; " + text)
    return ("ok" if g >= e else "FAIL"), text


@step(MEMORY_ROW, 2, 30)
def memory_eager_vs_graph(c: Check):
    """Issue 28, finding 3: a graph run holds the graph's pool beside eager allocations, so its
    measured peak at the speed run's batch must not be below the eager run's (plan --measure and
    bs-find advise from these probes). Two --measure runs of ~10 s: the start-up, five task builds
    on the resident dataset (probes at 8 and 32, the check at 128, the timed steps)."""
    if not c.data:
        c.report(MEMORY_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("memory_graph")
    got = {}
    for graph in ("false", "true"):
        rc, _, out = c.recipe("fashion_mnist", f"memory_graph_{graph}.log",
                              ["--measure", work / f"graph_{graph}.json", "--config",
                               ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml", f"data.root={c.data}",
                               f"trainer.cuda_graph={graph}", "plan.precisions=bf16-mixed", "plan.verify=true"])
        if rc != 0:
            c.report(MEMORY_ROW, "FAIL", f"--measure with trainer.cuda_graph={graph}: exit {rc}: {first_failure(out)}",
                     seconds=time.monotonic() - t0)
            return
        try:
            got[graph] = measure_memory(json.loads((work / f"graph_{graph}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            c.report(MEMORY_ROW, "FAIL", f"graph_{graph}.json (trainer.cuda_graph={graph}): {e!r}",
                     seconds=time.monotonic() - t0)
            return
    status, text = memory_verdict(got["false"], got["true"])
    c.report(MEMORY_ROW, status, text, numbers={"eager": got["false"], "graph": got["true"]},
             seconds=time.monotonic() - t0)


LR_FIND_ROW = "lr-find on speedrun_gpu.toml (cuda graphs config)"


def lr_suggestion(out):
    """The learning rate of lr-find's last `optim.lr=...` line, or None."""
    found = re.findall(r"^optim\.lr=(\S+)\s*$", out, re.M)
    return float(found[-1]) if found else None


SHARD_PLAN_ROW = "plan vs bs-find: one rank of 8, sharding and checkpointing, char_gpt bf16 (cuda)"
# (dist.sharding, activation checkpointing) pairs the row measures: DDP, each stage, ZeRO-3 + full.
SHARD_PLAN_CASES = (("none", "none"), ("optimizer", "none"), ("gradients", "none"), ("parameters", "none"),
                    ("parameters", "full"))


def shard_plan_errors(plan, held_bytes, peaks, gpu_name=""):
    """The planner's per-GPU memory against one rank's measured peak, per SHARD_PLAN_CASES pair in
    `peaks` ({(sharding, checkpointing): bs-find's trial peak in bytes, on top of what the task holds}).
    planned = the configuration row's memory parts less the CUDA context; measured = the peak +
    `held_bytes` (parameters, buffers, resident data: what the task holds before training). The plan's
    row for the GPU named in `gpu_name` when it has one, else its first. Returns
    [{"case", "planned", "measured", "error"}]."""
    rows = plan["configurations"]["rows"]
    named = [r for r in rows if r["gpu"].split("-")[0].lower() in gpu_name.lower()] if gpu_name else []
    gpu = (named or rows)[0]["gpu"]
    out = []
    for (sharding, ac), peak in peaks.items():
        row = next(r for r in rows if r["gpu"] == gpu and r["sharding"] == sharding
                   and r["activation_checkpoint"] == ac)
        parts = row["memory_parts"]
        planned = sum(parts.values()) - parts.get("context", 0)
        measured = peak + held_bytes
        out.append({"case": f"{sharding}/{ac}", "planned": planned, "measured": measured,
                    "error": (planned - measured) / measured})
    return out


@step(SHARD_PLAN_ROW, 3, 70)
def shard_plan_gpu(c: Check):
    """The planner's memory per GPU for a run on 8 ranks (each dist.sharding stage, and ZeRO-3 with full
    activation checkpointing), planned from a CPU measurement as a user would, against bs-find's measured
    peak of one rank of 8 on this GPU (bs_find.world_size=8: one process, collectives that send nothing).
    Goal: each within 25%."""
    if not c.text:
        c.report(SHARD_PLAN_ROW, "skip", "no text corpus for char_gpt (tools/ember device-pack packs one)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("shard_plan")
    common = [f"data.path={c.text}", "model.n_layer=6", "model.n_embd=256", "model.n_head=8", "data.block_size=128",
              "trainer.precision=bf16-mixed"]
    batch = 16
    rc, _, out = c.recipe("char_gpt", "shard_plan_measure.log",
                          ["--measure", work / "cpu.json", "trainer.device=cpu", f"data.batch_size={batch}",
                           "plan.precisions=bf16-mixed", "plan.timed_steps=1", *common])
    if rc != 0:
        c.report(SHARD_PLAN_ROW, "FAIL", f"--measure exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    rc, out = c.run([c.python, ROOT / "tools" / "plan" / "plan.py", work / "cpu.json", "--json", "--world-size", "8",
                     "--sharding", "all", "--activation-checkpoint", "all"], "shard_plan_json.log")
    peaks = {}
    for sharding, ac in SHARD_PLAN_CASES:
        rc_bs, _, out_bs = c.recipe("char_gpt", f"shard_plan_{sharding}_{ac}.log",
                                    ["--find-batch-size", work / f"{sharding}_{ac}.json", "trainer.device=cuda",
                                     "bs_find.world_size=8", f"dist.sharding={sharding}",
                                     f"model.activation_checkpoint_every={1 if ac == 'full' else 0}",
                                     f"bs_find.start={batch}", f"bs_find.max_batch={batch}", *common])
        if rc_bs != 0:
            c.report(SHARD_PLAN_ROW, "FAIL", f"bs-find {sharding}/{ac} exit {rc_bs}: {first_failure(out_bs)}",
                     seconds=time.monotonic() - t0)
            return
        peaks[(sharding, ac)] = json.loads((work / f"{sharding}_{ac}.json").read_text())["trials"][0]["peak_bytes"]
    try:
        m = json.loads((work / "cpu.json").read_text())
        held = m["parameter_bytes"] + m["buffer_bytes"] + m["dataset"]["resident_bytes"]
        errors = shard_plan_errors(json.loads(out[out.index("{"):]), held, peaks, str(c.info.get("gpu_name", "")))
    except (ValueError, KeyError, StopIteration, TypeError) as e:
        c.report(SHARD_PLAN_ROW, "FAIL", f"plan.py: {e!r}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    goals = [goal(e["case"], 100 * abs(e["error"]), "<=", 25, "% off", "%", fmt="{:.0f}") for e in errors]
    c.report(SHARD_PLAN_ROW, goal_status(goals),
             "; ".join(f"{e['case']} planned {e['planned'] / 2**20:.0f} MiB, measured {e['measured'] / 2**20:.0f} MiB "
                       f"({100 * e['error']:+.0f}%)" for e in errors),
             numbers={"cases": errors, "goals": goal_numbers(goals)}, seconds=time.monotonic() - t0)


AC_ROW = "activation checkpointing: memory and step time, CharGpt and ResNet-20 (cuda)"


@step(AC_ROW, 3, 60)
def activation_checkpoint_gpu(c: Check):
    """tools/bench/activation_checkpoint.cpp on the GPU: the caching allocator's peak and the step time of
    none / full / full/2 / light, as ratios to none (the goal: full >= 40% less activation memory for
    <= 25% more time; light >= 20% for <= 8%). The row reports the bench's table lines; it fails only when
    the bench fails (the goal is judged from the numbers, in the note)."""
    t0 = time.monotonic()
    rc, out = c.run([c.exe("ember_bench_activation_checkpoint"), "--device", "cuda", "--reps", "5"],
                    "activation_checkpoint_gpu.log")
    rows = [l.strip() for l in out.splitlines() if re.match(r"\s*(none|full|full/2|light)\b", l)]
    ok = rc == 0 and bool(rows)
    c.report(AC_ROW, "ok" if ok else "FAIL", short(" | ".join(rows), 600) if ok else f"exit {rc}: {first_failure(out)}",
             seconds=time.monotonic() - t0)


SCALING_ROW = "weak scaling bench: fashion_mnist samples/s per rank, NCCL (cuda)"


def scaling_numbers(js):
    """{ranks (a string): {"per_rank", "min", "max", "ratio", "total"}} from tools/bench/scaling.py's --json:
    the median samples/s per rank over the repeats, their spread, its ratio to the smallest rank count's
    median (1 rank's when it ran) and the total (median x ranks)."""
    data = json.loads(Path(js).read_text())
    return {str(r["ranks"]): {"per_rank": r["median"], "min": r["min"], "max": r["max"], "ratio": r["ratio"],
                              "total": r["total"]} for r in data["rows"]}


def scaling_detail(n, _=None):
    """'1 rank: 41234 samples/s per rank [40100..41800] (1.00x, total 41234); 2 ranks: ... (0.97x, total
    80012)', the ratio to the smallest rank count; with one rank count only, no ratio, and that it measured
    no scaling."""
    parts = []
    for ranks, v in sorted(n.items(), key=lambda kv: int(kv[0])):
        text = f"{ranks} rank{'s' if ranks != '1' else ''}: {v['per_rank']:.0f} samples/s per rank " \
               f"[{v['min']:.0f}..{v['max']:.0f}]"
        if len(n) > 1:
            text += f" ({v['ratio']:.2f}x, total {v['total']:.0f})"
        parts.append(text)
    if list(n) == ["1"]:
        parts.append("one GPU: 1 rank only, which builds no process group (NCCL unused); scaling needs several GPUs")
    return "; ".join(parts)


@step(SCALING_ROW, 3, 40)
def scaling_gpu(c: Check):
    """tools/bench/scaling.py on the GPU: fashion_mnist at batch 512 per rank, 80 steps timed after 20, 3
    repeats, at 1 rank and at 2, 4, 8 ranks as far as the machine has GPUs (one per rank, NCCL). With one
    GPU the row is the 1-rank baseline (~5 s per run: CUDA's start and the data dominate; 8 GPUs would
    take about 4x its estimate). No goal: it reports the numbers; it fails only when the bench does."""
    if not c.data:
        c.report(SCALING_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    gpus = int(c.info.get("gpus") or 1)
    counts = ",".join(str(n) for n in (1, 2, 4, 8) if n <= gpus)
    js = c.work / "scaling_gpu.json"
    bench_row(c, SCALING_ROW,
              [c.python, ROOT / "tools" / "bench" / "scaling.py", "--bin-dir", c.exe("fashion_mnist").parent,
               "--device", "cuda", "--backend", "nccl", "--nproc", counts, "--batch", "512", "--steps", "80",
               "--warmup", "20", "--repeats", "3", "--data", c.data, "--work", c.work / "scaling", "--json", js],
              "scaling_gpu.log", numbers=lambda _: scaling_numbers(js), detail=scaling_detail)


@step(LR_FIND_ROW, 2, 15)
def lr_find(c: Check):
    """Issue 28, finding 2: lr-find on a config with trainer.cuda_graph=true, as `tools/ember lr-find
    fashion_mnist --config recipes/fashion_mnist/speedrun_gpu.toml` runs it. ~8 s: the start-up, the
    resident dataset, 40 small steps (eager warm-up, a capture, replays)."""
    if not c.data:
        c.report(LR_FIND_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    t0 = time.monotonic()
    js = c.runs_dir("lr_find") / "lr_find.json"
    rc, _, out = c.recipe("fashion_mnist", "lr_find.log",
                          ["--find-lr", js, "--config", ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml",
                           f"data.root={c.data}", "lr_find.steps=40"])
    lr = lr_suggestion(out)
    if rc != 0 or lr is None:
        c.report(LR_FIND_ROW, "FAIL", f"exit {rc}" + ("" if rc else ", no optim.lr= line") + f": {first_failure(out)}",
                 seconds=time.monotonic() - t0)
        return
    try:
        j = json.loads(js.read_text())
        curve = f"; {len(j['lrs'])} steps recorded ({j['stop_reason']})"
    except (OSError, ValueError, KeyError) as e:
        curve = f"; lr_find.json not read: {e!r}"
    c.report(LR_FIND_ROW, "ok", f"optim.lr={lr:.3g}{curve}", numbers={"lr": lr}, seconds=time.monotonic() - t0)


SPEED_GOAL_ROW = "speed goal: CNN b128, CUDA graphs vs Python eager and compile (cuda)"


@step(SPEED_GOAL_ROW, 2, 70)
def speed_goal(c: Check):
    """The GPU speed goal (tools/README.md, tier 2), on the one case it names: FashionNet at batch 128, Ember with
    CUDA graphs against Python eager (fused=True beside it) and torch.compile reduce-overhead;
    3 interleaved reps, each side's ember process started anew (~3 s), torch.compile cold once
    (~20 s) then from Inductor's cache."""
    js = c.work / "speed_goal.json"
    bench_row(c, SPEED_GOAL_ROW,
              speed_cmd(c, js, "--models", "cnn", "--batches", "128", "--sides", "ember", "ember-graph", "python",
                        "python-fused", "compile", "--reps", "3", "--steps", "100", "--warmup", "20"),
              "speed_goal.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))


# ---- tier 3: what a second call has time for, most important first ----------------------

SPEEDRUN_ROW = "fashion_mnist speedrun_gpu.toml: 94% in under 5 s of training, 5 seeds (cuda)"


@step(SPEEDRUN_ROW, 3, 90)
def speedrun_gpu(c: Check):
    """Five seeds of about 10 s each when the goal is met: start-up, the resident dataset, 12 epochs
    of 469 replayed steps (< 5 s), the test pass."""
    if not c.data:
        c.report(SPEEDRUN_ROW, "skip", "no Fashion-MNIST")
        return
    with gzip.open(c.data / "train-images-idx3-ubyte.gz", "rb") as f:
        train_images = int.from_bytes(f.read(8)[4:], "big")
    t0 = time.monotonic()
    got = []
    for seed in range(5):
        rc, v, out = c.recipe("fashion_mnist", f"speedrun_gpu_{seed}.log",
                              ["--config", ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml",
                               f"data.root={c.data}", f"trainer.seed={seed}",
                               f"run.dir={c.runs_dir('speedrun-' + str(seed))}"])
        if rc != 0:
            c.report(SPEEDRUN_ROW, "FAIL", f"seed {seed}: exit {rc}: {first_failure(out)}",
                     seconds=time.monotonic() - t0)
            return
        got.append((v.get("test_accuracy", 0), v.get("train_seconds", 0)))
    accs, secs = [a for a, _ in got], [t for _, t in got]
    goals = speedrun_goals(accs, secs, train_images)
    text = (f"test accuracy mean {statistics.mean(accs):.4f}, training seconds mean {statistics.mean(secs):.2f}, "
            f"{train_images} training images")
    c.report(SPEEDRUN_ROW, goal_status(goals), "; ".join([g["text"] for g in goals] + [text]),
             numbers={"accuracy": accs, "train_seconds": secs, "train_images": train_images,
                      "goals": goal_numbers(goals)}, seconds=time.monotonic() - t0)


@step("augment bench: kernel vs copy bandwidth (cuda)", 3, 30)
def augment_bench(c: Check):
    js = c.work / "augment_gpu.json"
    bench_row(c, "augment bench: kernel vs copy bandwidth (cuda)",
              [c.exe("ember_bench_augment"), "--device", "cuda", "--json", js], "augment_bench.log",
              numbers=lambda _: json.loads(js.read_text()),
              detail=lambda n, _: f"copy {n['copy_gbs']:.0f} GB/s; " + "; ".join(
                  f"{r['pipeline']} {r['output']}: {r['achieved_gbs']:.0f} GB/s, "
                  f"{r['ember_img_s'] / r['libtorch_img_s']:.2f}x LibTorch ops" for r in n["rows"]),
              goals=lambda n, _: augment_goals(n))


@step("monitor overhead bench (cuda)", 3, 35)
def monitor_bench(c: Check):
    bench_row(c, "monitor overhead bench (cuda)",
              [c.exe("ember_bench_monitor"), "--device", "cuda", "--batch-size", "256", "--steps", "100", "--rounds",
               "5", "--precision", "bf16-mixed"], "monitor_bench.log",
              numbers=monitor_numbers,
              detail=lambda n, out: "; ".join(f"{k}: throughput cost {v['overhead']}, own time {v['own_time']}"
                                              for k, v in n.items()),
              goals=lambda n, _: monitor_goals(n))


def monitor_numbers(out):
    """{setting: {overhead, own_time}} of the 'default' and 'full' rows of the monitor bench's table."""
    rows = {}
    for line in out.splitlines():
        t = line.split()
        if t and t[0] in ("default", "full") and len(t) >= 6 and t[-1].endswith("%"):
            rows[t[0]] = {"overhead": t[-3], "own_time": t[-1]}
    return rows


@step("amp bench: GPT 12x768, block 1024, batch 16 (cuda)", 3, 75)
def amp_bench(c: Check):
    """Five modes (fp16-mixed with and without the scaler), 20 steps each side; fp32 without TF32 is
    the slow one (~0.25 s a step)."""
    js = c.work / "amp_gpu.json"

    def numbers(_):
        rows = json.loads(js.read_text())
        return {f"{r['precision']}{'' if r['scaler'] else ' no-scaler'}": {k: r.get(k) for k in (
            "ember_ms", "python_ms", "speedup_vs_fp32", "mfu", "tokens_per_second")} for r in rows}

    def detail(n, _):
        b = n.get("bf16-mixed", {})
        return (f"bf16-mixed {b.get('speedup_vs_fp32', 0):.2f}x fp32, MFU {100 * (b.get('mfu') or 0):.1f}%, "
                f"ember/python {b.get('ember_ms', 0) / max(b.get('python_ms') or 1, 1e-9):.3f}")

    bench_row(c, "amp bench: GPT 12x768, block 1024, batch 16 (cuda)",
              [c.python, ROOT / "tools" / "bench" / "amp_step.py", "--binary", c.exe("ember_bench_amp_step"),
               "--device", "cuda", "--models", "gpt", "--precisions", *PRECISIONS, "--gpt-layers", "12",
               "--gpt-embd", "768", "--gpt-heads", "12", "--gpt-block", "1024", "--batch", "16", "--reps", "1",
               "--steps", "15", "--warmup", "5", "--peak-tflops", os.environ.get("EMBER_PEAK_TFLOPS", "989"),
               "--json", js], "amp_bench.log", numbers=numbers, detail=detail, goals=lambda n, _: amp_goals(n))


def fashion_full(c: Check, precision, accs):
    v = recipe_row(c, f"fashion_mnist {precision}, default config (cuda)", "fashion_mnist",
                   [f"data.root={c.data}", "trainer.device=cuda", f"trainer.precision={precision}",
                    f"run.dir={c.runs_dir('full-' + precision)}"], f"fashion_full_{precision}.log",
                   want=accuracy_over(0.85, "after the default 8 epochs"), detail=accuracy_detail)
    if v is not None:
        accs[precision] = v["test_accuracy"]
    if len(accs) == len(PRECISIONS):
        spread = max(accs.values()) - min(accs.values())
        c.report("fashion_mnist accuracies agree across precisions (cuda)", "ok" if spread <= 0.005 else "FAIL",
                 f"spread {100 * spread:.2f} points (want <= 0.5): " + ", ".join(f"{p} {a:.4f}" for p, a in accs.items()))


# 8 epochs of 469 eager steps (~1-2 ms each) and 8 test passes: ~15 s with the start-up.
_accs = {}
for _p in PRECISIONS:
    step(f"fashion_mnist {_p}, default config (cuda)", 3, 25,
         rows=[f"fashion_mnist {_p}, default config (cuda)"] +
         (["fashion_mnist accuracies agree across precisions (cuda)"] if _p == PRECISIONS[-1] else []))(
        lambda c, p=_p: fashion_full(c, p, _accs))


@step("prune bench: ResNet-20 30/50/70% bf16 (cuda)", 3, 40)
def prune_bench(c: Check):
    bench_row(c, "prune bench: ResNet-20 30/50/70% bf16 (cuda)",
              [c.exe("ember_bench_prune"), "--device", "cuda", "--channels", "3", "--size", "32", "--blocks", "3",
               "--batch", "256", "--precision", "bf16-mixed", "--round-to", "8", "--rounds", "5", "--steps", "20"],
              "prune_bench.log", numbers=prune_numbers,
              detail=lambda n, out: ", ".join(f"{r}: MACs {v['macs_x']}, train step {v['train_x']}, inference "
                                              f"{v['infer_x']}" for r, v in n.items() if r != "0.00"))



PRUNE_ROW_RE = re.compile(r"^(?P<label>\S.*?)\s+(?P<macs>[\d.]+)M\s+(?P<macs_x>[\d.]+x)\s+\d+\s+[\d.]+x\s+"
                          r"(?P<train_ms>[\d.]+)\s+(?P<train_x>[\d.]+x) \((?P<train_spread>[^)]*)\)\s+"
                          r"(?P<infer_ms>[\d.]+)\s+(?P<infer_x>[\d.]+x) \((?P<infer_spread>[^)]*)\)\s*$")


def prune_numbers(out):
    """{entry: {macs_x, train_x, infer_x, ...}} from the prune bench's table (speed-ups over unpruned, median
    over rounds with their spread). Entries: "0.00" (dense), "0.30" (ratio 0.30), "0.30 r8" (rounded to 8),
    "latency" (the latency target; "when_pruned": its speed-up as measured while pruning), "same MACs r8"."""
    rows = {}
    for line in out.splitlines():
        m = PRUNE_ROW_RE.match(line)
        if not m:
            continue
        label = m["label"]
        if label == "dense":
            key = "0.00"
        elif label.startswith("ratio "):
            key = label[len("ratio "):]
        elif label.startswith("latency"):
            key = "latency"
        else:
            key = label
        row = {k: m[k] for k in ("macs_x", "train_x", "infer_x", "train_spread", "infer_spread")}
        if key == "latency":
            w = re.search(r"latency ([\d.]+)x(?: r(\d+))? \(([\d.]+)x when pruned\)", label)
            if w:
                row.update(goal=w[1], round_to=w[2], when_pruned=w[3])
        rows[key] = row
    return rows


@step("prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)", 3, 90)
def prune_latency(c: Check):
    """Issue 33's GPU rows: the latency table built on the H200 (bf16, batch 256) and the 1.5x target met or not,
    measured side by side with the dense model and with the model pruned by ratio to the same MACs; and what
    channel counts at multiples of 8 (tensor cores) buy: ratios 0.3/0.5 at round_to 1 against 8."""
    name = "prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_prune"), "--device", "cuda", "--channels", "3", "--size", "32", "--blocks", "3",
               "--batch", "256", "--precision", "bf16-mixed", "--ratios", "0.3,0.5", "--round-to", "1",
               "--also-round-to", "8", "--latency", "1.5", "--latency-table", c.work / "latency.json",
               "--rounds", "5", "--steps", "20"],
              "prune_latency.log", numbers=prune_numbers,
              detail=lambda n, out: "; ".join(f"{k}: MACs {v['macs_x']}, inference {v['infer_x']} ({v['infer_spread']})"
                                              for k, v in n.items() if k != "0.00"),
              goals=lambda n, _: [goal("latency target 1.5x, inference measured side by side",
                                       float(n["latency"]["infer_x"].rstrip("x")), ">=", 1.5)])


@step("head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)", 3, 60)
def heads_bench(c: Check):
    name = "head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_heads"), "--device", "cuda", "--layers", "12", "--embd", "768", "--heads", "12",
               "--block", "256", "--batch", "32", "--eval-batch", "64", "--rounds", "5", "--steps", "10"],
              "heads_bench.log", detail=lambda n, out: short(" | ".join(
                  l.strip() for l in out.splitlines() if "speed-up" in l or "tokens/s" in l), 300))


@step("char_gpt gpu.toml, 150 steps (cuda)", 3, 60)
def char_gpt(c: Check):
    """150 steps of 65,536 tokens on an 85M-weight GPT in bf16 (~0.1 s each), an evaluation, a checkpoint
    and 500 sampled tokens."""
    recipe_row(c, "char_gpt gpu.toml, 150 steps (cuda)", "char_gpt",
               ["--config", ROOT / "recipes" / "char_gpt" / "gpu.toml", f"data.path={c.text}", "trainer.max_steps=150",
                f"run.dir={c.runs_dir('char_gpt')}"], "char_gpt.log",
               want=lambda v: ("tokens_per_second" in v, "no tokens_per_second in its result line"),
               detail=lambda v: f"{v.get('tokens_per_second', 0):.0f} tokens/s, MFU {v.get('mfu', 0):.3f}, "
                                f"val_bpb {v.get('val_bpb', 0):.3f}", needs="text")


SPEED_TABLE_ROW = ("speed bench: MLP/CNN/GPT steps, Ember eager + graphs vs Python eager, fused, compile, "
                   "Lightning (cuda)")


@step(SPEED_TABLE_ROW, 3, 300)
def speed_table(c: Check):
    """The GPU speed table (docs/training.md, "Measured"): 6 cases x 6 sides x 2 reps. Each ember side is a process (~3 s
    to start), each torch.compile a fresh compile (~20 s cold per case, ~5 s from the cache): more
    than a 200 s second call has, so it runs last, or in a call of its own."""
    js = c.work / "speed_gpu.json"
    bench_row(c, SPEED_TABLE_ROW, speed_cmd(c, js, "--reps", "2", "--steps", "100", "--warmup", "20"),
              "speed_bench.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))


@step("cifar_resnet, generated data, bf16, 5 epochs (cuda)", 3, 60)
def cifar(c: Check):
    name = "cifar_resnet, generated data, bf16, 5 epochs (cuda)"
    data = c.work / "cifar"
    rc, out = c.run([c.python, ROOT / "tests" / "integration" / "make_cifar.py", data, "2000", "2000"], "cifar.log")
    if rc != 0:
        c.report(name, "FAIL", f"make_cifar.py: {first_failure(out)}")
        return
    recipe_row(c, name, "cifar_resnet", ["trainer.device=cuda", "trainer.precision=bf16-mixed", f"data.root={data}",
                                         "trainer.epochs=5", "augment.brightness=0.2", "augment.erase=0.25",
                                         f"run.dir={c.runs_dir('cifar')}"], "cifar.log",
               want=lambda v: ("test_accuracy" in v, "no test_accuracy in its result line"), detail=accuracy_detail,
               needs=None)


@step("prune_finetune 3 + 2 epochs (cuda)", 3, 60)
def prune_finetune(c: Check):
    keys = ("dense_test_accuracy", "test_accuracy", "train_step_speedup", "inference_speedup")
    recipe_row(c, "prune_finetune 3 + 2 epochs (cuda)", "prune_finetune",
               [f"data.root={c.data}", "trainer.device=cuda", "trainer.epochs=3", "finetune.epochs=2", "prune.round_to=8",
                f"run.dir={c.runs_dir('prune_finetune')}"], "prune_finetune.log",
               detail=lambda v: ", ".join(f"{k} {v[k]:.4g}" for k in keys if k in v))


@step("fashion_mnist augment.toml, with and without augmentation (cuda)", 3, 240,
      rows=["fashion_mnist augment.toml aug (cuda)", "fashion_mnist augment.toml noaug (cuda)"])
def fashion_augment(c: Check):
    for variant, extra in (("aug", []), ("noaug", ["augment.crop=none", "augment.hflip=0"])):
        recipe_row(c, f"fashion_mnist augment.toml {variant} (cuda)", "fashion_mnist",
                   ["--config", ROOT / "recipes" / "fashion_mnist" / "augment.toml", "trainer.device=cuda",
                    f"data.root={c.data}", *extra, f"run.dir={c.runs_dir('fashion-' + variant)}"],
                   f"fashion_{variant}.log", detail=accuracy_detail)


@step("DDP overlap bench, 2 ranks, Gloo (CPU cores)", 3, 90, gpu=False)
def ddp_bench(c: Check):
    bench_row(c, "DDP overlap bench, 2 ranks, Gloo (CPU cores)",
              [c.python, ROOT / "tools" / "bench" / "ddp.py", "--binary", c.exe("ember_bench_ddp"), "--rounds", "20"],
              "ddp_bench.log",
              detail=lambda n, out: short(" ".join(re.findall(
                  r'"(?:overlap_bucketed|overlap_per_param|local_backward_ms)": [-0-9.]+', out))))


# ---- main -------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                   help=f"seconds for the whole check (default {DEFAULT_BUDGET}: tiers 1 and 2 in one 9-minute command)")
    p.add_argument("--tier", type=int, action="append", choices=(1, 2, 3),
                   help="run this tier (repeatable; default: 1 and 2)")
    p.add_argument("--binaries", help="use this build tree's binaries (bin/, lib/, tests/) instead of the pack")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/ember-device-out", help="result folder ($OUT)")
    p.add_argument("--work", default="/tmp/ember-device-check", help="scratch folder (logs, runs, a build)")
    p.add_argument("--data", help="Fashion-MNIST folder (default: the pack's subset, else Debian's)")
    p.add_argument("--python", default=os.environ.get("EMBER_DEVICE_PYTHON") or sys.executable,
                   help="python with torch (default: $EMBER_DEVICE_PYTHON, else this one)")
    args = p.parse_args()
    tiers = sorted(set(args.tier or [1, 2]))

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES + ("logs.tar.gz.part",):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    c = Check(args)
    steps = sorted((s for s in STEPS if s["tier"] in tiers), key=lambda s: s["tier"])  # file order within a tier
    status = 0
    try:
        commit = ""
        if (ROOT / ".git").exists() and shutil.which("git"):
            r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            commit = r.stdout.strip()
        c.report("device check", "info", f"{datetime.datetime.now().isoformat(timespec='seconds')} on "
                 f"{os.uname().nodename}, tiers {','.join(map(str, tiers))}, budget {args.budget:.0f} s (rows "
                 f"estimated {sum(s['estimate'] for s in steps)} s + set-up ~{SETUP_ESTIMATE} s)"
                 + (f", tree {commit}" if commit else ""))
        try:
            ready = c.describe_machine() and c.find_binaries()
        except (StepTimeout, RuntimeError, OSError, ValueError) as e:
            c.report("set-up", "FAIL", short(e, 300))
            ready = False
        c.find_data()
        c.write_logs()
        for s in steps:
            c.tier = s["tier"]
            c.current = s
            if not ready:
                for r in s["rows"]:
                    c.report(r, "not run", "no binaries (see the rows above)")
                continue
            if s["gpu"] and not c.gpu:
                for r in s["rows"]:
                    c.report(r, "skip", "no CUDA device")
                continue
            if s["estimate"] > c.left():
                for r in s["rows"]:
                    c.report(r, "not run (budget)", f"needs ~{s['estimate']} s, {max(c.left(), 0):.0f} s left")
                continue
            t0 = time.monotonic()
            before = len(c.results.rows)
            try:
                s["fn"](c)
            except StepTimeout as e:
                c.report(s["rows"][0], "timeout", f"{e} (the budget ran out)", seconds=time.monotonic() - t0)
            except Interrupted:
                raise
            except Exception as e:  # a broken row must not stop the others
                c.report(s["rows"][0], "FAIL", f"{type(e).__name__}: {short(e, 300)}", seconds=time.monotonic() - t0)
            if len(c.results.rows) == before:
                c.report(s["rows"][0], "FAIL", "the step reported nothing", seconds=time.monotonic() - t0)
            c.current = None
            c.write_logs()
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
