"""Print the machine and the versions of what tinygpt runs on: for a bug report, or a benchmark's
record.

    python -m tools.versions

One line each: Python and torch (with the CUDA it was built for); the packages tinygpt imports, or
"missing"; then each GPU (name, memory, compute capability, multiprocessors, bf16 tensor cores, and
the driver as nvidia-smi reports it) or the CPU (model, cores, torch's threads, the instruction sets
its kernels use).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys

import torch

# the distributions tinygpt imports (pyproject.toml's dependencies and extras), and the compiler's
PACKAGES = (
    "numpy",
    "pyyaml",
    "safetensors",
    "tiktoken",
    "tokenizers",
    "tqdm",
    "matplotlib",
    "datasets",
    "wandb",
    "transformers",
    "huggingface_hub",
    "triton",
)


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def driver() -> str:
    """The NVIDIA driver's version, as nvidia-smi reports it ("" without nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.splitlines()[0].strip() if out.strip() else ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor() or platform.machine()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tools.versions", description=__doc__.split("\n\n")[0]
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    parse_args(argv)
    print(f"python {platform.python_version()} ({platform.platform()})")
    print(
        f"torch {torch.__version__} "
        f"({'CUDA ' + torch.version.cuda if torch.version.cuda else 'no CUDA'})"
    )
    print("packages: " + ", ".join(f"{name} {version(name)}" for name in PACKAGES))
    if torch.cuda.is_available():
        nvidia = driver()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(
                f"cuda:{i} {p.name}: {p.total_memory / 2**30:.1f} GiB, compute capability "
                f"{p.major}.{p.minor}, {p.multi_processor_count} multiprocessors, bf16 tensor "
                f"cores {torch.cuda.is_bf16_supported(including_emulation=False)}"
                + (f", driver {nvidia}" if nvidia else "")
            )
    print(
        f"cpu: {cpu_model()}, {torch.get_num_threads()} torch threads, kernels for "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
