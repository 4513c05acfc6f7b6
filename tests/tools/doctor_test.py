#!/usr/bin/env python3
"""tools/doctor.py: every check on made-up facts (ok, warning, failure), the readers on this machine
and on stand-ins, and the command line end to end.

1. Each check with faked facts: the status, and a word of the message that says why. A Probe built
   with read=False raises on any fact not given, so these never read the machine.
2. The rules spelled out: CUDA driver/runtime compatibility (NVIDIA's table), NCCL_SOCKET_IFNAME's
   syntax and NCCL's own choice of interface, Gloo's address without GLOO_SOCKET_IFNAME.
3. Readers: NVML through a stand-in libnvidia-ml compiled here (skipped without a C compiler): the
   P2P index, the CUDA version's encoding, the memory struct, shutdown; torch that does not import,
   that aborts, a CPU build (fake torch packages on PYTHONPATH); getifaddrs (lo is 127.0.0.1);
   disk, memory, a data folder read whole.
4. The real doctor here: without a GPU the GPU checks say "no GPU visible" and it exits 1; with
   --cpu-only they are skipped; a rendezvous on a closed local port fails naming host and port, on
   a listening socket it is ok; bad command lines exit 2; --plan (its CPU cores per GPU with the
   plan's data_rate); tools/ember doctor forwards.

    python3 tests/tools/doctor_test.py [-v]
"""
import importlib.util
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCTOR = ROOT / "tools" / "doctor.py"

_spec = importlib.util.spec_from_file_location("doctor", DOCTOR)
doctor = importlib.util.module_from_spec(_spec)
sys.modules["doctor"] = doctor
_spec.loader.exec_module(doctor)  # the command line; it put tools/ on sys.path: the doctor's parts
from embertools import net, nvml as nvml_reader  # noqa: E402
from embertools.doctor import checks as doctor_checks, common as doctor_common, facts as doctor_facts  # noqa: E402

GIB = 1024**3
UP = net.IFF_UP | net.IFF_RUNNING


def opts(**kw):
    kw.setdefault("env", {})
    return doctor_common.Options(**kw)


def probe(o, **facts):
    return doctor_facts.Probe(o, read=False, **facts)


def judge(check, o=None, **facts):
    o = o or opts()
    return doctor_checks.CHECKS[check](probe(o, **facts), o)


def torch_facts(cuda="13.0", nccl=(2, 28, 9), device_count=8, **kw):
    return {"python": "/venv/bin/python", "version": "2.11.0+cu130" if cuda else "2.11.0+cpu", "cuda": cuda,
            "path": "/venv/lib/python3.11/site-packages/torch", "nccl": list(nccl) if nccl else None,
            "device_count": device_count, **kw}


def build_facts(torch_dir="/venv/lib/python3.11/site-packages/torch/share/cmake/Torch", cuda="13.0"):
    return {"dir": "/src/build", "torch_dir": torch_dir, "cuda": cuda, "ember_cuda": "ON"}


def nvml_facts(n=8, name="NVIDIA H200", total_gib=139.8, used_gib=0.5, nvlink=True, path="SYS",
               driver="580.95.05", cuda=(13, 0)):
    gpus = [{"index": i, "name": name, "memory_total": int(total_gib * GIB), "memory_used": int(used_gib * GIB)}
            for i in range(n)]
    links = [{"a": i, "b": j, "nvlink": nvlink, "path": path} for i in range(n) for j in range(i + 1, n)]
    return {"driver": driver, "cuda_driver": list(cuda) if cuda else None, "gpus": gpus, "links": links}


NO_NVML = {"error": "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"}


def iface(name, address, family=4, flags=UP):
    if name == "lo":
        flags |= net.IFF_LOOPBACK
    return {"name": name, "family": family, "address": address, "flags": flags}


# A typical cloud node: loopback, the node's NIC, docker's bridge.
NODE_IFACES = [iface("lo", "127.0.0.1"), iface("eth0", "10.0.0.5"), iface("docker0", "172.17.0.1"),
               iface("lo", "::1", 6), iface("eth0", "fe80::1", 6)]


def hostname_facts(addresses=("10.0.0.5",), fqdn="node1.cluster", fqdn_addresses=None):
    return {"hostname": "node1", "hostname_addresses": list(addresses), "fqdn": fqdn,
            "fqdn_addresses": list(fqdn_addresses if fqdn_addresses is not None else addresses)}


class Torch(unittest.TestCase):
    def test_cuda_build_ok(self):
        r = judge("torch", torch=torch_facts(), build=build_facts())
        self.assertEqual((r.status, "CUDA 13.0" in r.detail), ("ok", True), r)
        self.assertIn("links it", r.detail)
        r = judge("torch", torch=torch_facts(), build={"dir": "/src/build", "missing": True})
        self.assertEqual((r.status, "no Ember build" in r.detail), ("ok", True), r)

    def test_build_links_another_libtorch(self):
        r = judge("torch", torch=torch_facts(), build=build_facts("/opt/libtorch/share/cmake/Torch", "12.8"))
        self.assertEqual(r.status, "warning")
        self.assertIn("/opt/libtorch", r.detail)
        self.assertIn("CUDA 12.8", r.detail)

    def test_import_failure_is_a_failure_with_its_error(self):
        r = judge("torch", torch={"python": "/usr/bin/python3", "error": "OSError: libcudart.so.13: cannot open"})
        self.assertEqual(r.status, "failure")
        self.assertIn("does not import", r.detail)
        self.assertIn("libcudart.so.13", r.detail)
        self.assertIn("tools/ember setup", r.todo)

    def test_cpu_build(self):
        r = judge("torch", torch=torch_facts(cuda=None))
        self.assertEqual(r.status, "failure")
        self.assertIn("CPU-only build", r.detail)
        self.assertEqual(judge("torch", opts(cpu_only=True), torch=torch_facts(cuda=None)).status, "ok")


class CudaCompatibility(unittest.TestCase):
    def test_rule(self):
        rule = doctor_checks.cuda_compatibility
        self.assertEqual(rule((13, 0), (13, 0), "580.65.06")[0], "ok")
        self.assertEqual(rule((12, 4), (13, 0), "580.65.06")[0], "ok")    # backward compatibility
        s, detail, todo = rule((13, 1), (13, 0), "580.65.06")            # minor version compatibility
        self.assertEqual(s, "warning")
        self.assertIn("minor version compatibility", detail)
        self.assertIn(">= 580", todo)
        s, detail, _ = rule((12, 8), (12, 0), "520.61.05")              # below CUDA 12's minimum (525.60.13)
        self.assertEqual(s, "failure")
        self.assertIn("525.60.13", detail)
        self.assertEqual(rule((12, 8), (12, 2), "535.104.05")[0], "warning")
        s, detail, todo = rule((13, 0), (12, 8), "570.124.06")           # an older major
        self.assertEqual(s, "failure")
        self.assertIn("cudaErrorInsufficientDriver", detail)
        self.assertIn("cuda-compat", todo)

    def test_driver_check(self):
        r = judge("driver", torch=torch_facts(cuda="13.0"), nvml=nvml_facts(cuda=(12, 8), driver="570.124.06"))
        self.assertEqual(r.status, "failure")
        self.assertIn("CUDA 12.8", r.detail)
        r = judge("driver", torch=torch_facts(cuda="13.0"), nvml=nvml_facts())
        self.assertEqual(r.status, "ok")
        self.assertIn("580.95.05", r.detail)
        # torch does not import: the CUDA of the LibTorch the build links is judged.
        r = judge("driver", torch={"python": "python3", "error": "ModuleNotFoundError"},
                  build=build_facts(cuda="13.2"), nvml=nvml_facts())
        self.assertEqual(r.status, "warning")
        self.assertIn("Ember's build is built for CUDA 13.2", r.detail)
        r = judge("driver", torch=torch_facts(), nvml=NO_NVML)
        self.assertEqual(r.status, "failure")
        self.assertIn("no GPU visible", r.detail)
        self.assertEqual(judge("driver", opts(cpu_only=True)).status, "skipped")


class Gpus(unittest.TestCase):
    def test_eight_h200(self):
        r = judge("gpus", torch=torch_facts(), nvml=nvml_facts())
        self.assertEqual(r.status, "ok", r)
        self.assertIn("8 x NVIDIA H200 (139.8 GiB)", r.detail)

    def test_no_gpu(self):
        r = judge("gpus", torch=torch_facts(device_count=0), nvml=NO_NVML)
        self.assertEqual(r.status, "failure")
        self.assertIn("no NVIDIA GPU visible", r.detail)
        self.assertIn("--gpus", r.todo)
        self.assertEqual(judge("gpus", opts(cpu_only=True)).status, "skipped")

    def test_torch_sees_none(self):
        o = opts(env={"CUDA_VISIBLE_DEVICES": ""})
        r = judge("gpus", o, torch=torch_facts(device_count=0, cuda_error="CUDA driver initialization failed"),
                  nvml=nvml_facts(n=2))
        self.assertEqual(r.status, "failure")
        self.assertIn("torch sees none", r.detail)
        self.assertIn("CUDA_VISIBLE_DEVICES=", r.detail)

    def test_fewer_than_nproc(self):
        r = judge("gpus", opts(nproc=8), torch=torch_facts(device_count=4), nvml=nvml_facts(n=4))
        self.assertEqual(r.status, "failure")
        self.assertIn("--nproc 8", r.detail)
        self.assertEqual(judge("gpus", opts(nproc=4), torch=torch_facts(device_count=4),
                               nvml=nvml_facts(n=4)).status, "ok")

    def test_mixed_and_busy(self):
        n = nvml_facts(n=2)
        n["gpus"][1].update(name="NVIDIA A100-SXM4-40GB", memory_total=40 * GIB)
        r = judge("gpus", torch=torch_facts(device_count=2), nvml=n)
        self.assertEqual(r.status, "warning")
        self.assertIn("differ", r.detail)
        n = nvml_facts(n=2)
        n["gpus"][1]["memory_used"] = 30 * GIB
        r = judge("gpus", torch=torch_facts(device_count=2), nvml=n)
        self.assertEqual(r.status, "warning")
        self.assertIn("GPU 1 30.0 GiB", r.detail)


class Topology(unittest.TestCase):
    def test_nvlink_everywhere(self):
        r = judge("topology", nvml=nvml_facts(nvlink=True))
        self.assertEqual(r.status, "ok")
        self.assertIn("NVLink between every pair", r.detail)

    def test_pcie_pairs(self):
        n = nvml_facts(n=4, nvlink=True)
        for link in n["links"]:
            if link["b"] == 3:
                link.update(nvlink=False, path="PHB")
        r = judge("topology", nvml=n)
        self.assertEqual(r.status, "warning")
        self.assertIn("3 of 6", r.detail)
        self.assertIn("GPU0-GPU3 PHB", r.detail)
        self.assertIn("PCIe", r.detail)
        self.assertIn("fabricmanager", r.todo)

    def test_one_or_none(self):
        self.assertEqual(judge("topology", nvml=nvml_facts(n=1)).status, "ok")
        r = judge("topology", nvml=NO_NVML)
        self.assertEqual(r.status, "skipped")
        self.assertIn("no GPU visible", r.detail)


class Nccl(unittest.TestCase):
    def test_version(self):
        r = judge("nccl", torch=torch_facts())
        self.assertEqual((r.status, "2.28.9" in r.detail), ("ok", True))

    def test_no_nccl(self):
        r = judge("nccl", torch=torch_facts(cuda=None, nccl=None))
        self.assertEqual(r.status, "failure")
        self.assertIn("no NCCL", r.detail)

    def test_disabled_transports(self):
        r = judge("nccl", opts(env={"NCCL_P2P_DISABLE": "1"}), torch=torch_facts())
        self.assertEqual(r.status, "warning")
        self.assertIn("NCCL_P2P_DISABLE=1", r.detail)
        # No InfiniBand matters between nodes only.
        self.assertEqual(judge("nccl", opts(env={"NCCL_IB_DISABLE": "1"}), torch=torch_facts()).status, "ok")
        self.assertEqual(judge("nccl", opts(nnodes=2, env={"NCCL_IB_DISABLE": "1"}),
                               torch=torch_facts()).status, "warning")


class Shm(unittest.TestCase):
    def test_docker_default(self):
        r = judge("shm", shm={"total": 64 * 1024**2})
        self.assertEqual(r.status, "warning")
        self.assertIn("64 MiB", r.detail)
        self.assertIn("--shm-size", r.todo)
        self.assertEqual(judge("shm", shm={"total": 16 * GIB}).status, "ok")


class NcclSocket(unittest.TestCase):
    NAMES = ["lo", "eth0", "eth1", "ens5", "docker0", "ib0"]

    def test_syntax(self):
        m = net.nccl_match
        self.assertEqual(m("eth", self.NAMES), ["eth0", "eth1"])            # prefixes
        self.assertEqual(m("eth0,ens", self.NAMES), ["eth0", "ens5"])       # a list
        self.assertEqual(m("=eth", self.NAMES), [])                         # '=': exact names
        self.assertEqual(m("=eth1", self.NAMES), ["eth1"])
        self.assertEqual(m("^docker,lo", self.NAMES), ["eth0", "eth1", "ens5", "ib0"])  # '^' excludes
        self.assertEqual(m("^=eth0", self.NAMES), ["lo", "eth1", "ens5", "docker0", "ib0"])
        self.assertEqual(m("eth0:29500", self.NAMES), ["eth0"])             # name:port

    def test_own_choice(self):
        pick = net.nccl_socket_interfaces
        self.assertEqual(pick(NODE_IFACES, {})[0][0], ("eth0", "10.0.0.5"))
        ib = NODE_IFACES + [iface("ib0", "192.168.1.5")]
        self.assertEqual(pick(ib, {})[0][0][0], "ib0")                      # InfiniBand first
        only = [iface("lo", "127.0.0.1"), iface("docker0", "172.17.0.1")]
        self.assertEqual(pick(only, {})[0][0][0], "docker0")                # then docker, then lo
        self.assertEqual(pick([iface("lo", "127.0.0.1")], {})[0][0][0], "lo")
        down = [iface("lo", "127.0.0.1"), iface("eth0", "10.0.0.5", flags=net.IFF_UP)]  # not running
        self.assertEqual(pick(down, {})[0][0][0], "lo")
        v6 = [iface("lo", "::1", 6), iface("eth0", "fd00::5", 6)]           # IPv6 loopback skipped
        self.assertEqual(pick(v6, {})[0], [("eth0", "fd00::5")])
        self.assertEqual(pick([iface("lo", "::1", 6)], {})[0], [])
        self.assertEqual(pick(NODE_IFACES, {"NCCL_SOCKET_FAMILY": "AF_INET6"})[0], [("eth0", "fe80::1")])

    def test_named_interface_missing(self):
        r = judge("nccl-socket", opts(env={"NCCL_SOCKET_IFNAME": "ens"}), interfaces=NODE_IFACES)
        self.assertEqual(r.status, "failure")
        self.assertIn("NCCL_SOCKET_IFNAME=ens matches no", r.detail)
        self.assertIn("NCCL_SOCKET_IFNAME=eth0", r.todo)
        r = judge("nccl-socket", opts(env={"NCCL_SOCKET_IFNAME": "=eth0"}), interfaces=NODE_IFACES)
        self.assertEqual((r.status, "eth0 (10.0.0.5)" in r.detail), ("ok", True), r)

    def test_one_character_ignored(self):
        r = judge("nccl-socket", opts(env={"NCCL_SOCKET_IFNAME": "e"}), interfaces=NODE_IFACES)
        self.assertEqual(r.status, "warning")
        self.assertIn("one-character", r.detail)

    def test_loopback_across_nodes(self):
        lo_only = [iface("lo", "127.0.0.1")]
        self.assertEqual(judge("nccl-socket", interfaces=lo_only).status, "ok")  # one node: fine
        r = judge("nccl-socket", opts(nnodes=2), interfaces=lo_only)
        self.assertEqual(r.status, "failure")
        self.assertIn("cannot reach", r.detail)

    def test_several_candidates_across_nodes(self):
        two = NODE_IFACES + [iface("ens5", "10.1.0.5")]
        r = judge("nccl-socket", opts(nnodes=2), interfaces=two)
        self.assertEqual(r.status, "warning")
        self.assertIn("ens5", r.detail)
        self.assertEqual(judge("nccl-socket", opts(nnodes=2, env={"NCCL_SOCKET_IFNAME": "ens5"}),
                               interfaces=two).status, "ok")


class GlooSocket(unittest.TestCase):
    def test_named_interface(self):
        r = judge("gloo-socket", opts(env={"GLOO_SOCKET_IFNAME": "eth0,eth9"}), interfaces=NODE_IFACES)
        self.assertEqual(r.status, "failure")
        self.assertIn("eth9", r.detail)
        self.assertIn("GLOO_SOCKET_IFNAME=eth0", r.todo)
        r = judge("gloo-socket", opts(env={"GLOO_SOCKET_IFNAME": "eth0"}), interfaces=NODE_IFACES)
        self.assertEqual((r.status, "eth0 (10.0.0.5)" in r.detail), ("ok", True), r)
        # Gloo names are exact: "eth" is no interface.
        self.assertEqual(judge("gloo-socket", opts(env={"GLOO_SOCKET_IFNAME": "eth"}),
                               interfaces=NODE_IFACES).status, "failure")

    def test_hostname_address(self):
        r = judge("gloo-socket", opts(nnodes=2), interfaces=NODE_IFACES, hostname=hostname_facts())
        self.assertEqual(r.status, "ok")
        self.assertIn("10.0.0.5", r.detail)

    def test_hostname_on_loopback(self):
        facts = dict(interfaces=NODE_IFACES, hostname=hostname_facts(["127.0.1.1"]))
        r = judge("gloo-socket", opts(nnodes=2), **facts)
        self.assertEqual(r.status, "failure")
        self.assertIn("127.0.1.1", r.detail)
        self.assertIn("GLOO_SOCKET_IFNAME=eth0", r.todo)
        self.assertEqual(judge("gloo-socket", opts(nnodes=1), **facts).status, "ok")

    def test_stale_hosts_entry_falls_back_to_loopback(self):
        r = judge("gloo-socket", opts(nnodes=2), interfaces=NODE_IFACES, hostname=hostname_facts(["10.9.9.9"]))
        self.assertEqual(r.status, "failure")
        self.assertIn("127.0.0.1", r.detail)
        self.assertIn("no interface here has", r.detail)


class Hostname(unittest.TestCase):
    def test_loopback_across_nodes(self):
        facts = dict(interfaces=NODE_IFACES, hostname=hostname_facts(["127.0.1.1"], fqdn="localhost"))
        r = judge("hostname", opts(nnodes=2), **facts)
        self.assertEqual(r.status, "failure")
        self.assertIn("MASTER_ADDR", r.detail)
        self.assertIn("--local-addr 10.0.0.5", r.todo)
        self.assertEqual(judge("hostname", opts(nnodes=1), **facts).status, "ok")

    def test_unresolvable(self):
        h = hostname_facts()
        h["fqdn_addresses"] = {"error": "[Errno -2] Name or service not known"}
        r = judge("hostname", opts(nnodes=2), interfaces=NODE_IFACES, hostname=h)
        self.assertEqual(r.status, "failure")
        self.assertIn("does not resolve", r.detail)

    def test_good(self):
        r = judge("hostname", opts(nnodes=2), interfaces=NODE_IFACES, hostname=hostname_facts())
        self.assertEqual((r.status, "node1.cluster" in r.detail), ("ok", True))


class Rendezvous(unittest.TestCase):
    def rdzv(self, connect, addresses=("10.0.0.8",)):
        return {"host": "head", "port": 29400, "addresses": list(addresses), "connect": connect}

    def test_not_given(self):
        self.assertEqual(judge("rendezvous").status, "skipped")
        r = judge("rendezvous", opts(nnodes=2))
        self.assertEqual(r.status, "warning")
        self.assertIn("--rdzv", r.todo)

    def test_open(self):
        r = judge("rendezvous", opts(rdzv=("head", 29400)), rendezvous=self.rdzv({"10.0.0.8": "open"}))
        self.assertEqual(r.status, "ok")
        self.assertIn("head:29400", r.detail)

    def test_refused_and_timeout(self):
        o = opts(rdzv=("head", 29400))
        r = judge("rendezvous", o, rendezvous=self.rdzv({"10.0.0.8": "refused"}), interfaces=NODE_IFACES)
        self.assertEqual(r.status, "failure")
        self.assertIn("head:29400 (10.0.0.8) refused", r.detail)
        r = judge("rendezvous", o, rendezvous=self.rdzv({"10.0.0.8": "timeout"}), interfaces=NODE_IFACES)
        self.assertEqual(r.status, "failure")
        self.assertIn("firewall", r.detail)

    def test_unresolved(self):
        r = judge("rendezvous", opts(rdzv=("head", 29400)),
                  rendezvous={"host": "head", "port": 29400, "error": "[Errno -2] Name or service not known"})
        self.assertEqual(r.status, "failure")
        self.assertIn("does not resolve", r.detail)

    def test_loopback_across_nodes(self):
        facts = self.rdzv({"127.0.1.1": "open"}, addresses=["127.0.1.1"])
        r = judge("rendezvous", opts(nnodes=2, rdzv=("head", 29400)), rendezvous=facts)
        self.assertEqual(r.status, "failure")
        self.assertIn("loopback", r.detail)
        self.assertIn("--local-addr", r.todo)
        self.assertEqual(judge("rendezvous", opts(rdzv=("head", 29400)), rendezvous=facts).status, "ok")


def disk_facts(free_gib=500, rotational=0):
    return {"path": "/data/runs", "existing": "/data/runs", "free": free_gib * GIB, "total": 1000 * GIB,
            "mount": "/data", "fstype": "ext4", "source": "/dev/nvme1n1", "disk": "nvme1n1", "rotational": rotational}


class Disk(unittest.TestCase):
    def test_against_need(self):
        self.assertEqual(judge("disk", opts(disk_gib=100), disk=disk_facts()).status, "ok")
        r = judge("disk", opts(disk_gib=800), disk=disk_facts())
        self.assertEqual(r.status, "failure")
        self.assertIn("800 GiB", r.detail)

    def test_low_and_rotational(self):
        r = judge("disk", disk=disk_facts(free_gib=3))
        self.assertEqual(r.status, "warning")
        self.assertIn("10 GiB", r.todo)
        r = judge("disk", disk=disk_facts(rotational=1))
        self.assertEqual(r.status, "warning")
        self.assertIn("rotational", r.detail)


class Ram(unittest.TestCase):
    MEM = {"MemTotal": 2048 * GIB, "MemAvailable": 1900 * GIB}

    def test_against_need(self):
        self.assertEqual(judge("ram", opts(ram_gib=256), meminfo=self.MEM).status, "ok")
        r = judge("ram", opts(ram_gib=4096), meminfo=self.MEM)
        self.assertEqual(r.status, "failure")
        self.assertIn("4096 GiB", r.detail)

    def test_small_node(self):
        small = {"MemTotal": 32 * GIB, "MemAvailable": 30 * GIB}
        r = judge("ram", meminfo=small)
        self.assertEqual(r.status, "warning")
        self.assertIn("64 GiB", r.detail)
        self.assertEqual(judge("ram", opts(cpu_only=True), meminfo=small).status, "ok")


class Data(unittest.TestCase):
    def data(self, mbs):
        return {"path": "/data/imagenet", "fstype": "nfs4", "bytes": int(mbs * 1e6 * 2), "files": 100,
                "seconds": 2.0, "unreadable": 0}

    def test_against_need(self):
        o = opts(data=Path("/data/imagenet"), data_mbs=800)
        r = judge("data", o, data=self.data(300))
        self.assertEqual(r.status, "warning")
        self.assertIn("300 MB/s", r.detail)
        self.assertIn("800 MB/s", r.detail)
        self.assertEqual(judge("data", o, data=self.data(1200)).status, "ok")

    def test_slow_without_need(self):
        r = judge("data", opts(data=Path("/data/imagenet")), data=self.data(50))
        self.assertEqual(r.status, "warning")
        self.assertIn("network file system", r.detail)
        self.assertEqual(judge("data", opts(data=Path("/d")), data=self.data(900)).status, "ok")

    def test_missing(self):
        self.assertEqual(judge("data").status, "skipped")
        r = judge("data", opts(data=Path("/nope")), data={"path": "/nope", "error": "does not exist"})
        self.assertEqual(r.status, "failure")
        self.assertIn("does not exist", r.detail)


class Cpu(unittest.TestCase):
    """CPU cores per GPU here against what decoding the streamed shards needs per GPU."""

    def test_enough_and_short(self):
        need = 11.08  # 12 cores to have
        r = judge("cpu", opts(cores_per_gpu=need, nproc=8), cpus={"count": 96, "affinity": 96})
        self.assertEqual(r.status, "ok", r)
        self.assertIn("96 CPU cores for 8 GPUs (--nproc 8): 12 per GPU", r.detail)
        self.assertIn("12 cores per GPU needed (11.1; --cores-per-gpu)", r.detail)
        # A cpuset of 64 of the 96: 8 a GPU, fewer than the 11.08 needed.
        r = judge("cpu", opts(cores_per_gpu=need, nproc=8), cpus={"count": 96, "affinity": 64})
        self.assertEqual(r.status, "warning", r)
        self.assertTrue(r.detail.startswith("the GPUs will wait for data: 12 cores per GPU needed"), r.detail)
        self.assertIn("8 here: 64 CPU cores (of 96: this process's affinity) for 8 GPUs", r.detail)
        self.assertIn("data.stream.dct_scaling", r.todo)
        # Cores are shared by all GPUs: 89 of them feed 8 GPUs at 11.08 each (88.64), 88 do not.
        self.assertEqual(judge("cpu", opts(cores_per_gpu=need, nproc=8), cpus={"count": 89, "affinity": 89}).status,
                         "ok")
        self.assertEqual(judge("cpu", opts(cores_per_gpu=need, nproc=8), cpus={"count": 88, "affinity": 88}).status,
                         "warning")

    def test_from_the_plan(self):
        o = opts(cores_per_gpu=20.0, nproc=1, cores_note="plan plan.json: H200 bf16-mixed at 16250 samples/s")
        r = judge("cpu", o, cpus={"count": 16, "affinity": None})  # no affinity call: os.cpu_count()
        self.assertEqual(r.status, "warning")
        self.assertIn("20 cores per GPU needed at the plan's speed (plan plan.json: H200 bf16-mixed at 16250 "
                      "samples/s), 16 here: 16 CPU cores for 1 GPU (--nproc 1)", r.detail)

    def test_gpus_counted_as_the_gpus_check_does(self):
        cpus = {"count": 64, "affinity": 64}
        r = judge("cpu", opts(cores_per_gpu=6), cpus=cpus, torch=torch_facts(device_count=8))
        self.assertEqual(r.status, "ok")
        self.assertIn("64 CPU cores for 8 GPUs (as torch sees them): 8 per GPU", r.detail)
        r = judge("cpu", opts(cores_per_gpu=6), cpus=cpus, torch=torch_facts(device_count=0), nvml=nvml_facts(n=4))
        self.assertIn("for 4 GPUs (as the driver lists them): 16 per GPU", r.detail)
        r = judge("cpu", opts(cores_per_gpu=6), cpus=cpus, torch={"python": "p", "error": "ImportError"}, nvml=NO_NVML)
        self.assertEqual(r.status, "skipped")
        self.assertIn("no GPU visible", r.detail)

    def test_skipped(self):
        r = judge("cpu")  # no need given: no fact read (the probe would raise)
        self.assertEqual(r.status, "skipped")
        self.assertIn("--cores-per-gpu", r.detail)
        self.assertEqual(judge("cpu", opts(cores_per_gpu=4, cpu_only=True)).status, "skipped")


class Summary(unittest.TestCase):
    def test_exit_and_table(self):
        ok, warn, fail = (doctor_common.Result("a", "ok", "fine"), doctor_common.Result("b", "warning", "hm", "do x"),
                          doctor_common.Result("c", "failure", "bad", "do y"))
        self.assertEqual(doctor_checks.exit_status([ok, warn]), 0)
        self.assertEqual(doctor_checks.exit_status([ok, warn, fail]), 1)
        lines = doctor_checks.render([ok, warn, fail]).splitlines()
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[2].startswith("failure  c  bad"), lines)
        self.assertIn("do y", lines[2])
        self.assertIn("1 failure", lines[3])

    def test_unit_probes_never_read(self):
        with self.assertRaises(KeyError):
            judge("ram")


# A stand-in libnvidia-ml: three GPUs, NVLink between 0 and 1 only (asked with the NVLink index),
# GPU 2 behind the CPU interconnect (SYS) with 5 GiB in use; CUDA 13.1 encoded as cuda.h does (13010).
FAKE_NVML = r"""
#include <stdio.h>
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
static int devs[3] = {0, 1, 2};
static int live = 0;
int fake_live(void) { return live; }
const char* nvmlErrorString(int rc) { return rc == 2 ? "Invalid Argument" : "Unknown Error"; }
int nvmlInit_v2(void) { ++live; return 0; }
int nvmlShutdown(void) { --live; return 0; }
int nvmlSystemGetDriverVersion(char* v, unsigned n) { strncpy(v, "590.44.01", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int* v) { *v = 13010; return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { *n = 3; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, int** h) { if (i >= 3) return 2; *h = &devs[i]; return 0; }
int nvmlDeviceGetName(int* h, char* s, unsigned n) { snprintf(s, n, "Fake H200 %d", *h); return 0; }
int nvmlDeviceGetMemoryInfo(int* h, mem_t* m) {
  m->total = 141ull << 30; m->used = *h == 2 ? 5ull << 30 : 1ull << 29; m->free = m->total - m->used; return 0;
}
int nvmlDeviceGetP2PStatus(int* a, int* b, int index, int* status) {
  *status = (index == 2 && *a < 2 && *b < 2) ? 0 : 5;  /* NVML_P2P_CAPS_INDEX_NVLINK; OK or NOT_SUPPORTED */
  return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(int* a, int* b, int* level) { *level = (*a < 2 && *b < 2) ? 10 : 50; return 0; }
"""


class Readers(unittest.TestCase):
    def test_nvml_stand_in(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler to build the stand-in libnvidia-ml")
        with tempfile.TemporaryDirectory() as tmp:
            src, lib = Path(tmp) / "fake_nvml.c", Path(tmp) / "libfake_nvml.so"
            src.write_text(FAKE_NVML)
            subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
            facts = nvml_reader.read_nvml(str(lib))
            self.assertEqual(facts["driver"], "590.44.01")
            self.assertEqual(facts["cuda_driver"], [13, 1])
            self.assertEqual([g["name"] for g in facts["gpus"]], ["Fake H200 0", "Fake H200 1", "Fake H200 2"])
            self.assertEqual(facts["gpus"][0]["memory_total"], 141 * GIB)
            self.assertEqual(facts["gpus"][2]["memory_used"], 5 * GIB)
            links = {(l["a"], l["b"]): (l["nvlink"], l["path"]) for l in facts["links"]}
            self.assertEqual(links, {(0, 1): (True, "PIX"), (0, 2): (False, "SYS"), (1, 2): (False, "SYS")})
            import ctypes
            self.assertEqual(ctypes.CDLL(str(lib)).fake_live(), 0, "nvmlShutdown not called")
            o = opts()
            r = doctor_checks.check_topology(probe(o, nvml=facts), o)
            self.assertEqual(r.status, "warning")
            self.assertIn("GPU0-GPU2 SYS", r.detail)

    def test_nvml_missing(self):
        facts = nvml_reader.read_nvml("libno_such_nvml.so.1")
        self.assertIn("libno_such_nvml.so.1", facts["error"])

    def fake_torch(self, body):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        (Path(tmp) / "torch").mkdir()
        (Path(tmp) / "torch" / "__init__.py").write_text(body)
        return doctor_facts.read_torch(env={**os.environ, "PYTHONPATH": tmp}, timeout=60)

    def test_torch_that_does_not_import(self):
        facts = self.fake_torch('raise OSError("libcudart.so.13: cannot open shared object file")\n')
        self.assertIn("OSError: libcudart.so.13", facts["error"])
        facts = self.fake_torch("import os\nos.abort()\n")
        self.assertIn("exit status", facts["error"])
        o = opts()
        self.assertEqual(doctor_checks.check_torch(probe(o, torch=facts), o).status, "failure")

    def test_torch_cpu_build(self):
        facts = self.fake_torch("__version__ = '2.11.0+cpu'\nclass version:\n    cuda = None\n"
                                "class cuda:\n    device_count = staticmethod(lambda: 0)\n")
        self.assertEqual((facts["version"], facts["cuda"], facts["nccl"], facts["device_count"]),
                         ("2.11.0+cpu", None, None, 0))

    def test_interfaces_here(self):
        facts = net.read_interfaces()
        lo = [i for i in facts if i["name"] == "lo" and i["family"] == 4]
        self.assertEqual([i["address"] for i in lo], ["127.0.0.1"], facts)
        self.assertTrue(lo[0]["flags"] & net.IFF_LOOPBACK and lo[0]["flags"] & net.IFF_UP)

    def test_disk_memory_data_here(self):
        with tempfile.TemporaryDirectory() as tmp:
            d = doctor_facts.read_disk(Path(tmp) / "not" / "yet")
            self.assertEqual(d["existing"], tmp)
            self.assertGreater(d["total"], 0)
            for i, size in enumerate((3_000_000, 1_000, 0)):
                (Path(tmp) / f"part{i}").write_bytes(b"x" * size)
            (Path(tmp) / "sub").mkdir()
            (Path(tmp) / "sub" / "more").write_bytes(b"y" * 500)
            r = doctor_facts.read_data(tmp, 1 << 30)
            self.assertEqual((r["bytes"], r["files"]), (3_001_500, 4))
            self.assertEqual(doctor_facts.read_data(tmp, 1_000_000)["bytes"], 1_000_000)  # --read-mib caps it
        self.assertIn("error", doctor_facts.read_data("/no/such/folder", 1))
        m = doctor_facts.read_meminfo()
        self.assertGreater(m["MemTotal"], m["MemAvailable"] - 1)


def run_doctor(*args, driver=False, timeout=240, memory_cap=None):
    """The doctor's (exit status, stdout, stderr); `memory_cap` bytes of address space (RLIMIT_AS) so
    that a doctor that reads without end fails (MemoryError) instead of filling this machine."""
    cmd = [str(ROOT / "tools" / "ember"), "doctor"] if driver else [sys.executable, str(DOCTOR)]

    def cap():
        if memory_cap:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    p = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       preexec_fn=cap)
    return p.returncode, p.stdout, p.stderr


class ThisMachine(unittest.TestCase):
    def test_full_run(self):
        rc, out, err = run_doctor("--json")
        report = json.loads(out)
        status = {c["name"]: c for c in report["checks"]}
        self.assertEqual(list(status), list(doctor_checks.CHECKS))
        self.assertEqual(rc, report["exit"])
        self.assertEqual(rc, 1 if any(c["status"] == "failure" for c in report["checks"]) else 0)
        if report["facts"]["nvml"].get("error"):  # no NVIDIA driver here
            self.assertEqual(rc, 1)
            self.assertEqual(status["driver"]["status"], "failure")
            self.assertIn("no GPU visible", status["driver"]["detail"])
            self.assertEqual(status["gpus"]["status"], "failure")
            self.assertIn("no NVIDIA GPU visible", status["gpus"]["detail"])
            self.assertEqual(status["topology"]["status"], "skipped")
            self.assertIn("no GPU visible", status["topology"]["detail"])
        rc, text, _ = run_doctor()
        self.assertEqual(len(text.strip().splitlines()), len(doctor_checks.CHECKS) + 2)  # header, checks, summary
        self.assertTrue(text.strip().endswith(f"exit {rc}"), text)

    def test_cpu_only(self):
        rc, out, _ = run_doctor("--cpu-only", "--json")
        checks = {c["name"]: c["status"] for c in json.loads(out)["checks"]}
        for name in doctor_common.GPU_CHECKS:
            self.assertEqual(checks[name], "skipped", name)
        self.assertEqual(rc, 1 if "failure" in checks.values() else 0)

    def test_rendezvous_closed_and_open(self):
        with socket.socket() as s:  # a port nothing listens on: bound, then closed
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rc, out, _ = run_doctor("--only", "rendezvous", "--rdzv", f"127.0.0.1:{port}")
        self.assertEqual(rc, 1, out)
        self.assertIn("failure", out)
        self.assertIn(f"127.0.0.1:{port}", out)
        self.assertIn("refused", out)
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            port = server.getsockname()[1]
            rc, out, _ = run_doctor("--only", "rendezvous", "--rdzv", f"localhost:{port}")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, rf"ok +rendezvous +localhost:{port} \(127\.0\.0\.1\) accepts")

    def test_bad_command_lines(self):
        for args, word in ((["--rdzv", "head"], "HOST:PORT"), (["--rdzv", "head:0"], "HOST:PORT"),
                           (["--only", "gpu"], "no such check"), (["--nnodes", "0"], "--nnodes"),
                           (["--ram-gib", "nan"], "--ram-gib"), (["--plan", "/no/such/plan.json"], "--plan"),
                           (["--cores-per-gpu", "0"], "--cores-per-gpu")):
            rc, _, err = run_doctor(*args)
            self.assertEqual(rc, 2, args)
            self.assertIn(word, err, args)

    def test_plan(self):
        with tempfile.TemporaryDirectory() as tmp:
            plan = Path(tmp) / "plan.json"
            plan.write_text(json.dumps({"feeding": {"host_ram_bytes": 10 * 1024**4, "streams": True, "fastest": {
                "gpu": "H200", "precision": "bf16-mixed", "samples_per_second": 9000,
                "storage_bytes_per_s_if_streamed": 2.5e9}}}))
            rc, out, _ = run_doctor("--only", "ram", "--plan", plan)
            self.assertEqual(rc, 1, out)
            self.assertIn("10240 GiB (plan plan.json", out)
            self.assertEqual(doctor.read_plan(plan)[1], 2500.0)
            (Path(tmp) / "bad.json").write_text("{}")
            self.assertEqual(run_doctor("--plan", Path(tmp) / "bad.json")[0], 2)
            self.assertIsNone(doctor.read_plan(plan)[3])  # no data_rate: no CPU need
            rc, out, _ = run_doctor("--only", "cpu", "--plan", plan, "--nproc", "1")
            self.assertRegex(out, r"skipped +cpu +no need given")

    def test_plan_with_a_data_rate(self):
        """A plan of a recipe streaming shards: the fastest GPU's CPU cores, far more than this machine has
        (warning, exit 0); --cores-per-gpu wins over it."""
        with tempfile.TemporaryDirectory() as tmp:
            plan = Path(tmp) / "plan.json"
            plan.write_text(json.dumps({"data_rate": {"images_per_core_second": 812.5, "samples": 2438,
                                                      "seconds": 3.0, "decode_threads": 1},
                                        "feeding": {"host_ram_bytes": GIB, "streams": False, "fastest": {
                                            "gpu": "H200", "precision": "bf16-mixed", "samples_per_second": 8.125e6,
                                            "storage_bytes_per_s_if_streamed": 2.5e9, "cpu_cores_per_gpu": 10000.0}}}))
            self.assertEqual(doctor.read_plan(plan)[3], 10000.0)
            rc, out, _ = run_doctor("--only", "cpu", "--plan", plan, "--nproc", "1")
            self.assertEqual(rc, 0, out)
            self.assertIn("warning  cpu  the GPUs will wait for data: 10000 cores per GPU needed at the plan's speed "
                          "(plan plan.json: H200 bf16-mixed at 8125000 samples/s)", out)
            rc, out, _ = run_doctor("--only", "cpu", "--plan", plan, "--nproc", "1", "--cores-per-gpu", "0.001")
            self.assertEqual(rc, 0, out)
            self.assertRegex(out, r"ok +cpu +\d+ CPU cores.* for 1 GPU \(--nproc 1\): .*1 core per GPU needed "
                                  r"\(0\.001; --cores-per-gpu\)")

    def test_plan_that_is_no_file(self):
        """--plan /dev/zero was read without end (then the OOM killer, or a MemoryError traceback), a FIFO
        with no writer waited forever, a huge file was read whole: each is a bad command line (2) now."""
        with tempfile.TemporaryDirectory() as tmp:
            fifo = Path(tmp) / "plan.fifo"
            os.mkfifo(fifo)
            big = Path(tmp) / "big.json"
            with open(big, "wb") as f:  # sparse: its size, not its disk
                f.truncate(doctor_common.PLAN_MAX_BYTES + 1)
            for plan, word in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                               (big, "over 16 MiB")):
                # A hang is a failure of the test (TimeoutExpired), not of the suite's time budget.
                rc, _, err = run_doctor("--only", "ram", "--plan", plan, timeout=60, memory_cap=2 * GIB)
                self.assertEqual(rc, 2, (plan, err[-2000:]))
                self.assertIn(f"--plan {plan}: {word}", err)
                self.assertNotIn("Traceback", err)

    def test_data_with_a_fifo_and_a_device(self):
        """A FIFO under --data made the read wait forever; a symlink to /dev/zero was read as a
        multi-GB/s disk. Both are skipped and counted; only the regular file is read."""
        with tempfile.TemporaryDirectory() as tmp:
            os.mkfifo(Path(tmp) / "a.fifo")
            os.symlink("/dev/zero", Path(tmp) / "b.zero")
            (Path(tmp) / "c.bin").write_bytes(b"z" * 123_456)
            rc, out, err = run_doctor("--only", "data", "--data", tmp, "--data-mbs", "0.001", "--json",
                                      timeout=60, memory_cap=2 * GIB)
            self.assertEqual(rc, 0, err[-2000:])
            facts = json.loads(out)["facts"]["data"]
            self.assertEqual((facts["bytes"], facts["files"], facts["skipped"]), (123_456, 1, 2), facts)
            self.assertIn("2 FIFO/socket/device file(s) skipped", json.loads(out)["checks"][0]["detail"])
            (Path(tmp) / "c.bin").unlink()
            r = doctor_facts.read_data(tmp, 1 << 20)
            self.assertEqual(r["error"], "no readable regular file in it (2 not regular files)", r)

    def test_driver_forwards(self):
        rc, out, _ = run_doctor("--only", "disk,ram", "--disk", "/", "--json", driver=True)
        self.assertEqual([c["name"] for c in json.loads(out)["checks"]], ["disk", "ram"])
        self.assertEqual(rc, json.loads(out)["exit"])


if __name__ == "__main__":
    unittest.main()
