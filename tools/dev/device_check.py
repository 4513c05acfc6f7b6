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
          benches (augmentation bandwidth, monitoring, mixed precision,
          pruning, the whole speed table, weak scaling), accuracies that take
          minutes, char_gpt's GPU config, bs-find's out-of-memory search; one
          command of it runs the first ~500 s of its 1250.
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
import glob
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / ".device"
RESULT_FILES = ("device_check.txt", "device_check.jsonl", "logs.tar.gz")
DEFAULT_BUDGET = 520  # call 1 inside a 540 s command, with time for start-up and the tarball
CALL1_WORK = 420  # call 1's row estimates + the set-up on one GPU: a 100 s margin in its budget
CALL2_BUDGET = 200  # call 2 inside a 240 s command (--call 2 alone defaults to it)
CAP_FACTOR = 2  # a row is stopped at CAP_FACTOR x its estimate
# Seconds the set-up takes from the budget before the first row (torch imported to describe the
# GPU, nvidia-smi, ldd on each executable, the test binary's listing): each call's row estimates
# plus this must stay within its budget (device_check_test.py checks it).
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
    """A command ran past the time its row's cap or the budget left it."""


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

    def add(self, name, status, detail="", numbers=None, seconds=0.0, call=0, block=None, gpu=False):
        row = {"name": name, "call": call, "gpu": gpu, "status": status, "detail": detail, "numbers": numbers or {},
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
        self.call = 0
        self.row_deadline = None  # the running row's cap, as a time.monotonic() value
        self.row_cap = None  # (cap, estimate) of the running row, for the timeout's text
        self.env = dict(os.environ)
        self.bins = None  # the binaries' folder (build-tree layout)
        self.gpu = False
        self.info = {}
        self.data = None  # Fashion-MNIST folder
        self.text = None  # char_gpt's corpus
        self.current = None  # the step running now
        self.manifest = {}
        self.load_problem = None  # unloadable()'s answer
        self.gtest_listing = None  # every case ember_tests lists, in its order (gtest_names())

    # ---- time and processes ------------------------------------------------

    def left(self):
        return self.deadline - time.monotonic()

    def gpus(self):
        """GPUs torch sees here (0 without a GPU)."""
        return int(self.info.get("gpus") or 0) if self.gpu else 0

    def report(self, name, status, detail="", numbers=None, seconds=0.0, block=None, gpu=None):
        """One row; `gpu` (whether it needs a GPU) defaults to its step's."""
        if gpu is None:
            gpu = bool(self.current and self.current["gpu"])
        self.results.add(name, status, detail, numbers, seconds, self.call, block, gpu)

    def limit(self, limit=None):
        """(seconds, why) a command may run now: `limit`, the row's cap and the budget, the least."""
        options = [(self.left(), "the budget ran out")]
        if self.row_deadline is not None:
            cap, estimate = self.row_cap
            options.append((self.row_deadline - time.monotonic(),
                            f"the row's cap of {cap:.0f} s ({CAP_FACTOR} x its {estimate:.0f} s estimate)"))
        if limit is not None:
            options.append((limit, f"its own limit of {limit:.0f} s"))
        return min(options, key=lambda o: o[0])

    def run(self, cmd, log, limit=None, env=None, cwd=None, budgeted=True):
        """Runs cmd (output to logs/<log>), stopped at `limit` seconds or, when
        `budgeted` (rows; not the set-up), at the row's cap or the budget, the
        sooner (StepTimeout says which). Returns (exit status, output)."""
        return self.run_all([(cmd, env)], log, limit, cwd, budgeted)[0]

    def run_all(self, commands, log, limit=None, cwd=None, budgeted=True):
        """Runs [(cmd, env)] side by side (the ranks of one job; output to logs/<log>.<i>, or logs/<log>
        for one), stopped as run() says; when one is stopped, all are. Returns [(exit status, output)]."""
        limit, why = self.limit(limit) if budgeted else (limit, f"its own limit of {limit:.0f} s")
        if limit <= 0:
            raise StepTimeout(f"no time left: {why}")
        paths = [self.logs / (log if len(commands) == 1 else f"{log}.{i}") for i in range(len(commands))]
        files, procs = [], []
        try:
            for (cmd, env), path in zip(commands, paths):
                path.parent.mkdir(parents=True, exist_ok=True)
                f = open(path, "ab")
                files.append(f)
                f.write(f"$ {' '.join(map(str, cmd))}\n".encode())
                f.flush()
                procs.append(subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                              env=env or self.env, cwd=cwd, start_new_session=True))
            end = time.monotonic() + limit
            for proc in procs:
                try:
                    proc.wait(timeout=max(end - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    for p, f in zip(procs, files):
                        if p.poll() is None:
                            self.kill(p)
                            f.write(f"\n[device-check] stopped after {limit:.0f} s: {why}\n".encode())
                    raise StepTimeout(f"stopped after {limit:.0f} s: {why}")
        except BaseException:
            for p in procs:
                self.kill(p)
            raise
        finally:
            for f in files:
                f.close()
        return [(p.returncode, path.read_text(errors="replace")) for p, path in zip(procs, paths)]

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
                if rc == 0:
                    i["driver"] = out.splitlines()[-1].strip()
                    driver = f", driver {i['driver']}"
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
        self.call = 0
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

    def gtest_names(self):
        """Every case ember_tests lists (Suite.Test, Prefix/Suite.Test/Param), in its order; listed once."""
        if self.gtest_listing is None:
            rc, out = self.run([self.exe("ember_tests"), "--gtest_list_tests"], "gtest_list.log", 120, budgeted=False)
            if rc != 0:
                raise RuntimeError(f"ember_tests --gtest_list_tests: exit {rc}: {first_failure(out)}")
            self.gtest_listing = gtest_listing(out)
        return self.gtest_listing

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


# ---- GoogleTest cases by filter ------------------------------------------------------

def gtest_listing(out):
    """The case names of `--gtest_list_tests` output, in order: "Suite.Test", "Prefix/Suite.Test/0" (a
    parameterised case; its '# GetParam() = ...' comment dropped)."""
    names, suite = [], None
    for line in out.splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text or line.startswith(("$ ", "Note:")):
            continue
        if not line.startswith(" ") and text.endswith("."):
            suite = text[:-1]
        elif line.startswith("  ") and suite:
            names.append(f"{suite}.{text.strip()}")
    return names


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


def exit_text(rc):
    """'exit 3', or 'killed by SIGSEGV' for a process a signal ended."""
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


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
              f"{f('backward_ms', '%.2f')} opt {f('optimizer_ms', '%.2f')}), mem {f('gpu_mem_allocated_mib', '%.0f')} MiB "
              f"peak {f('gpu_mem_peak_mib', '%.0f')}, util {f('gpu_util', '%.0f')}%, {f('gpu_power_w', '%.0f')} W, "
              f"{f('gpu_temp_c', '%.0f')} C, sm {f('gpu_sm_clock_mhz', '%.0f')} MHz, mfu {f('mfu', '%.4f')}")
    c.report("telemetry (fashion bf16, cuda)", "FAIL" if missing else "ok",
             detail + (f"; null: {', '.join(missing)}" if missing else "")
             + ("; a MIG instance: NVML gives no utilization" if mig else ""), numbers={k: r.get(k) for k in want})


for _p in PRECISIONS:
    step(f"fashion_mnist {_p}, 1 epoch (cuda)",
         rows=[f"fashion_mnist {_p}, 1 epoch (cuda)"] + (["telemetry (fashion bf16, cuda)"] if _p == "bf16-mixed" else []))(
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
             f"exit {rc}: {said[:300]}" if ok else f"exit {rc}, want 1 and an explained error: {said[:300] or first_failure(out)}",
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
    env = dict(c.env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29517")
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(c: Check, rank, world, port):
    """A rank's environment as torchrun sets it, on this machine."""
    return dict(c.env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


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
                           rank_env(c, r, world, port)) for r in range(world)], f"{tag}.log")

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


# ---- benches -----------------------------------------------------------------------
# Rows of every call alike: PLAN gives their order.

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


# ---- the GPU findings' tools and the speed goal ------------------------------------

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


@step(MEMORY_ROW)
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


SHARD_PLAN_ROW = "wave 3: plan vs bs-find, one rank of 8: DDP, ZeRO-3, ZeRO-3 + checkpointing, char_gpt bf16 (cuda)"
# (dist.sharding, activation checkpointing) pairs the row measures: DDP, ZeRO-3, ZeRO-3 + full; ZeRO-1
# and ZeRO-2 lie between DDP and ZeRO-3 in the planner's arithmetic (tests/tools check it there),
# each costs another bs-find process on the GPU (~4 s).
SHARD_PLAN_CASES = (("none", "none"), ("parameters", "none"), ("parameters", "full"))


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


@step(SHARD_PLAN_ROW)
def shard_plan_gpu(c: Check):
    """The planner's memory per GPU for a run on 8 ranks (DDP, ZeRO-3, and ZeRO-3 with full activation
    checkpointing: SHARD_PLAN_CASES), planned from a CPU measurement as a user would, against bs-find's measured
    peak of one rank of 8 on this GPU (bs_find.world_size=8: one process, collectives that send nothing).
    Goal: each within 25%. The CPU measurement probes with plan.steps=2, not 3: the same peaks (compared
    on the development machine, 2026-12-06), a quarter less of its CPU time (69 CPU-seconds there)."""
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
                           "plan.precisions=bf16-mixed", "plan.timed_steps=1", "plan.steps=2", *common])
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


AC_ROW = "wave 3: activation checkpointing bench, memory and step time, CharGpt and ResNet-20 (cuda)"


@step(AC_ROW)
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


@step(SCALING_ROW)
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


@step(LR_FIND_ROW)
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


@step(SPEED_GOAL_ROW)
def speed_goal(c: Check):
    """The GPU speed goal (tools/README.md), on the one case it names: FashionNet at batch 128, Ember with
    CUDA graphs against Python eager (fused=True beside it) and torch.compile reduce-overhead; 3
    interleaved reps, each ember-graph process started anew (~3 s), torch.compile cold once (~20-40 s)
    then from Inductor's cache. Ember eager, which the goal does not name, is in the speed table (call 3)."""
    js = c.work / "speed_goal.json"
    bench_row(c, SPEED_GOAL_ROW,
              speed_cmd(c, js, "--models", "cnn", "--batches", "128", "--sides", "ember-graph", "python",
                        "python-fused", "compile", "--reps", "3", "--steps", "100", "--warmup", "20"),
              "speed_goal.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))


# ---- the long rows: benches, accuracies -----------------------------------------------

SPEEDRUN_ROW = "fashion_mnist speedrun_gpu.toml: 94% in under 5 s of training, 5 seeds (cuda)"


@step(SPEEDRUN_ROW)
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


@step("augment bench: kernel vs copy bandwidth (cuda)")
def augment_bench(c: Check):
    js = c.work / "augment_gpu.json"
    bench_row(c, "augment bench: kernel vs copy bandwidth (cuda)",
              [c.exe("ember_bench_augment"), "--device", "cuda", "--json", js], "augment_bench.log",
              numbers=lambda _: json.loads(js.read_text()),
              detail=lambda n, _: f"copy {n['copy_gbs']:.0f} GB/s; " + "; ".join(
                  f"{r['pipeline']} {r['output']}: {r['achieved_gbs']:.0f} GB/s, "
                  f"{r['ember_img_s'] / r['libtorch_img_s']:.2f}x LibTorch ops" for r in n["rows"]),
              goals=lambda n, _: augment_goals(n))


@step("monitor overhead bench (cuda)")
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


@step("amp bench: GPT 12x768, block 1024, batch 16 (cuda)")
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
    step(f"fashion_mnist {_p}, default config (cuda)",
         rows=[f"fashion_mnist {_p}, default config (cuda)"] +
         (["fashion_mnist accuracies agree across precisions (cuda)"] if _p == PRECISIONS[-1] else []))(
        lambda c, p=_p: fashion_full(c, p, _accs))


@step("prune bench: ResNet-20 30/50/70% bf16 (cuda)")
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


@step("prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)")
def prune_latency(c: Check):
    """Issue 33's GPU rows: the latency table built on the H200 (bf16, batch 256) and the 1.5x target met or not,
    measured side by side with the dense model and with the model pruned by ratio to the same MACs; and what
    channel counts at multiples of 8 (tensor cores) buy: ratios 0.3/0.5 at round_to 1 against 8. Three rounds
    (the speed-ups are medians over rounds with their [min, max]): call 2 has ~60 s for it."""
    name = "prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_prune"), "--device", "cuda", "--channels", "3", "--size", "32", "--blocks", "3",
               "--batch", "256", "--precision", "bf16-mixed", "--ratios", "0.3,0.5", "--round-to", "1",
               "--also-round-to", "8", "--latency", "1.5", "--latency-table", c.work / "latency.json",
               "--rounds", "3", "--steps", "20"],
              "prune_latency.log", numbers=prune_numbers,
              detail=lambda n, out: "; ".join(f"{k}: MACs {v['macs_x']}, inference {v['infer_x']} ({v['infer_spread']})"
                                              for k, v in n.items() if k != "0.00"),
              goals=lambda n, _: [goal("latency target 1.5x, inference measured side by side",
                                       float(n["latency"]["infer_x"].rstrip("x")), ">=", 1.5)])


@step("head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)")
def heads_bench(c: Check):
    name = "head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_heads"), "--device", "cuda", "--layers", "12", "--embd", "768", "--heads", "12",
               "--block", "256", "--batch", "32", "--eval-batch", "64", "--rounds", "3", "--steps", "10"],
              "heads_bench.log", detail=lambda n, out: short(" | ".join(
                  l.strip() for l in out.splitlines() if "speed-up" in l or "tokens/s" in l), 300))


@step("char_gpt gpu.toml, 150 steps (cuda)")
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


@step(SPEED_TABLE_ROW)
def speed_table(c: Check):
    """The GPU speed table (docs/training.md, "Measured"): 6 cases x 6 sides x 2 reps. Each ember side is a process (~3 s
    to start), each torch.compile a fresh compile (~20 s cold per case, ~5 s from the cache): more
    than a 200 s second call has, so it runs last, or in a call of its own."""
    js = c.work / "speed_gpu.json"
    bench_row(c, SPEED_TABLE_ROW, speed_cmd(c, js, "--reps", "2", "--steps", "100", "--warmup", "20"),
              "speed_bench.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))


@step("cifar_resnet, generated data, bf16, 5 epochs (cuda)")
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


@step("prune_finetune 3 + 2 epochs (cuda)")
def prune_finetune(c: Check):
    keys = ("dense_test_accuracy", "test_accuracy", "train_step_speedup", "inference_speedup")
    recipe_row(c, "prune_finetune 3 + 2 epochs (cuda)", "prune_finetune",
               [f"data.root={c.data}", "trainer.device=cuda", "trainer.epochs=3", "finetune.epochs=2", "prune.round_to=8",
                f"run.dir={c.runs_dir('prune_finetune')}"], "prune_finetune.log",
               detail=lambda v: ", ".join(f"{k} {v[k]:.4g}" for k in keys if k in v))


@step("fashion_mnist augment.toml, with and without augmentation (cuda)",
      rows=["fashion_mnist augment.toml aug (cuda)", "fashion_mnist augment.toml noaug (cuda)"])
def fashion_augment(c: Check):
    for variant, extra in (("aug", []), ("noaug", ["augment.crop=none", "augment.hflip=0"])):
        recipe_row(c, f"fashion_mnist augment.toml {variant} (cuda)", "fashion_mnist",
                   ["--config", ROOT / "recipes" / "fashion_mnist" / "augment.toml", "trainer.device=cuda",
                    f"data.root={c.data}", *extra, f"run.dir={c.runs_dir('fashion-' + variant)}"],
                   f"fashion_{variant}.log", detail=accuracy_detail)


@step("DDP overlap bench, 2 ranks, Gloo (CPU cores)", gpu=False)
def ddp_bench(c: Check):
    bench_row(c, "DDP overlap bench, 2 ranks, Gloo (CPU cores)",
              [c.python, ROOT / "tools" / "bench" / "ddp.py", "--binary", c.exe("ember_bench_ddp"), "--rounds", "20"],
              "ddp_bench.log",
              detail=lambda n, out: short(" ".join(re.findall(
                  r'"(?:overlap_bucketed|overlap_per_param|local_backward_ms)": [-0-9.]+', out))))


# ---- the plan ---------------------------------------------------------------------------
# Every step once: (call, step, estimate in seconds on one H100/H200 with 16 cores, basis). None of
# these was measured on a GPU yet: calibrate them from a run's device_check.jsonl (`seconds`). Common
# costs: a LibTorch process that starts CUDA ~3 s (libtorch_cuda, the context, cuBLAS/cuDNN handles);
# python importing torch and starting CUDA ~4 s; NCCL's start ~1 s more. "Here" numbers are the CPU
# part timed on the 2-core development machine in CPU mode (EMBER_DEVICE_ALLOW_CPU=1), shared with
# other builds at the time (2026-12-06): wall times there run high, so CPU-seconds are given where
# they weigh. Each row is
# capped at CAP_FACTOR x its estimate. Call 1 runs in this order; the wave-3 rows and the speed goal
# come first so that an overrun elsewhere cannot cost them.
PLAN = [
    (1, "binaries load (every library found)", 4, "ldd on 17 executables and the listing: in the set-up with the "
                                                  "pack, in this row with --binaries or a build (3.1-5.4 s here)"),
    (1, "kernels, emulated launches (CPU)", 5, "the *Emulated cases, CPU only: 3.1-5.2 s here"),
    (1, DOCTOR_ROW, 8, "stdlib; torch imported in a child (~4 s), NVML through ctypes: 3.5-10.5 s here "
                       "(--cpu-only)"),
    (1, WAVE3_SHARDING_ROW, 12, "one gtest process (~3 s) over small models on a 2-rank replica group: no NCCL "
                                "(2.1-2.7 s here to list and skip)"),
    (1, WAVE3_AC_ROW, 8, "one gtest process (~3 s), 2-4 cases of a small CharGpt, a graph capture each"),
    (1, SHARDING_ROW, 20, "3 ember_ddp_worker processes (~4 s each with NCCL's start), 21 steps of BlockNet; "
                          "python compares the weights (~4 s)"),
    (1, SHARD_PLAN_ROW, 30, "char_gpt --measure on the CPU (6x256, batch 16, bf16: 69 CPU-seconds here, ~8 s on 16 "
                            "cores if it scales), plan.py, 3 bs-find processes on the GPU (~4 s each)"),
    (1, AC_ROW, 12, "one process (~3 s): CharGpt 6x256 and ResNet-20, 4 modes x 7 steps of a few ms"),
    (1, SPEED_GOAL_ROW, 65, "3 ember-graph processes (~4 s each); one python: eager and fused 3 x 120 steps "
                            "(~1 s), torch.compile reduce-overhead cold once (~30-40 s) then from cache (~5 s)"),
    (1, GPU_CASES_ROW, 45, "one gtest process, ~30 cases: batch-size finder's real OOM over the whole card, "
                           "CUDA-graph captures, the operator harness (many small cases)"),
    (1, "compute-sanitizer memcheck (augment, count_correct)", 40,
     "the two kernels' cases under memcheck (10-100x slower kernels; LibTorch's start instrumented); seconds "
     "on gVisor, which refuses it"),
    (1, "augment operators from Python (CUDA)", 10, "python with torch (~4 s), libember loaded, a few ops"),
    (1, "fashion_mnist fp32, 1 epoch (cuda)", 8, "~3 s start, 9000 images read (~1 s), 70 steps and a test pass"),
    (1, "fashion_mnist tf32, 1 epoch (cuda)", 8, "as fp32"),
    (1, "fashion_mnist bf16-mixed, 1 epoch (cuda)", 8, "as fp32; the telemetry row reads its metrics.jsonl"),
    (1, "fashion_mnist fp16-mixed, 1 epoch (cuda)", 8, "as fp32, with the GradScaler"),
    (1, "profiler trace, 3 steps (cuda)", 8, "as a 1-epoch run on 2000 images, Kineto's trace written"),
    (1, "GPU out of memory: caught, explained, run folder intact (cuda)", 8,
     "~3 s start, the data read, the first allocation fails"),
    (1, "DDP on NCCL, 1 rank (cuda)", 8, "one ember_ddp_worker (~4 s with NCCL), 2 epochs of 256 samples"),
    (1, "fused optimizers: GradScaler parity with torch fused=True, no host sync (cuda)", 25,
     "python with torch (~4 s); 4 scenarios, each an ember process (~3 s) and 200-2100 torch steps"),
    (1, MEMORY_ROW, 20, "2 --measure processes (~3 s start, probes at 8, 32 and 128, 30 timed steps)"),
    (1, LR_FIND_ROW, 10, "~3 s start, the resident dataset, 40 steps (a capture, replays)"),
    (1, PLAN_ROW, 25, "--measure on the CPU (bf16 FashionNet, 30 steps at 128: 35 CPU-seconds here, ~5 s on 16 "
                      "cores), --measure on the GPU (~8 s), plan.py"),
    (1, SHARDING_GPUS_ROW, 30, "several GPUs only: 4 launches of 2 workers (~4 s each), the comparison (~4 s)"),
    (1, SYNC_BN_GPUS_ROW, 25, "several GPUs only: torchrun's start (~5 s), 2 ranks x (start, 1 + 1 epochs "
                              "of 1000 images, pruning)"),
    (2, "compute-sanitizer racecheck (augment, count_correct)", 50, "as memcheck, racecheck slower on shared memory"),
    (2, "prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)", 60,
     "the latency table timed on the GPU, then 3 rounds x 20 steps of ~7 models at batch 256"),
    (2, "head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)", 35,
     "85M-weight GPT in fp32: 3 rounds x 10 steps (~80 ms each) for 2 models, evaluation forwards"),
    (2, "GradScaler parity with torch.amp.GradScaler (cuda)", 25, "as the fused parity row"),
    (3, BS_FIND_ROW, 15, "~3 s start, ~10 batch sizes on a 2 GiB cap (the gtest case recovers a real OOM "
                         "in call 1)"),
    (3, SPEEDRUN_ROW, 90, "5 seeds x ~10 s when the goal is met (< 5 s of training each)"),
    (3, SCALING_ROW, 40, "1 rank on one GPU: 3 repeats x ~5 s; about 4x that with 8 GPUs"),
    (3, "augment bench: kernel vs copy bandwidth (cuda)", 30, "one process, 224 px pipelines, copy bandwidth"),
    (3, "monitor overhead bench (cuda)", 35, "5 rounds x 3 settings x 100 steps at batch 256"),
    (3, "amp bench: GPT 12x768, block 1024, batch 16 (cuda)", 75, "5 modes x 20 steps, fp32 ~0.25 s a step"),
    (3, "prune bench: ResNet-20 30/50/70% bf16 (cuda)", 40, "5 rounds x 20 steps of 4 models"),
    (3, "fashion_mnist fp32, default config (cuda)", 25, "8 epochs of 469 eager steps, 8 test passes"),
    (3, "fashion_mnist tf32, default config (cuda)", 25, "as fp32"),
    (3, "fashion_mnist bf16-mixed, default config (cuda)", 25, "as fp32"),
    (3, "fashion_mnist fp16-mixed, default config (cuda)", 25, "as fp32; the precisions' agreement row after it"),
    (3, "char_gpt gpu.toml, 150 steps (cuda)", 60, "150 steps of 65,536 tokens on 85M weights (~0.1 s each)"),
    (3, "cifar_resnet, generated data, bf16, 5 epochs (cuda)", 60, "2000 generated images, 5 epochs"),
    (3, "prune_finetune 3 + 2 epochs (cuda)", 60, "3 dense epochs, pruning, 2 fine-tuning epochs"),
    (3, "fashion_mnist augment.toml, with and without augmentation (cuda)", 240, "2 full trainings"),
    (3, SPEED_TABLE_ROW, 300, "6 cases x 6 sides x 2 reps, a compile per case: a call of its own"),
    (3, "DDP overlap bench, 2 ranks, Gloo (CPU cores)", 90, "CPU only: 20 rounds of 2-rank backward (83 s here)"),
]
CALLS = {1: "the first command on a fresh lease (540 s, budget 520)",
         2: "a second command at once after call 1 when 4 minutes of the lease are left (240 s, --budget 200)",
         3: "later leases: the long rows, most important first (540 s each, budget 520)"}


def planned_steps(calls=(1, 2, 3)):
    """The steps of `calls` in the plan's order, each with its call, estimate, cap and basis."""
    out = []
    for call, name, estimate, basis in PLAN:
        if call in calls:
            out.append(dict(STEPS[name], call=call, estimate=estimate, cap=CAP_FACTOR * estimate, basis=basis))
    return out


def plan_problems():
    """What is wrong with PLAN against the steps: a step planned twice or never, an unknown name, a row
    without a basis. [] when it is whole."""
    names = [p[1] for p in PLAN]
    problems = [f"planned twice: {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"not a step: {n}" for n in names if n not in STEPS]
    problems += [f"not planned: {n}" for n in STEPS if n not in names]
    problems += [f"no basis: {p[1]}" for p in PLAN if not p[3].strip() or p[2] <= 0]
    return problems


def plan_seconds(call, gpus=1):
    """Call `call`'s estimated seconds on a machine with `gpus` GPUs: the set-up and the rows that run
    there (a row that needs more GPUs is skipped at once)."""
    return SETUP_ESTIMATE + sum(s["estimate"] for s in planned_steps((call,)) if s["gpus"] <= max(gpus, 1))


def plan_table():
    """The plan as text: call, estimate, cap, what a row needs, name, basis."""
    lines = []
    for call in sorted(CALLS):
        lines.append(f"call {call}: {CALLS[call]}; estimated {plan_seconds(call)} s on one GPU "
                     f"(set-up {SETUP_ESTIMATE} s included)")
        for s in planned_steps((call,)):
            needs = f"needs {s['gpus']} GPUs" if s["gpus"] > 1 else ("GPU" if s["gpu"] else "CPU too")
            lines.append(f"  {s['estimate']:4d} s  cap {s['cap']:4d} s  {needs:<13} {s['name']}")
            lines.append(f"{'':34}{s['basis']}")
    return "\n".join(lines)


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
