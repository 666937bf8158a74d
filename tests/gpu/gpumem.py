#!/usr/bin/env python3
"""Device memory as NVML reports it, without creating a CUDA context (which
would itself take memory and disturb what is measured).

  gpumem.py            one JSON line: {"name", "total", "used", "procs": [...]}

"used" is the device's used bytes (nvmlDeviceGetMemoryInfo); "procs" lists
the compute processes NVML sees with their used bytes (their pids are the
host's, which may differ from the ones seen in a container). Falls back to
nvidia-smi when the NVML library cannot be loaded."""
import ctypes
import json
import subprocess
import sys


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Process(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def nvml(index):
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if lib.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit failed")
    h = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) != 0:
        raise RuntimeError("no device %d" % index)
    mem = Memory()
    lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
    name = ctypes.create_string_buffer(96)
    lib.nvmlDeviceGetName(h, name, 96)
    procs = []
    count = ctypes.c_uint(64)
    arr = (Process * 64)()
    fn = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3", None)
    if fn is not None and fn(h, ctypes.byref(count), arr) == 0:
        for i in range(count.value):
            used = arr[i].usedGpuMemory
            procs.append({"pid": arr[i].pid, "used": None if used >= (1 << 63) else used})
    lib.nvmlShutdown()
    return {"name": name.value.decode(), "total": mem.total, "used": mem.used, "procs": procs,
            "source": "nvml"}


def smi(index):
    out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=name,memory.total,memory.used",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True).stdout.strip().split(", ")
    return {"name": out[0], "total": int(out[1]) << 20, "used": int(out[2]) << 20, "procs": [],
            "source": "nvidia-smi"}


def main():
    index = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    try:
        r = nvml(index)
    except (OSError, RuntimeError):
        r = smi(index)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
