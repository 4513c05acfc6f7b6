"""The GPU check's frame: its paths, budgets and binaries, the results it writes (device_check.txt,
.jsonl, logs), and Check, which runs one command under a row's time cap.
"""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

from .jpeg_set import PACKED as JPEG_PACKED

ROOT = Path(__file__).resolve().parents[3]  # the clone: tools/embertools/device_check/ is three below it
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
RECIPES = ("fashion_mnist", "char_gpt", "cifar_resnet", "prune_finetune", "image_folder", "gpt2")
BENCHES = ("ember_bench_amp_step", "ember_bench_augment", "ember_bench_monitor", "ember_bench_prune",
           "ember_bench_heads", "ember_bench_ddp", "ember_bench_speed", "ember_bench_sharding",
           "ember_bench_activation_checkpoint", "ember_bench_data")
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
        self.jpeg = None  # the data rows' JPEG shards (train.json, val.json: jpeg_set.py)
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
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc")
                                        else "")
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
        jpeg = PACK / JPEG_PACKED
        if (jpeg / "train.json").is_file() and (jpeg / "val.json").is_file():
            self.jpeg = jpeg

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


def first_failure(out):
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if "Failure" in l or "error:" in l.lower() or "Error" in l:
            return short(" ".join(lines[i:i + 3]))
    return short(lines[-1] if lines else "no output")


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


def exit_text(rc):
    """'exit 3', or 'killed by SIGSEGV' for a process a signal ended."""
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"
