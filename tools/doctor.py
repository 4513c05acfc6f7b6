#!/usr/bin/env python3
"""A preflight of this node for a training run: run it on each node before the hours go into training.

    tools/ember doctor [--cpu-only] [--nnodes N] [--nproc N] [--rdzv HOST:PORT]
                       [--data DIR] [--disk DIR] [--ram-gib G] [--disk-gib G] [--data-mbs R]
                       [--cores-per-gpu N] [--plan PLAN.json] [--only CHECK ...] [--json]
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
  cpu          CPU cores per GPU (this process's affinity set, else os.cpu_count(),
               over --nproc, else the GPUs torch sees, else NVML's) against what
               decoding streamed shards needs: --cores-per-gpu or the plan's
               cpu_cores_per_gpu; skipped without either (or with --cpu-only).

--cpu-only: the GPU checks (driver, gpus, topology, nccl, shm, nccl-socket)
are skipped and a CPU build of torch is fine. Without it, a machine without a
visible NVIDIA GPU fails the driver and gpus checks: it was rented to train on
GPUs. --nnodes N > 1 turns loopback addresses (hostname, Gloo, NCCL, rendezvous)
into failures: the other nodes cannot reach them.

--plan PLAN.json: the output of `tools/ember plan RECIPE --json` (a regular file
of at most 16 MiB: written by `... --json > plan.json`); its feeding
section gives the host RAM the run needs (feeding.host_ram_bytes) and, when the
data streams from storage, the read rate the fastest GPU needs
(feeding.fastest.storage_bytes_per_s_if_streamed) and, when the recipe streams shards
(the plan's data_rate), the CPU cores per GPU decoding them at its speed
(feeding.fastest.cpu_cores_per_gpu). --ram-gib, --data-mbs and --cores-per-gpu win.
"""
import argparse
import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the shared package, embertools

from embertools.doctor.checks import CHECKS, exit_status, render, run_checks
from embertools.doctor.common import GIB, MIB, Options, PLAN_MAX_BYTES, ROOT
from embertools.doctor.facts import Probe, open_regular
from embertools.errors import UsageError


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
    """(ram_gib, data_mbs, note, cores_per_gpu) from `tools/ember plan RECIPE --json`'s output (a regular file
    of at most PLAN_MAX_BYTES: /dev/zero or a FIFO is refused, not read without end or waited on); data_mbs
    None unless the data streams, cores_per_gpu None without the plan's data_rate (data in memory)."""
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
    rate, cores, note = None, None, f"plan {Path(path).name}"
    fastest = feeding.get("fastest") if isinstance(feeding.get("fastest"), dict) else {}
    if feeding.get("streams") and fastest.get("storage_bytes_per_s_if_streamed"):
        rate = fastest["storage_bytes_per_s_if_streamed"] / 1e6
    need = fastest.get("cpu_cores_per_gpu")
    if "data_rate" in plan and isinstance(need, (int, float)) and not isinstance(need, bool) and need > 0:
        cores = float(need)
    if rate is not None or cores is not None:
        sps = fastest.get("samples_per_second") or 0
        note += f": {fastest.get('gpu')} {fastest.get('precision')} at {sps:.0f} samples/s"
    return ram, rate, note, cores


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
    p.add_argument("--cores-per-gpu", type=float, metavar="N",
                   help="CPU cores each GPU needs decoding its data (the plan's cpu_cores_per_gpu)")
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
                        ("--cores-per-gpu", a.cores_per_gpu), ("--timeout", a.timeout)):
        if value is not None and not (0 < value < float("inf")):
            raise UsageError(f"{name} {value}: must be a positive number")
    opts = Options(cpu_only=a.cpu_only, nnodes=a.nnodes, nproc=a.nproc, data=a.data, disk=a.disk,
                   ram_gib=a.ram_gib, disk_gib=a.disk_gib, data_mbs=a.data_mbs, cores_per_gpu=a.cores_per_gpu,
                   read_mib=a.read_mib, timeout=a.timeout, rdzv=parse_rdzv(a.rdzv) if a.rdzv else None)
    if a.plan:
        ram, rate, note, cores = read_plan(a.plan)
        opts.plan_note = note
        if opts.ram_gib is None:
            opts.ram_gib = ram
        if opts.data_mbs is None:
            opts.data_mbs = rate
        if opts.cores_per_gpu is None and cores is not None:
            opts.cores_per_gpu, opts.cores_note = cores, note
    return opts, only, a.json


def main(argv=None):
    try:
        opts, only, as_json = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"error: [doctor] {e}", file=sys.stderr)
        return e.exit_status
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
