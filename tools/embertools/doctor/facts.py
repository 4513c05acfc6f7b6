"""The doctor's facts: what this machine says (torch in a child process, the hostname, the rendezvous,
disks, memory, /dev/shm, the data's read rate, the CPU cores), each read once, when a check first asks (Probe).
A test gives them instead.
"""
import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from embertools.net import read_interfaces, resolve
from embertools.nvml import read_nvml
from .common import MIB, READ_SECONDS, ROOT


# ---------------------------------------------------------------------------
# Facts: what this machine says, read once each. A test gives them instead.
# ---------------------------------------------------------------------------

TORCH_PROBE = r"""
import json, os, sys
out = {"python": sys.executable}
try:
    import torch
except BaseException as e:  # ImportError, OSError (a missing libcudart), anything torch raises
    out["error"] = f"{type(e).__name__}: {e}"
else:
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["path"] = os.path.dirname(os.path.realpath(torch.__file__))
    try:
        v = torch.cuda.nccl.version()  # (2, 28, 9); an int (22809) in torch < 1.13
        out["nccl"] = list(v) if isinstance(v, tuple) else [v // 10000, v // 100 % 100, v % 100]
    except Exception as e:  # a CPU build has no torch._C._nccl_version
        out["nccl"] = None
        out["nccl_error"] = f"{type(e).__name__}: {e}"
    try:
        out["device_count"] = torch.cuda.device_count()
        if out["cuda"]:
            torch.cuda.init()
    except Exception as e:
        out["cuda_error"] = " ".join(str(e).split())[:300]
print(json.dumps(out))
"""


def read_torch(python=None, env=None, timeout=180):
    """{"python", "version", "cuda", "path", "nccl", "device_count", "cuda_error"} or {"python", "error"}."""
    python = python or sys.executable
    try:
        p = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"python": python, "error": f"{type(e).__name__}: {e}"}
    lines = p.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " ".join(p.stderr.strip().splitlines()[-2:])[:300]
        return {"python": python, "error": f"importing torch ended with exit status {p.returncode}: {tail}"}


def read_hostname():
    """gethostname() and socket.getfqdn() (torchrun's default address of a node), each resolved."""
    name = socket.gethostname()
    fqdn = socket.getfqdn()
    return {"hostname": name, "hostname_addresses": resolve(name), "fqdn": fqdn, "fqdn_addresses": resolve(fqdn)}


def tcp_connect(address, port, timeout):
    """"open", "refused", "timeout", or the error's text."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
            return "open"
        except ConnectionRefusedError:
            return "refused"
        except (socket.timeout, TimeoutError):
            return "timeout"
        except OSError as e:
            return e.strerror or str(e)


def read_rendezvous(opts):
    """{"host", "port", "addresses" or "error", "connect": {address: result}}: every address tried in
    getaddrinfo's order until one accepts (as a TCP client would)."""
    host, port = opts.rdzv
    out = {"host": host, "port": port}
    addresses = resolve(host)
    if isinstance(addresses, dict):
        out["error"] = addresses["error"]
        return out
    out["addresses"], out["connect"] = addresses, {}
    for a in addresses:
        out["connect"][a] = tcp_connect(a, port, opts.timeout)
        if out["connect"][a] == "open":
            break
    return out


def _mount_of(path):
    """(mount point, fstype, source, "major:minor") of the mount holding path (/proc/self/mountinfo)."""
    best = ("/", None, None, None)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    real = os.path.realpath(path)
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 2:
            continue
        point = f[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, r[0], r[1], f[2])
    return best


def _rotational(dev):
    """/sys/block/<disk>/queue/rotational of the block device "major:minor" (a partition's disk), or None."""
    if not dev or dev.startswith("0:"):
        return None, None  # no block device: tmpfs, overlay, NFS, ...
    sysdir = Path("/sys/dev/block") / dev
    try:
        real = sysdir.resolve()
        disk = real.parent if (real / "partition").exists() else real
        return int((disk / "queue" / "rotational").read_text().strip()), disk.name
    except (OSError, ValueError):
        return None, None


def read_disk(path):
    """Free space and the disk under path (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    usage = shutil.disk_usage(p)
    point, fstype, source, dev = _mount_of(p)
    rotational, disk = _rotational(dev)
    return {"path": str(path), "existing": str(p), "free": usage.free, "total": usage.total, "mount": point,
            "fstype": fstype, "source": source, "disk": disk, "rotational": rotational}


def read_build(build_dir):
    """What Ember's build folder was configured with (CMakeCache.txt): {"dir", "torch_dir" (the LibTorch it
    links), "cuda" (that LibTorch's CUDA, CUDA_VERSION), "ember_cuda"}; {"dir", "missing": True} before a build."""
    cache = Path(build_dir) / "CMakeCache.txt"
    out = {"dir": str(build_dir)}
    try:
        text = cache.read_text(errors="replace")
    except OSError:
        out["missing"] = True
        return out
    for line in text.splitlines():
        key, _, value = line.partition("=")
        name = key.split(":")[0]
        if name in ("Torch_DIR", "CUDA_VERSION", "EMBER_CUDA"):
            out[{"Torch_DIR": "torch_dir", "CUDA_VERSION": "cuda", "EMBER_CUDA": "ember_cuda"}[name]] = value
    return out


def read_meminfo():
    """/proc/meminfo's MemTotal and MemAvailable, bytes."""
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(value.split()[0]) * 1024  # kB
    except OSError as e:
        out["error"] = str(e)
    return out


def read_cpus():
    """{"count": os.cpu_count(), "affinity": the CPUs this process may run on (sched_getaffinity: a
    container's or taskset's cpuset), or None where the platform has no such call}."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"count": os.cpu_count(), "affinity": affinity}


def read_shm():
    try:
        return {"total": shutil.disk_usage("/dev/shm").total}
    except OSError as e:
        return {"error": f"/dev/shm: {e.strerror}"}


def open_regular(path):
    """An fd open for reading on `path` (symlinks followed) when it is a regular file, else None: a FIFO,
    a socket or a device (/dev/zero) is not opened for good. O_NONBLOCK: opening a FIFO with no
    writer returns at once instead of waiting for one (it has no effect on a regular file's reads)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def read_data(path, max_bytes, max_seconds=READ_SECONDS):
    """Read the regular files under path (sorted walk) until max_bytes or max_seconds: {"bytes", "seconds",
    "files", "fstype", "skipped", ...} or {"error"}. Each file's cached pages are dropped first
    (posix_fadvise DONTNEED: no privilege needed; pages a process has dirty, or a file system that ignores
    it, stay cached). A FIFO, socket or device (or a symlink to one) is skipped: it is no dataset file,
    and reading it would wait forever (a FIFO) or measure no disk (/dev/zero)."""
    root = Path(path)
    if not root.is_dir():
        return {"path": str(path), "error": "not a directory" if root.exists() else "does not exist"}
    point, fstype, source, _ = _mount_of(root)
    out = {"path": str(path), "fstype": fstype, "mount": point, "source": source, "bytes": 0, "files": 0,
           "seconds": 0.0, "unreadable": 0, "skipped": 0}
    block = bytearray(4 * MIB)
    start = time.perf_counter()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            if out["bytes"] >= max_bytes or time.perf_counter() - start > max_seconds:
                break
            try:
                fd = open_regular(os.path.join(dirpath, f))
            except OSError:
                out["unreadable"] += 1
                continue
            if fd is None:
                out["skipped"] += 1
                continue
            try:
                with contextlib.suppress(OSError, AttributeError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                with open(fd, "rb", buffering=0, closefd=False) as fh:
                    while out["bytes"] < max_bytes:
                        n = fh.readinto(memoryview(block)[:min(len(block), max_bytes - out["bytes"])])
                        if not n:
                            break
                        out["bytes"] += n
                out["files"] += 1
            except OSError:
                out["unreadable"] += 1
            finally:
                os.close(fd)
    out["seconds"] = time.perf_counter() - start
    if out["files"] == 0:
        why = [f"{out['unreadable']} unreadable"] if out["unreadable"] else []
        why += [f"{out['skipped']} not regular files"] if out["skipped"] else []
        out["error"] = "no readable regular file in it" + (f" ({', '.join(why)})" if why else "")
    return out


READERS = {
    "torch": lambda o: read_torch(),
    "build": lambda o: read_build(o.env.get("EMBER_BUILD_DIR") or ROOT / "build"),
    "nvml": lambda o: read_nvml(),
    "interfaces": lambda o: read_interfaces(),
    "hostname": lambda o: read_hostname(),
    "rendezvous": read_rendezvous,
    "disk": lambda o: read_disk(o.disk),
    "meminfo": lambda o: read_meminfo(),
    "shm": lambda o: read_shm(),
    "cpus": lambda o: read_cpus(),
    "data": lambda o: read_data(o.data, o.read_mib * MIB),
}


class Probe:
    """The facts, each read from the machine the first time a check asks (READERS). A test gives
    them instead: Probe(opts, read=False, torch={...}) raises KeyError for a fact not given."""

    def __init__(self, opts, read=True, **given):
        self.opts, self.read, self.facts = opts, read, dict(given)

    def __getitem__(self, key):
        if key not in self.facts:
            if not self.read:
                raise KeyError(f"fact '{key}' not given")
            try:
                self.facts[key] = READERS[key](self.opts)
            except Exception as e:  # a reader's surprise is a finding, never a traceback
                self.facts[key] = {"error": f"reading {key}: {type(e).__name__}: {e}"}
        return self.facts[key]
