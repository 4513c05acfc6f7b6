"""The doctor's judging: each check takes the probe and the options and returns a Result; then the
exit status and the text.
"""
import math
import os

from embertools.net import IFF_LOOPBACK, is_loopback, nccl_socket_interfaces, usable_interfaces
from .common import (DATA_LOW_MBS, DISK_LOW_GIB, GIB, GPU_BUSY_GIB, MIB, MIN_DRIVER, RAM_ADVICE_GIB, Result,
    SHM_LOW_GIB, STATUSES)


# ---------------------------------------------------------------------------
# Judging: each check takes the probe and the options, returns a Result.
# ---------------------------------------------------------------------------


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


def _listing(interfaces):
    seen = {}
    for i in interfaces:
        seen.setdefault(i["name"], []).append(i["address"])
    return ", ".join(f"{n} {' '.join(a[:2])}" for n, a in seen.items()) or "none"


def _good_interface(interfaces):
    """A name and address to suggest: the first running non-loopback interface with IPv4, else any."""
    usable = [i for i in usable_interfaces(interfaces)
              if not i["flags"] & IFF_LOOPBACK and not is_loopback(i["address"])]
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
    have = _listing(usable_interfaces(interfaces))
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
                          "if the nodes talk over another interface, export NCCL_SOCKET_IFNAME=<it> on every node")
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


CPU_TODO = ("a node with more CPU cores per GPU, JPEG crops decoded at 1/2 to 1/8 size "
            "(data.stream.dct_scaling=true, the default), smaller images in the shards, or augmentation on the GPU")


def _gpus_to_feed(probe, opts):
    """(GPUs this node's run feeds, how counted): --nproc; else the GPUs torch sees; else those NVML lists
    (torch sees none: the gpus check says why); 0 when none."""
    if opts.nproc is not None:
        return opts.nproc, f"--nproc {opts.nproc}"
    t = probe["torch"]
    seen = None if t.get("error") else t.get("device_count")
    if seen:
        return seen, "as torch sees them"
    n = probe["nvml"]
    return len([] if n.get("error") else n.get("gpus", [])), "as the driver lists them"


def check_cpu(probe, opts):
    """CPU cores per GPU here (the affinity set, else os.cpu_count(), over the GPUs to feed) against what
    each GPU needs decoding its samples: the plan's cpu_cores_per_gpu (its fastest GPU at its speed,
    from MEASURE.json's data_rate) or --cores-per-gpu."""
    if opts.cores_per_gpu is None:
        return Result("cpu", "skipped", "no need given: --plan PLAN.json of a recipe that streams shards "
                      "(its data_rate), or --cores-per-gpu N")
    if opts.cpu_only:
        return Result("cpu", "skipped", "--cpu-only: no GPU to feed")
    c = probe["cpus"]
    cores = c.get("affinity") or c.get("count")
    if not cores:
        return Result("cpu", "warning", f"cannot count the CPU cores ({c.get('error', 'os.cpu_count() is None')})",
                      "nproc shows them")
    gpus, how = _gpus_to_feed(probe, opts)
    if not gpus:
        return Result("cpu", "skipped", "no GPU visible (see gpus); --nproc N gives the GPUs to feed")
    total = c.get("count")
    here = (f"{cores} CPU cores" + (f" (of {total}: this process's affinity)" if total and total != cores else "")
            + f" for {gpus} GPU{'s' if gpus > 1 else ''} ({how})")
    need, have = opts.cores_per_gpu, cores / gpus
    whole = math.ceil(need - 1e-9)  # a part of a core is a core to have
    exact = "" if whole == need else (f"{need:.1f}; " if need >= 1 else f"{need:.2g}; ")
    at = " at the plan's speed" if opts.cores_note.startswith("plan ") else ""
    needed = f"{whole} core{'s' if whole != 1 else ''} per GPU needed{at} ({exact}{opts.cores_note})"
    if cores < need * gpus:
        return Result("cpu", "warning", f"the GPUs will wait for data: {needed}, {_n(have)} here: {here}", CPU_TODO)
    return Result("cpu", "ok", f"{here}: {_n(have)} per GPU; decoding the data: {needed}")


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
    "cpu": check_cpu,
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
