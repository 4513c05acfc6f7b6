#!/usr/bin/env python3
"""A preflight of this node for a training run: run it on each node before the hours go into training.

    tools/ember doctor [--cpu-only] [--nnodes N] [--nproc N] [--rdzv HOST:PORT]
                       [--data DIR] [--disk DIR] [--ram-gib G] [--disk-gib G] [--data-mbs R]
                       [--plan PLAN.json] [--only CHECK ...] [--json]
    python3 tools/doctor.py --nnodes 2 --nproc 8 --rdzv 10.0.0.8:29400 --data /data/imagenet

Each check prints one line, `STATUS  CHECK  DETAIL (what to do)`, STATUS one of
ok, warning, failure, skipped. Exit status: 0 when nothing failed (warnings
alone: 0), 1 when a check failed, 2 a bad command line (or an unreadable
--plan file).

The facts are read from the machine first (each once, only those the checks
asked for need), then judged: the readers (read_*) and the checks (check_*)
are separate, so the tests give each check made-up facts (tests/tools/doctor_test.py).
Nothing is installed, nothing privileged is done; standard library only, torch
is imported in a child process (sys.executable), so a torch that does not
import, or crashes, is a finding and not a crash of the doctor.

Checks (--only takes these names):
  torch        torch imports; its version; the CUDA it was built for (a CPU
               build is a failure unless --cpu-only); whether Ember's build
               (EMBER_BUILD_DIR, default build/: CMakeCache.txt's Torch_DIR)
               links this torch's LibTorch (a warning when it links another).
  driver       the NVIDIA driver (NVML, libnvidia-ml.so.1) and the CUDA version it
               supports against torch's (the build's when torch does not import):
               rule in cuda_compatibility().
  gpus         GPUs the driver sees (name, memory, memory already in use) and
               how many torch sees (CUDA_VISIBLE_DEVICES); --nproc N needs N.
  topology     NVLink between every pair of GPUs (NVML's P2P status for NVLink,
               else the PCIe path: PIX, PXB, PHB, NODE, SYS as in `nvidia-smi topo -m`).
  nccl         NCCL's version in torch; NCCL_*_DISABLE settings that slow it.
  shm          /dev/shm's size (NCCL's shared-memory transport; a container's
               default of 64 MiB is too small).
  nccl-socket  the interface NCCL would bootstrap on, as NCCL picks it
               (nccl_socket_interfaces()); NCCL_SOCKET_IFNAME naming nothing here.
  gloo-socket  the address Gloo would bind (GLOO_SOCKET_IFNAME, else the
               hostname's address, else 127.0.0.1).
  hostname     the name torchrun sends the other nodes as MASTER_ADDR when this
               node is rank 0 (socket.getfqdn(), unless torchrun --local-addr).
  rendezvous   --rdzv HOST:PORT resolves (not to a loopback address on several
               nodes) and accepts a TCP connection within --timeout seconds.
  disk         free space where runs are written (--disk, default runs/) against
               --disk-gib; a rotational disk.
  ram          host memory (MemAvailable) against --ram-gib or the plan's host RAM;
               without either, 64 GiB is what a GPU training node is usually asked to have.
  data         read throughput of --data DIR (up to --read-mib MiB of its regular
               files, their cached pages dropped first; FIFOs, sockets and devices
               are skipped and counted) against --data-mbs or the plan's rate.

--cpu-only: the GPU checks (driver, gpus, topology, nccl, shm, nccl-socket)
are skipped and a CPU build of torch is fine. Without it, a machine without a
visible NVIDIA GPU fails the driver and gpus checks: it was rented to train on
GPUs. --nnodes N > 1 turns loopback addresses (hostname, Gloo, NCCL, rendezvous)
into failures: the other nodes cannot reach them.

--plan PLAN.json: the output of `tools/ember plan RECIPE --json` (a regular file
of at most 16 MiB: written by `... --json > plan.json`); its feeding
section gives the host RAM the run needs (feeding.host_ram_bytes) and, when the
data streams from storage, the read rate the fastest GPU needs
(feeding.fastest.storage_bytes_per_s_if_streamed). --ram-gib and --data-mbs win.
"""
import argparse
import contextlib
import ctypes
import ctypes.util
import ipaddress
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3
MIB = 1024**2

STATUSES = ("ok", "warning", "failure", "skipped")
RANK = {"skipped": 0, "ok": 1, "warning": 2, "failure": 3}

RAM_ADVICE_GIB = 64          # host RAM usually asked of a GPU training node (no --ram-gib / --plan)
DISK_LOW_GIB = 10            # below this free, a warning even without --disk-gib
DATA_LOW_MBS = 200           # MB/s: below it (no --data-mbs / --plan), a warning
SHM_LOW_GIB = 1              # /dev/shm below this, with GPUs: a warning
GPU_BUSY_GIB = 2             # memory in use on an idle GPU above this: another process holds it
READ_SECONDS = 10            # the data read stops after this long, whatever --read-mib says
PLAN_MAX_BYTES = 16 * MIB    # --plan: a plan's JSON is a few kB; a larger file is not one

# Minimum driver of each CUDA major for minor version compatibility (CUDA 11 on):
# an application built with CUDA X.y runs on any driver >= the minimum of X,
# with a limited feature set when the driver's CUDA is older than X.y.
# NVIDIA, "CUDA Compatibility", Minor Version Compatibility, table 1:
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
# (11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580).
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}

# NVML (nvml.h): nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_NVLINK, nvmlGpuP2PStatus_t
# NVML_P2P_STATUS_OK, nvmlGpuTopologyLevel_t and nvidia-smi topo -m's names for them.
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_TOPOLOGY = {0: "same board", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVML_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE; the driver version needs 80

# <net/if.h> flags as getifaddrs reports them.
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40

GPU_CHECKS = ("driver", "gpus", "topology", "nccl", "shm", "nccl-socket")


class UsageError(Exception):
    """A bad command line or --plan file (exit 2)."""


@dataclass
class Options:
    cpu_only: bool = False
    nnodes: int = 1
    nproc: int | None = None          # GPUs per node the run starts ranks on
    rdzv: tuple | None = None         # (host, port)
    data: Path | None = None
    disk: Path = ROOT / "runs"
    ram_gib: float | None = None      # host RAM the run needs, GiB
    disk_gib: float | None = None     # free disk the run needs, GiB
    data_mbs: float | None = None     # read rate the run needs, MB/s (10^6 bytes)
    read_mib: int = 256
    timeout: float = 3.0              # seconds, the rendezvous connection
    plan_note: str = ""               # where ram_gib / data_mbs came from, when from --plan
    env: dict = field(default_factory=lambda: dict(os.environ))


@dataclass
class Result:
    name: str
    status: str
    detail: str
    todo: str = ""


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


class _NvmlMemory(ctypes.Structure):  # nvmlMemory_t: bytes
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def read_nvml(library="libnvidia-ml.so.1"):
    """The driver's view through NVML: {"driver", "cuda_driver": [major, minor] or None, "gpus": [{index,
    name, memory_total, memory_used}], "links": [{a, b, nvlink, path}]} or {"error"}. NVML numbers the
    GPUs physically: CUDA_VISIBLE_DEVICES does not apply."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError as e:
        return {"error": str(e)}  # "libnvidia-ml.so.1: cannot open shared object file: ..."

    def fn(name, *argtypes, optional=False):
        f = getattr(nvml, name, None)
        if f is None:
            if optional:
                return None
            raise OSError(f"{library} has no {name} (too old a driver?)")
        f.restype, f.argtypes = ctypes.c_int, list(argtypes)
        return f

    try:
        nvml.nvmlErrorString.restype, nvml.nvmlErrorString.argtypes = ctypes.c_char_p, [ctypes.c_int]
        init = fn("nvmlInit_v2", optional=True) or fn("nvmlInit")
        shutdown = fn("nvmlShutdown")
        P = ctypes.POINTER
        driver_version = fn("nvmlSystemGetDriverVersion", ctypes.c_char_p, ctypes.c_uint)
        cuda_version = (fn("nvmlSystemGetCudaDriverVersion_v2", P(ctypes.c_int), optional=True)
                        or fn("nvmlSystemGetCudaDriverVersion", P(ctypes.c_int), optional=True))
        count = fn("nvmlDeviceGetCount_v2", P(ctypes.c_uint), optional=True) or fn("nvmlDeviceGetCount",
                                                                                   P(ctypes.c_uint))
        by_index = (fn("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint, P(ctypes.c_void_p), optional=True)
                    or fn("nvmlDeviceGetHandleByIndex", ctypes.c_uint, P(ctypes.c_void_p)))
        name = fn("nvmlDeviceGetName", ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint)
        memory = fn("nvmlDeviceGetMemoryInfo", ctypes.c_void_p, P(_NvmlMemory))
        p2p = fn("nvmlDeviceGetP2PStatus", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, P(ctypes.c_int),
                 optional=True)
        ancestor = fn("nvmlDeviceGetTopologyCommonAncestor", ctypes.c_void_p, ctypes.c_void_p,
                      P(ctypes.c_int), optional=True)
    except OSError as e:
        return {"error": str(e)}

    def err(rc):
        text = nvml.nvmlErrorString(rc)
        return text.decode(errors="replace") if text else f"NVML error {rc}"

    rc = init()
    if rc != 0:
        return {"error": f"nvmlInit failed: {err(rc)}"}
    try:
        out = {"driver": None, "cuda_driver": None, "gpus": [], "links": []}
        buf = ctypes.create_string_buffer(NVML_BUFFER)
        if driver_version(buf, NVML_BUFFER) == 0:
            out["driver"] = buf.value.decode(errors="replace")
        v = ctypes.c_int()
        if cuda_version is not None and cuda_version(ctypes.byref(v)) == 0 and v.value > 0:
            out["cuda_driver"] = [v.value // 1000, (v.value % 1000) // 10]  # 12040 -> 12.4 (cuda.h's encoding)
        n = ctypes.c_uint()
        rc = count(ctypes.byref(n))
        if rc != 0:
            return {"error": f"nvmlDeviceGetCount failed: {err(rc)}", "driver": out["driver"]}
        handles = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            rc = by_index(i, ctypes.byref(h))
            if rc != 0:
                out["gpus"].append({"index": i, "name": None, "error": err(rc)})
                handles.append(None)
                continue
            handles.append(h)
            gpu = {"index": i, "name": None, "memory_total": None, "memory_used": None}
            if name(h, buf, NVML_BUFFER) == 0:
                gpu["name"] = buf.value.decode(errors="replace")
            m = _NvmlMemory()
            if memory(h, ctypes.byref(m)) == 0:
                gpu["memory_total"], gpu["memory_used"] = m.total, m.used
            out["gpus"].append(gpu)
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                link = {"a": i, "b": j, "nvlink": None, "path": None}
                if handles[i] is not None and handles[j] is not None:
                    s, level = ctypes.c_int(), ctypes.c_int()
                    if p2p is not None and p2p(handles[i], handles[j], NVML_P2P_CAPS_INDEX_NVLINK,
                                               ctypes.byref(s)) == 0:
                        link["nvlink"] = s.value == NVML_P2P_STATUS_OK
                    if ancestor is not None and ancestor(handles[i], handles[j], ctypes.byref(level)) == 0:
                        link["path"] = NVML_TOPOLOGY.get(level.value, f"level {level.value}")
                out["links"].append(link)
        return out
    finally:
        shutdown()


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("next", ctypes.POINTER(_IfAddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_SockAddr)), ("netmask", ctypes.POINTER(_SockAddr)),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def read_interfaces():
    """Every IPv4/IPv6 address of this node's interfaces, in getifaddrs(3)'s order (the order NCCL
    walks): [{"name", "family": 4 or 6, "address", "flags"}], or {"error"}."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {"error": f"getifaddrs: {os.strerror(ctypes.get_errno())}"}
    out = []
    try:
        p = head
        while p:
            ifa = p.contents
            if ifa.addr:
                family = ifa.addr.contents.family
                raw = bytes(ifa.addr.contents.data)
                # sockaddr_in: port (2 bytes) then the address; sockaddr_in6: port, flowinfo (4), address.
                if family == socket.AF_INET:
                    out.append({"name": ifa.name.decode(), "family": 4, "flags": ifa.flags,
                                "address": socket.inet_ntop(socket.AF_INET, raw[2:6])})
                elif family == socket.AF_INET6:
                    out.append({"name": ifa.name.decode(), "family": 6, "flags": ifa.flags,
                                "address": socket.inet_ntop(socket.AF_INET6, raw[6:22])})
            p = ifa.next
    finally:
        libc.freeifaddrs(head)
    return out


def resolve(host):
    """getaddrinfo's addresses of host for TCP, in its order (de-duplicated), or {"error"}."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return {"error": str(e)}
    seen = []
    for info in infos:
        if info[4][0] not in seen:
            seen.append(info[4][0])
    return seen


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


# ---------------------------------------------------------------------------
# Judging: each check takes the probe and the options, returns a Result.
# ---------------------------------------------------------------------------

def is_loopback(address):
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _gib(n):
    return f"{n / GIB:.1f} GiB"


def _n(x):
    """A number for a message: whole above 100 (10240), else 3 significant digits (0.5, 2.5)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _version(text):
    """"580.95.05" -> (580, 95, 5); None when it is not dotted numbers."""
    try:
        return tuple(int(x) for x in str(text).split("."))
    except ValueError:
        return None


def cuda_compatibility(torch_cuda, driver_cuda, driver_version):
    """(status, detail, todo) of torch built for CUDA torch_cuda (major, minor) on a driver whose CUDA is
    driver_cuda (major, minor) and whose version is driver_version ("580.95.05"). The rule (NVIDIA's CUDA
    Compatibility guide, see MIN_DRIVER): a driver runs what was built for its own CUDA or older (backward
    compatibility): ok. Built for a newer minor of the same major (CUDA >= 11): minor version compatibility
    holds on a driver >= the major's minimum, with a limited feature set (e.g. PTX of the newer CUDA cannot
    be compiled by the driver): warning; below that minimum: failure. A newer major than the driver's:
    failure (only NVIDIA's forward-compatibility package, cuda-compat, on data-centre GPUs, lifts it)."""
    t, d = tuple(torch_cuda), tuple(driver_cuda)
    fix = (f"install an NVIDIA driver for CUDA >= {t[0]}.{t[1]} (>= {'.'.join(map(str, MIN_DRIVER[t[0]]))} "
           f"for CUDA {t[0]}.x)" if t[0] in MIN_DRIVER else f"install an NVIDIA driver for CUDA >= {t[0]}.{t[1]}")
    fix += f", or a torch built for CUDA {d[0]}.{d[1]} or older"
    if d >= t:
        return "ok", f"driver {driver_version} supports CUDA {d[0]}.{d[1]}; torch is built for CUDA {t[0]}.{t[1]}", ""
    if d[0] == t[0] and t[0] >= 11:
        v = _version(driver_version)
        minimum = MIN_DRIVER.get(t[0])
        if minimum is not None and v is not None and v >= minimum:
            return ("warning", f"driver {driver_version} supports CUDA {d[0]}.{d[1]}, torch is built for CUDA "
                    f"{t[0]}.{t[1]}: it runs by minor version compatibility (driver >= "
                    f"{'.'.join(map(str, minimum))}), without the newer minor's features", fix)
        if minimum is not None and v is not None:
            return ("failure", f"driver {driver_version} is older than {'.'.join(map(str, minimum))}, the minimum "
                    f"for CUDA {t[0]}.x; torch is built for CUDA {t[0]}.{t[1]}", fix)
        return ("warning", f"driver {driver_version} supports CUDA {d[0]}.{d[1]}, torch is built for CUDA "
                f"{t[0]}.{t[1]}: minor version compatibility needs a driver >= the CUDA {t[0]}.x minimum", fix)
    return ("failure", f"driver {driver_version} supports CUDA {d[0]}.{d[1]}, torch is built for CUDA "
            f"{t[0]}.{t[1]}: CUDA calls will fail (cudaErrorInsufficientDriver)",
            fix + "; on a data-centre GPU the cuda-compat package (forward compatibility) also works")


def _torch_cuda(probe):
    t = probe["torch"]
    if t.get("error") or not t.get("cuda"):
        return None
    v = _version(t["cuda"])
    return v[:2] if v and len(v) >= 2 else None


NO_GPU_TODO = ("check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES, the container's --gpus; "
               "--cpu-only if this node trains on CPUs")


def check_torch(probe, opts):
    t = probe["torch"]
    if t.get("error"):
        return Result("torch", "failure", f"torch does not import in {t.get('python')}: {t['error']}",
                      "run tools/ember setup (the venv with the pinned torch), or use that venv's python")
    if not t.get("cuda"):
        if opts.cpu_only:
            return Result("torch", "ok", f"torch {t['version']}, a CPU build (--cpu-only)")
        return Result("torch", "failure", f"torch {t['version']} is a CPU-only build: it cannot use a GPU",
                      "install the CUDA wheel (tools/ember setup installs torch 2.11.0 for CUDA 13.0); "
                      "--cpu-only if this node trains on CPUs")
    detail = f"torch {t['version']}, built for CUDA {t['cuda']} ({t.get('python')})"
    b = probe["build"]
    if b.get("missing") or not b.get("torch_dir"):
        return Result("torch", "ok", detail + f"; no Ember build in {b['dir']} yet")
    linked = os.path.realpath(b["torch_dir"])
    if t.get("path") and not (linked + "/").startswith(os.path.realpath(t["path"]) + "/"):
        return Result("torch", "warning", detail + f"; but Ember's build in {b['dir']} links the LibTorch of "
                      f"{b['torch_dir']} (CUDA {b.get('cuda') or '?'}): the driver check judged this python's",
                      "rebuild against this torch (tools/ember build, EMBER_VENV), or run the doctor with the "
                      "python of the LibTorch the build links")
    return Result("torch", "ok", detail + f"; Ember's build in {b['dir']} links it")


def check_driver(probe, opts):
    if opts.cpu_only:
        return Result("driver", "skipped", "--cpu-only")
    n = probe["nvml"]
    if n.get("error"):
        return Result("driver", "failure", f"no GPU visible: no NVIDIA driver answers ({n['error']})",
                      "install the NVIDIA driver (nvidia-smi must work); in a container, start it with "
                      "--gpus all (NVIDIA Container Toolkit)")
    t, whose = _torch_cuda(probe), "torch"
    if t is None:  # torch does not import here: judge the CUDA of the LibTorch Ember's build links
        b = probe["build"]
        t, whose = (_version(b["cuda"])[:2], "Ember's build") if _version(b.get("cuda")) else (None, whose)
    if n.get("cuda_driver") is None:
        return Result("driver", "warning", f"driver {n.get('driver')}: NVML does not say which CUDA it supports",
                      "nvidia-smi prints it ('CUDA Version'); it must be >= torch's CUDA")
    if t is None:
        d = n["cuda_driver"]
        return Result("driver", "ok", f"driver {n.get('driver')} supports CUDA {d[0]}.{d[1]} "
                      "(torch's CUDA unknown: see the torch check)")
    status, detail, todo = cuda_compatibility(t, n["cuda_driver"], n.get("driver"))
    return Result("driver", status, detail.replace("torch is built", f"{whose} is built"), todo)


def check_gpus(probe, opts):
    if opts.cpu_only:
        return Result("gpus", "skipped", "--cpu-only")
    n = probe["nvml"]
    gpus = [] if n.get("error") else n.get("gpus", [])
    if not gpus:
        why = "no NVIDIA driver" if n.get("error") else "the driver lists no GPU"
        return Result("gpus", "failure", f"no NVIDIA GPU visible ({why})", NO_GPU_TODO)
    t = probe["torch"]
    seen = None if t.get("error") else t.get("device_count")
    visible = opts.env.get("CUDA_VISIBLE_DEVICES")
    cvd = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    kinds = {}
    for g in gpus:
        key = f"{g.get('name')} ({_gib(g['memory_total'])})" if g.get("memory_total") else str(g.get("name"))
        kinds.setdefault(key, []).append(g["index"])
    listing = ", ".join(f"{len(ix)} x {k}" for k, ix in kinds.items())
    detail = f"{listing}; torch sees {seen if seen is not None else '?'}{cvd}"
    if seen == 0:
        err = t.get("cuda_error")
        return Result("gpus", "failure", f"the driver lists {len(gpus)} GPU(s) but torch sees none{cvd}"
                      + (f": {err}" if err else ""),
                      "unset or fix CUDA_VISIBLE_DEVICES; 'system not yet initialized' on an NVSwitch board means "
                      "the fabric manager is not running (systemctl status nvidia-fabricmanager)")
    count = seen if seen is not None else len(gpus)
    if opts.nproc is not None and opts.nproc > count:
        return Result("gpus", "failure", f"--nproc {opts.nproc} but {count} GPU(s) usable: {detail}",
                      "start as many ranks per node as GPUs (tools/ember run --nproc, torchrun --nproc-per-node)")
    notes, status, todo = [], "ok", ""
    if len(kinds) > 1:
        status, todo = "warning", "rent identical GPUs, or start ranks only on one kind (CUDA_VISIBLE_DEVICES)"
        notes.append("the GPUs differ: data-parallel steps go at the slowest one's pace, the batch must fit the "
                     "smallest")
    busy = [g for g in gpus if (g.get("memory_used") or 0) > GPU_BUSY_GIB * GIB]
    if busy:
        status = "warning"
        notes.append("memory already in use: " + ", ".join(f"GPU {g['index']} {_gib(g['memory_used'])}"
                                                            for g in busy))
        todo = (todo + "; " if todo else "") + "another process holds it: nvidia-smi lists the processes"
    return Result("gpus", status, "; ".join([detail] + notes), todo)


def check_topology(probe, opts):
    if opts.cpu_only:
        return Result("topology", "skipped", "--cpu-only")
    n = probe["nvml"]
    gpus = [] if n.get("error") else n.get("gpus", [])
    if not gpus:
        return Result("topology", "skipped", "no GPU visible (see gpus)")
    if len(gpus) == 1:
        return Result("topology", "ok", "one GPU: no links between GPUs to use")
    links = n.get("links", [])
    unknown = [l for l in links if l.get("nvlink") is None]
    pcie = [l for l in links if l.get("nvlink") is False]
    if not pcie and not unknown:
        return Result("topology", "ok", f"NVLink between every pair of the {len(gpus)} GPUs (NVSwitch or a full "
                      "mesh; nvidia-smi topo -m shows NV# for each pair)")
    shown = ", ".join(f"GPU{l['a']}-GPU{l['b']} {l.get('path') or 'PCIe'}" for l in pcie[:6])
    more = f" and {len(pcie) - 6} more" if len(pcie) > 6 else ""
    if pcie:
        return Result("topology", "warning", f"no NVLink between {len(pcie)} of {len(links)} GPU pairs "
                      f"({shown}{more}): all-reduce goes over PCIe there",
                      "expected on PCIe cards (L4, L40S, H100 PCIe); on an SXM/HGX board NVLink is down: "
                      "nvidia-smi nvlink --status, and with NVSwitch the fabric manager "
                      "(systemctl status nvidia-fabricmanager); nvidia-smi topo -m shows the same matrix")
    return Result("topology", "warning", f"NVML did not report the NVLink status of {len(unknown)} GPU pair(s)",
                  "nvidia-smi topo -m shows the links (NV# = NVLink)")


def check_nccl(probe, opts):
    if opts.cpu_only:
        return Result("nccl", "skipped", "--cpu-only (Gloo on CPUs)")
    t = probe["torch"]
    if t.get("error"):
        return Result("nccl", "skipped", "torch does not import (see torch)")
    if not t.get("nccl"):
        return Result("nccl", "failure", f"torch {t.get('version')} has no NCCL: GPUs cannot use dist.backend=nccl",
                      "install the CUDA wheel of torch (tools/ember setup)")
    version = ".".join(map(str, t["nccl"]))
    slow = []
    for var, what in (("NCCL_P2P_DISABLE", "GPUs exchange through host memory instead of NVLink/PCIe P2P"),
                      ("NCCL_SHM_DISABLE", "no shared-memory transport inside the node"),
                      ("NCCL_IB_DISABLE", "no InfiniBand/RoCE: nodes talk over TCP sockets")):
        value = opts.env.get(var, "")
        if value not in ("", "0") and (var != "NCCL_IB_DISABLE" or opts.nnodes > 1):
            slow.append(f"{var}={value}: {what}")
    if slow:
        return Result("nccl", "warning", f"NCCL {version}; " + "; ".join(slow),
                      "unset them unless a known fault needs them")
    return Result("nccl", "ok", f"NCCL {version} (torch's own)")


def check_shm(probe, opts):
    if opts.cpu_only:
        return Result("shm", "skipped", "--cpu-only")
    s = probe["shm"]
    if s.get("error"):
        return Result("shm", "warning", f"cannot read {s['error']}", "NCCL needs a writable /dev/shm")
    if s["total"] < SHM_LOW_GIB * GIB:
        return Result("shm", "warning", f"/dev/shm holds {s['total'] / MIB:.0f} MiB: NCCL's shared-memory buffers "
                      "between ranks can fail to grow there ('failed to extend /dev/shm')",
                      "start the container with --shm-size=16g or --ipc=host")
    return Result("shm", "ok", f"/dev/shm holds {_gib(s['total'])}")


def _usable(interfaces):
    """The addresses NCCL would consider: up and running interfaces, IPv6 loopback skipped (NCCL's
    findInterfaces), in getifaddrs order."""
    return [i for i in interfaces if i["flags"] & IFF_UP and i["flags"] & IFF_RUNNING
            and not (i["family"] == 6 and is_loopback(i["address"]))]


def nccl_match(spec, names):
    """The interface names NCCL_SOCKET_IFNAME=spec selects among names, in their order. NCCL's syntax
    (src/misc/socket.cc, matchIfList): a comma-separated list of prefixes ("eth" matches eth0, eth1);
    a leading '^' excludes the list instead; then a leading '=' makes the names exact ("^=eth0")."""
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    items = [s.split(":")[0] for s in spec.split(",") if s]  # NCCL also reads "name:port"
    out = []
    for name in names:
        hit = any(name == p if exact else name.startswith(p) for p in items)
        if hit != exclude and name not in out:
            out.append(name)
    return out


def nccl_socket_interfaces(interfaces, env):
    """(interfaces NCCL would use, in order, with their first address; how chosen). NCCL's
    ncclFindInterfaces: NCCL_SOCKET_IFNAME when it has more than one character (find or fail);
    else "ib" interfaces, then (with NCCL_COMM_ID) none here, then "^docker,lo,virbr", then docker,
    lo, virbr. NCCL_SOCKET_FAMILY=AF_INET/AF_INET6 keeps one family."""
    usable = _usable(interfaces)
    family = {"AF_INET": 4, "AF_INET6": 6}.get(env.get("NCCL_SOCKET_FAMILY", ""))
    if family:
        usable = [i for i in usable if i["family"] == family]
    names = []
    for i in usable:
        if i["name"] not in names:
            names.append(i["name"])
    first = {}
    for i in usable:
        first.setdefault(i["name"], i["address"])
    spec = env.get("NCCL_SOCKET_IFNAME", "")
    if len(spec) > 1:
        chosen = nccl_match(spec, names)
        return [(n, first[n]) for n in chosen], f"NCCL_SOCKET_IFNAME={spec}"
    for step in ("ib", "^docker,lo,virbr", "docker", "lo", "virbr"):
        chosen = nccl_match(step, names)
        if chosen:
            return [(n, first[n]) for n in chosen], f"NCCL's own choice ({step})"
    return [], "NCCL's own choice"


def _listing(interfaces):
    seen = {}
    for i in interfaces:
        seen.setdefault(i["name"], []).append(i["address"])
    return ", ".join(f"{n} {' '.join(a[:2])}" for n, a in seen.items()) or "none"


def _good_interface(interfaces):
    """A name and address to suggest: the first running non-loopback interface with IPv4, else any."""
    usable = [i for i in _usable(interfaces) if not i["flags"] & IFF_LOOPBACK and not is_loopback(i["address"])]
    usable.sort(key=lambda i: i["family"])
    return (usable[0]["name"], usable[0]["address"]) if usable else (None, None)


def check_nccl_socket(probe, opts):
    if opts.cpu_only:
        return Result("nccl-socket", "skipped", "--cpu-only (NCCL not used)")
    interfaces = probe["interfaces"]
    if isinstance(interfaces, dict):
        return Result("nccl-socket", "failure", f"cannot list the network interfaces: {interfaces['error']}",
                      "ip addr shows them")
    spec = opts.env.get("NCCL_SOCKET_IFNAME", "")
    chosen, how = nccl_socket_interfaces(interfaces, opts.env)
    name, address = _good_interface(interfaces)
    suggest = f"NCCL_SOCKET_IFNAME={name}" if name else "NCCL_SOCKET_IFNAME=<interface>"
    have = _listing(_usable(interfaces))
    if len(spec) == 1:
        note = f"NCCL ignores a one-character NCCL_SOCKET_IFNAME ('{spec}') and picks by itself"
        return Result("nccl-socket", "warning", note + (f": {chosen[0][0]} ({chosen[0][1]})" if chosen else ""),
                      f"name the interface in full: {suggest}")
    if not chosen:
        if spec:
            return Result("nccl-socket", "failure", f"NCCL_SOCKET_IFNAME={spec} matches no running interface with "
                          f"an address (here: {have}): NCCL stops with 'Bootstrap : no socket interface found'",
                          f"{suggest} (a prefix; '=' exact names, '^' excludes)")
        return Result("nccl-socket", "failure", "no running interface with an address: NCCL cannot bootstrap",
                      "ip addr; bring an interface up")
    first_name, first_address = chosen[0]
    detail = f"NCCL would use {first_name} ({first_address}), {how}"
    if len(chosen) > 1:
        detail += f"; also matched: {', '.join(n for n, _ in chosen[1:])}"
    if opts.nnodes > 1:
        if all(is_loopback(a) or n.startswith(("lo", "docker", "virbr")) for n, a in chosen):
            return Result("nccl-socket", "failure", detail + f": the other {opts.nnodes - 1} node(s) cannot "
                          "reach it", f"export {suggest} on every node (the interface between the nodes)")
        if not spec and len({n for n, _ in chosen}) > 1:
            return Result("nccl-socket", "warning", detail + ": NCCL bootstraps on the first one",
                          f"if the nodes talk over another interface, export NCCL_SOCKET_IFNAME=<it> on every node")
    return Result("nccl-socket", "ok", detail)


def _local_addresses(interfaces):
    return {i["address"].split("%")[0] for i in interfaces} if isinstance(interfaces, list) else set()


def check_gloo_socket(probe, opts):
    interfaces = probe["interfaces"]
    if isinstance(interfaces, dict):
        return Result("gloo-socket", "failure", f"cannot list the network interfaces: {interfaces['error']}",
                      "ip addr shows them")
    name, address = _good_interface(interfaces)
    suggest = f"GLOO_SOCKET_IFNAME={name}" if name else "GLOO_SOCKET_IFNAME=<interface>"
    spec = opts.env.get("GLOO_SOCKET_IFNAME", "")
    if spec:
        # torch's ProcessGroupGloo: one device per comma-separated name, each an exact interface name.
        wanted = [s for s in spec.split(",") if s]
        present = {i["name"]: i["address"] for i in reversed(interfaces)}  # the first address of each
        missing = [w for w in wanted if w not in present]
        if missing:
            return Result("gloo-socket", "failure", f"GLOO_SOCKET_IFNAME={spec}: no interface {', '.join(missing)} "
                          f"with an address here (here: {_listing(interfaces)}); Gloo stops at start-up",
                          f"{suggest} (exact names, comma-separated)")
        bound = [(w, present[w]) for w in wanted]
        detail = "Gloo would bind " + ", ".join(f"{w} ({a})" for w, a in bound) + f", GLOO_SOCKET_IFNAME={spec}"
        if opts.nnodes > 1 and all(is_loopback(a) for _, a in bound):
            return Result("gloo-socket", "failure", detail + ": a loopback address, the other nodes cannot reach it",
                          f"export {suggest} on every node")
        return Result("gloo-socket", "ok", detail)
    # No GLOO_SOCKET_IFNAME: the first of the hostname's addresses that binds here, else 127.0.0.1 with a
    # warning (torch's GlooDeviceFactory::makeDefaultDevice, doesHostnameResolveToUsableAddress).
    h = probe["hostname"]
    addresses = h["hostname_addresses"]
    local = _local_addresses(interfaces)
    if isinstance(addresses, dict):
        bound, why = "127.0.0.1", f"hostname {h['hostname']} does not resolve ({addresses['error']})"
    else:
        usable = [a for a in addresses if a in local or is_loopback(a)]
        if usable:
            bound, why = usable[0], f"hostname {h['hostname']}"
        else:
            bound, why = "127.0.0.1", (f"hostname {h['hostname']} resolves to {', '.join(addresses)}, which no "
                                       "interface here has (a stale /etc/hosts entry?)")
    detail = f"Gloo would bind {bound} ({why})"
    if is_loopback(bound):
        if opts.nnodes > 1:
            return Result("gloo-socket", "failure", detail + ": a loopback address, the other nodes cannot reach it",
                          f"export {suggest} on every node (its own interface between the nodes), or map the "
                          f"hostname to {address or 'its address'} in /etc/hosts")
        return Result("gloo-socket", "ok", detail + ": fine on one node")
    return Result("gloo-socket", "ok", detail)


def check_hostname(probe, opts):
    h = probe["hostname"]
    interfaces = probe["interfaces"] if opts.nnodes > 1 else []
    name, address = _good_interface(interfaces) if isinstance(interfaces, list) else (None, None)
    fqdn, addresses = h["fqdn"], h["fqdn_addresses"]
    resolved = f"resolves to {', '.join(addresses)}" if isinstance(addresses, list) else \
        f"does not resolve ({addresses['error']})"
    detail = f"torchrun would announce this node as {fqdn} (socket.getfqdn()), which {resolved} here"
    if isinstance(addresses, dict) or all(is_loopback(a) for a in addresses):
        if opts.nnodes > 1:
            fix = f"--local-addr {address}" if address else "--local-addr <this node's address>"
            return Result("hostname", "failure", detail + ": as rank 0 it would send the other nodes a "
                          "MASTER_ADDR they cannot reach",
                          f"give torchrun {fix} on this node (each node its own address), or map the hostname "
                          f"to that address in /etc/hosts (Debian maps it to 127.0.1.1)")
        return Result("hostname", "ok", detail + ": fine on one node")
    return Result("hostname", "ok", detail + " (the other nodes must resolve it alike)")


def check_rendezvous(probe, opts):
    if opts.rdzv is None:
        if opts.nnodes > 1:
            return Result("rendezvous", "warning", f"--nnodes {opts.nnodes} without --rdzv: not checked",
                          "pass --rdzv HOST:PORT, torchrun's --rdzv-endpoint")
        return Result("rendezvous", "skipped", "no --rdzv HOST:PORT given")
    r = probe["rendezvous"]
    where = f"{r['host']}:{r['port']}"
    if r.get("error"):
        return Result("rendezvous", "failure", f"{r['host']} does not resolve here ({r['error']})",
                      "use the rendezvous node's IP address, or add its name to DNS or /etc/hosts")
    addresses = r["addresses"]
    if opts.nnodes > 1 and all(is_loopback(a) for a in addresses):
        return Result("rendezvous", "failure", f"{r['host']} resolves to {', '.join(addresses)} (loopback; "
                      "/etc/hosts?): with several nodes each would meet only itself",
                      "use the rendezvous node's own address in --rdzv-endpoint (not a name mapped to "
                      "127.0.1.1), and on that node torchrun --local-addr with it")
    results = r["connect"]
    open_at = [a for a, v in results.items() if v == "open"]
    if open_at:
        return Result("rendezvous", "ok", f"{where} ({open_at[0]}) accepts TCP connections")
    a, outcome = next(iter(results.items()))
    local = a in _local_addresses(probe["interfaces"]) or is_loopback(a)
    here = (" (an address of this node: before torchrun starts here nothing listens; check from the other "
            "nodes once it runs)") if local else ""
    if outcome == "refused":
        return Result("rendezvous", "failure", f"{where} ({a}) refused the connection: nothing listens on port "
                      f"{r['port']}{here}",
                      "start torchrun on the rendezvous node first, then check again; a firewall that rejects "
                      "reads the same")
    if outcome == "timeout":
        return Result("rendezvous", "failure", f"{where} ({a}): no answer within {opts.timeout:g} s: a firewall "
                      "drops the packets, or no route",
                      f"open TCP port {r['port']} (and the ports NCCL/Gloo pick: all TCP between the nodes) "
                      "in the firewall or security group")
    return Result("rendezvous", "failure", f"{where} ({a}): {outcome}", "check the route to it (ip route get)")


def check_disk(probe, opts):
    d = probe["disk"]
    if d.get("error"):
        return Result("disk", "failure", f"cannot read the disk at {opts.disk}: {d['error']}", "--disk DIR names it")
    where = d["path"] + ("" if d["existing"] == d["path"] else f" (not there yet: {d['existing']})")
    kind = d.get("fstype") or "?"
    detail = f"{_gib(d['free'])} free of {_gib(d['total'])} at {where}, {kind}"
    status, todo = "ok", ""
    if opts.disk_gib is not None:
        detail += f"; the run needs {_n(opts.disk_gib)} GiB (--disk-gib)"
        if d["free"] < opts.disk_gib * GIB:
            status, todo = "failure", "free space, or write the runs elsewhere (run.dir=...; --disk DIR checks it)"
    elif d["free"] < DISK_LOW_GIB * GIB:
        status, todo = "warning", f"under {DISK_LOW_GIB} GiB: checkpoints need room; --disk-gib N checks the run's need"
    if d.get("rotational") == 1:
        detail += f"; {d['disk']} reports a rotational disk (/sys/block/{d['disk']}/queue/rotational = 1)"
        if status == "ok":
            status = "warning"
        todo = (todo + "; " if todo else "") + ("an HDD writes checkpoints and reads data slowly: use an SSD; "
                                                "virtual disks (virtio, some cloud volumes) report 1 on SSDs too")
    return Result("disk", status, detail, todo)


def check_ram(probe, opts):
    m = probe["meminfo"]
    if m.get("error") or "MemAvailable" not in m:
        return Result("ram", "warning", f"cannot read /proc/meminfo ({m.get('error', 'no MemAvailable')})",
                      "free -g shows it")
    detail = f"{_gib(m['MemAvailable'])} available of {_gib(m['MemTotal'])}"
    if opts.ram_gib is not None:
        need = f"the run needs {_n(opts.ram_gib)} GiB ({opts.plan_note or '--ram-gib'})"
        if m["MemAvailable"] < opts.ram_gib * GIB:
            return Result("ram", "failure", f"{detail}; {need}",
                          "a node with more memory, a smaller batch, or data that streams from storage")
        return Result("ram", "ok", f"{detail}; {need}")
    if not opts.cpu_only and m["MemTotal"] < RAM_ADVICE_GIB * GIB:
        return Result("ram", "warning", f"{detail}: under the {RAM_ADVICE_GIB} GiB usually asked of a GPU "
                      "training node (data loading, pinned buffers, checkpoints gathered at rank 0)",
                      "--ram-gib N or --plan PLAN.json checks the run's own need")
    return Result("ram", "ok", detail)


def check_data(probe, opts):
    if opts.data is None:
        return Result("data", "skipped", "no --data DIR given")
    d = probe["data"]
    if d.get("error"):
        return Result("data", "failure", f"{d['path']}: {d['error']}", "--data names the dataset's folder")
    mbs = d["bytes"] / 1e6 / max(d["seconds"], 1e-9)
    detail = (f"read {d['bytes'] / MIB:.0f} MiB in {d['files']} file(s) at {mbs:.0f} MB/s from {d['path']} "
              f"({d.get('fstype') or '?'})")
    if d.get("skipped"):
        detail += f"; {d['skipped']} FIFO/socket/device file(s) skipped"
    network = (d.get("fstype") or "").split(".")[0] in ("nfs", "nfs4", "cifs", "smb3", "fuse", "9p", "sshfs")
    if opts.data_mbs is not None:
        need = f"the run needs {_n(opts.data_mbs)} MB/s ({opts.plan_note or '--data-mbs'})"
        if mbs < opts.data_mbs:
            return Result("data", "warning", f"{detail}; {need}",
                          "copy the data to a local NVMe disk, or keep it in RAM")
        return Result("data", "ok", f"{detail}; {need}")
    if mbs < DATA_LOW_MBS:
        why = "a network file system" if network else "a network file system, a throttled cloud volume or an HDD"
        return Result("data", "warning", f"{detail}: under {DATA_LOW_MBS} MB/s (a SATA SSD reads ~500 MB/s): {why}?",
                      "copy the data to a local NVMe disk; --data-mbs R or --plan checks the run's need")
    return Result("data", "ok", detail)


CHECKS = {
    "torch": check_torch,
    "driver": check_driver,
    "gpus": check_gpus,
    "topology": check_topology,
    "nccl": check_nccl,
    "shm": check_shm,
    "nccl-socket": check_nccl_socket,
    "gloo-socket": check_gloo_socket,
    "hostname": check_hostname,
    "rendezvous": check_rendezvous,
    "disk": check_disk,
    "ram": check_ram,
    "data": check_data,
}


def run_checks(probe, opts, only=None):
    results = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        try:
            results.append(check(probe, opts))
        except Exception as e:  # a check's own bug on odd facts: report it, never a traceback
            if isinstance(e, KeyError) and not probe.read:
                raise  # a test's missing fact
            results.append(Result(name, "failure", f"the check itself failed: {type(e).__name__}: {e}",
                                  "report this with tools/ember doctor --json's facts"))
    return results


def exit_status(results):
    return 1 if any(r.status == "failure" for r in results) else 0


def render(results, header=""):
    width = max((len(r.name) for r in results), default=8)
    lines = [header] if header else []
    for r in results:
        lines.append(f"{r.status:<8} {r.name:<{width}}  {r.detail}" + (f" -> {r.todo}" if r.todo else ""))
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]) + f": exit {exit_status(results)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def parse_rdzv(text):
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")  # [IPv6]:PORT
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv {text}: expected HOST:PORT with a port in 1..65535 (torchrun's --rdzv-endpoint)")
    return host, int(port)


def read_plan(path):
    """(ram_gib, data_mbs, note) from `tools/ember plan RECIPE --json`'s output (a regular file of at most
    PLAN_MAX_BYTES: /dev/zero or a FIFO is refused, not read without end or waited on)."""
    try:
        fd = open_regular(path)
        if fd is None:
            raise UsageError(f"--plan {path}: not a regular file (a FIFO or a device?): give the file that "
                             f"`tools/ember plan RECIPE --json > plan.json` wrote")
        with open(fd, "rb") as f:
            raw = f.read(PLAN_MAX_BYTES + 1)
        if len(raw) > PLAN_MAX_BYTES:
            raise UsageError(f"--plan {path}: over {PLAN_MAX_BYTES // MIB} MiB, not the JSON of "
                             f"`tools/ember plan RECIPE --json` (a few kB)")
        plan = json.loads(raw.decode("utf-8"))
        feeding = plan["feeding"]
        ram = feeding["host_ram_bytes"] / GIB
    except OSError as e:
        raise UsageError(f"--plan {path}: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UsageError(f"--plan {path}: not the JSON of `tools/ember plan RECIPE --json` ({type(e).__name__}: {e})")
    rate, note = None, f"plan {Path(path).name}"
    fastest = feeding.get("fastest") or {}
    if feeding.get("streams") and fastest.get("storage_bytes_per_s_if_streamed"):
        rate = fastest["storage_bytes_per_s_if_streamed"] / 1e6
        sps = fastest.get("samples_per_second") or 0
        note += f": {fastest.get('gpu')} {fastest.get('precision')} at {sps:.0f} samples/s"
    return ram, rate, note


def parse_args(argv):
    p = argparse.ArgumentParser(prog="tools/ember doctor", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--cpu-only", action="store_true", help="this node trains on CPUs: skip the GPU checks")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the run (default 1); >1 makes loopback a failure")
    p.add_argument("--nproc", type=int, help="ranks (GPUs) per node the run starts")
    p.add_argument("--rdzv", metavar="HOST:PORT", help="the rendezvous endpoint (torchrun --rdzv-endpoint)")
    p.add_argument("--data", type=Path, metavar="DIR", help="the dataset folder whose read rate to measure")
    p.add_argument("--disk", type=Path, metavar="DIR", default=ROOT / "runs",
                   help="where runs and checkpoints go (default: runs/ of this clone)")
    p.add_argument("--ram-gib", type=float, help="host RAM the run needs, GiB")
    p.add_argument("--disk-gib", type=float, help="free disk the run needs at --disk, GiB")
    p.add_argument("--data-mbs", type=float, help="read rate the run needs from --data, MB/s")
    p.add_argument("--plan", type=Path, metavar="PLAN.json", help="tools/ember plan RECIPE --json's output")
    p.add_argument("--read-mib", type=int, default=256, help="read at most this much of --data (default 256)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the rendezvous (default 3)")
    p.add_argument("--only", action="append", metavar="CHECK", help="run only these checks (repeat, or comma list)")
    p.add_argument("--json", action="store_true", help="print the results and the facts as JSON")
    a = p.parse_args(argv)
    only = None
    if a.only:
        only = [c for item in a.only for c in item.split(",") if c]
        unknown = [c for c in only if c not in CHECKS]
        if unknown:
            raise UsageError(f"--only {','.join(unknown)}: no such check (the checks: {', '.join(CHECKS)})")
    for name, value, low in (("--nnodes", a.nnodes, 1), ("--nproc", a.nproc, 1), ("--read-mib", a.read_mib, 1)):
        if value is not None and value < low:
            raise UsageError(f"{name} {value}: must be >= {low}")
    for name, value in (("--ram-gib", a.ram_gib), ("--disk-gib", a.disk_gib), ("--data-mbs", a.data_mbs),
                        ("--timeout", a.timeout)):
        if value is not None and not (0 < value < float("inf")):
            raise UsageError(f"{name} {value}: must be a positive number")
    opts = Options(cpu_only=a.cpu_only, nnodes=a.nnodes, nproc=a.nproc, data=a.data, disk=a.disk,
                   ram_gib=a.ram_gib, disk_gib=a.disk_gib, data_mbs=a.data_mbs, read_mib=a.read_mib,
                   timeout=a.timeout, rdzv=parse_rdzv(a.rdzv) if a.rdzv else None)
    if a.plan:
        ram, rate, note = read_plan(a.plan)
        opts.plan_note = note
        if opts.ram_gib is None:
            opts.ram_gib = ram
        if opts.data_mbs is None:
            opts.data_mbs = rate
    return opts, only, a.json


def main(argv=None):
    try:
        opts, only, as_json = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"error: [doctor] {e}", file=sys.stderr)
        return 2
    probe = Probe(opts)
    results = run_checks(probe, opts, only)
    if as_json:
        print(json.dumps({"checks": [asdict(r) for r in results], "exit": exit_status(results),
                          "facts": probe.facts}, indent=1, default=str))
    else:
        header = (f"ember doctor on {socket.gethostname()} ({os.cpu_count()} CPUs), --nnodes {opts.nnodes}"
                  + (", --cpu-only" if opts.cpu_only else ""))
        print(render(results, header))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
