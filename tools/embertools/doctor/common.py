"""The doctor's thresholds, its options and a check's result."""
import os
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]  # the clone: tools/embertools/doctor/ is three below it
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


GPU_CHECKS = ("driver", "gpus", "topology", "nccl", "shm", "nccl-socket")



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
    cores_per_gpu: float | None = None  # CPU cores each GPU needs decoding its data (the plan's data_rate)
    cores_note: str = "--cores-per-gpu"  # where cores_per_gpu came from
    read_mib: int = 256
    timeout: float = 3.0              # seconds, the rendezvous connection
    plan_note: str = ""               # where ram_gib / data_mbs / cores_per_gpu came from, when from --plan
    env: dict = field(default_factory=lambda: dict(os.environ))


@dataclass
class Result:
    name: str
    status: str
    detail: str
    todo: str = ""
