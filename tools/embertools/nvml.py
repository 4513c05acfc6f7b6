"""The NVIDIA driver's view through NVML, read with ctypes (no pynvml): the driver and its CUDA
version, each GPU's name, memory and memory in use, and the link between every pair (NVLink, else
the PCIe path as `nvidia-smi topo -m` names it). Used by tools/doctor.py (driver, gpus, topology).

The C++ twin is lib/src/monitor/nvml.cpp (dlopen of libnvidia-ml.so.1, the same entry points and
nvml.h constants, NVML_P2P_CAPS_INDEX_NVLINK = 2 and NVML_P2P_STATUS_OK = 0 among them): a rule
changed here is changed there too. Standard library only.
"""
import ctypes
import ctypes.util


# NVML (nvml.h): nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_NVLINK, nvmlGpuP2PStatus_t
# NVML_P2P_STATUS_OK, nvmlGpuTopologyLevel_t and nvidia-smi topo -m's names for them.
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_TOPOLOGY = {0: "same board", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVML_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE; the driver version needs 80


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
