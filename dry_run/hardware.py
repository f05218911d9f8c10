"""Peak FLOP/s of the machine, for model FLOPs utilisation (MFU), and the dry run's projection of a
run's time to GPUs not at hand (`projected_seconds`).

GPUs: a table of dense (no sparsity) tensor-core peaks by exact product name and precision, from the
vendors' data sheets (each figure's source beside it). CPUs have no data sheet number worth trusting
for PyTorch, so the peak is measured: the best of several large matrix products at the current
thread count, cached per machine (CPU model, threads, torch version) in
~/.cache/tinygpt/cpu_peak.json (TINYGPT_CACHE_DIR overrides the folder).
"""

from __future__ import annotations

import json
import platform
import time
from typing import Optional

import torch

from common import json_text
from common.files import cache_folder

# Dense (no sparsity) tensor-core TFLOP/s by precision, keyed by the exact product name the driver
# reports (torch.cuda.get_device_name, nvidia-smi), without the "NVIDIA " that older drivers leave
# out. "fp32" means TF32 tensor cores from Ampere on (tinygpt turns TF32 on) and plain FP32 before.
# Data sheets quote sparse figures for Ampere and later: those are halved here. A name not listed
# gets no MFU rather than a wrong one.
# H100/H200 data sheets: 1,979 / 989 sparse
_HOPPER_SXM = {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}
# H100 NVL, H200 NVL: 1,671 / 835 sparse
_HOPPER_NVL = {"bf16": 835.5, "fp16": 835.5, "fp32": 417.5}
_A100 = {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}  # A100 data sheet: 312 / 156 dense
_V100_SXM2 = {"fp16": 125.0, "fp32": 15.7}  # V100 data sheet (SXM2); no bf16 tensor cores
_V100_PCIE = {"fp16": 112.0, "fp32": 14.0}  # V100 data sheet (PCIe)
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H100 80GB HBM3": _HOPPER_SXM,  # the SXM5 H100
    # H100 data sheet: 1,513 / 756 sparse
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0},
    "H100 NVL": _HOPPER_NVL,
    "H200": _HOPPER_SXM,  # the SXM H200
    "H200 NVL": _HOPPER_NVL,
    "GH200 480GB": _HOPPER_SXM,  # GH200 data sheet: its H100 as the SXM one
    # HGX B200 data sheet: 4.5 P / 2.2 P sparse
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0},
    "A100-SXM4-40GB": _A100,
    "A100-SXM4-80GB": _A100,
    "A100-PCIE-40GB": _A100,
    "A100 80GB PCIe": _A100,
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},  # A10 data sheet: 250 / 125 sparse
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},  # L4 data sheet: 242 / 120 sparse
    "L40": {"bf16": 181.0, "fp16": 181.0, "fp32": 90.5},  # L40 data sheet: 362 / 181 sparse
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 183.0},  # L40S data sheet: 733 / 366 sparse
    # Ada whitepaper, FP32 accumulate
    "GeForce RTX 4090": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
    # GA102 whitepaper, FP32 accumulate
    "GeForce RTX 3090": {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6},
    "Tesla V100-SXM2-16GB": _V100_SXM2,
    "Tesla V100-SXM2-32GB": _V100_SXM2,
    "Tesla V100-PCIE-16GB": _V100_PCIE,
    "Tesla V100-PCIE-32GB": _V100_PCIE,
    "Tesla T4": {"fp16": 65.0, "fp32": 8.1},  # T4 data sheet: mixed precision 65, FP32 8.1
}

# the MFU assumed for GPUs not at hand (nanoGPT reaches ~40% on an A100 for GPT-2 small)
PROJECTION_MFU = 0.4
# GPUs the dry run projects to: the name it prints -> the exact product name in GPU_PEAKS
PROJECTED_GPUS = {
    "H100": "H100 80GB HBM3",
    "A100": "A100-SXM4-80GB",
    "L40S": "L40S",
    "RTX 4090": "GeForce RTX 4090",
    "L4": "L4",
}


def projected_seconds(flops: float) -> dict[str, float]:
    """Seconds `flops` take on each of PROJECTED_GPUS at PROJECTION_MFU of its bf16 (else fp16)
    peak (the dry run's projection for a GPU not at hand)."""
    out = {}
    for gpu, product in PROJECTED_GPUS.items():
        peaks = GPU_PEAKS[product]
        out[gpu] = flops / ((peaks.get("bf16") or peaks["fp16"]) * 1e12 * PROJECTION_MFU)
    return out


def gpu_peak_flops(device_name: str, precision: str) -> Optional[float]:
    """Peak FLOP/s of a known GPU at `precision` (fp32 | bf16 | fp16), or None if unknown."""
    peaks = GPU_PEAKS.get(device_name.strip().removeprefix("NVIDIA "), {})
    tflops = peaks.get(precision)
    return tflops * 1e12 if tflops else None


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
    """Best FLOP/s of square matrix products on the CPU at the current thread count. The best of
    many tries: a busy moment of a shared machine only ever slows a try down."""
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
    """The measured matmul peak of this CPU for fp32 or bf16, cached per machine and thread
    count."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    folder = cache_folder()
    path = folder / "cpu_peak.json"
    key = (
        f"{_cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__} | "
        f"{precision}"
    )
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = measure_cpu_flops(dtype)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json_text.dumps(cache, indent=1))
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    return cache[key]


def peak_flops(device: torch.device, precision: str) -> Optional[float]:
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), precision)
    if device.type == "cpu":
        return cpu_peak_flops(precision)
    return None
