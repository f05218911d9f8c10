"""Peak FLOP/s of the machine, for model FLOPs utilisation (MFU).

GPUs: a table of dense (no sparsity) tensor-core peaks by device name and precision, from the vendors' data
sheets. CPUs have no data sheet number worth trusting for PyTorch, so the peak is measured: the best of
several large matrix products at the current thread count, cached per machine (CPU model, threads, torch
version) in ~/.cache/tinygpt/cpu_peak.json (TINYGPT_CACHE_DIR overrides the folder).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional

import torch

# dense TFLOP/s by precision; "fp32" on CUDA means TF32 tensor cores (tinygpt turns TF32 on)
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "fp32": 35.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 183.0},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}


def gpu_peak_flops(device_name: str, precision: str) -> Optional[float]:
    """Peak FLOP/s of a known GPU at `precision` (fp32 | bf16 | fp16), or None if unknown."""
    for name, peaks in GPU_PEAKS.items():  # the table lists specific names before their prefixes
        if name in device_name:
            tflops = peaks.get(precision)
            return tflops * 1e12 if tflops else None
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_cpu_flops(
    dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048, 3072), repeats: int = 10
) -> float:
    """Best FLOP/s of square matrix products on the CPU at the current thread count. The best of many tries:
    a busy moment of a shared machine only ever slows a try down."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        a @ b  # warm up (and let the library pick its kernels)
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def cpu_peak_flops(precision: str) -> float:
    """The measured matmul peak of this CPU for fp32 or bf16, cached per machine and thread count."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    folder = Path(os.environ.get("TINYGPT_CACHE_DIR", Path.home() / ".cache" / "tinygpt"))
    path = folder / "cpu_peak.json"
    key = f"{_cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__} | {precision}"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = measure_cpu_flops(dtype)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=1))
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    return cache[key]


def peak_flops(device: torch.device, precision: str) -> Optional[float]:
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), precision)
    if device.type == "cpu":
        return cpu_peak_flops(precision)
    return None
