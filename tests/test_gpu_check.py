"""tools/gpu_check.sh without a GPU: its usage, and every command it would run (`--dry-run`) names a
script, module, test file and options that exist, with a config and overrides that resolve, on both
devices: a stale path (the old `bench.py`) or a renamed key fails here, not on a lent GPU. The whole
rehearsal on the CPU (GPU_CHECK_DEVICE=cpu, about 2 minutes) is run by hand (docs/gpu.md);
tools/versions.py is run here."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from runs.config import from_arguments
from tools import versions
from tools.bench import __main__ as bench

STEPS = ["versions", "tests", "gpt2", "train.py", "sample", "attention", "eager", "compiled"]


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


def test_usage_says_how_to_prepare_check_and_rehearse():
    result = gpu_check("--help")
    assert result.returncode == 0
    for line in (
        "bash tools/gpu_check.sh prepare",
        "GPU_CHECK_DEVICE=cpu bash tools/gpu_check.sh",
        "carry",
    ):
        assert line in result.stdout
    assert gpu_check("nonsense").returncode == 2


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_step_runs_a_command_that_exists(device: str, tmp_path):
    out = tmp_path / "out"
    result = gpu_check("--dry-run", GPU_CHECK_DEVICE=device, OUT=str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    names = [line.split()[1] for line in lines if line.startswith("== ")]
    assert names == (["gpu"] if device == "cuda" else []) + STEPS
    commands = [shlex.split(line[2:]) for line in lines if line.startswith("$ ")]
    assert len(commands) == len(names) and not out.exists()  # a dry run writes nothing
    files = {"log.txt", "train_py.jsonl"}  # the check writes these two itself
    for argv in commands:
        if argv == ["nvidia-smi"]:
            continue
        assert argv[0] == sys.executable, argv
        files |= {a.removeprefix(f"{out}/") for a in argv if a.startswith(f"{out}/")}
        if argv[1:3] == ["-m", "tools.bench"]:
            _, groups = bench.parse_args(argv[3:])  # its options exist (argparse exits otherwise)
            for group in groups:
                assert f"train.device={device}" in group
                from_arguments(group)  # the config and every override resolve
        elif argv[1:3] == ["-m", "pytest"]:
            assert (ROOT / argv[-1]).is_file()
        elif argv[1] == "train.py":
            assert f"train.device={device}" in argv
            from_arguments(argv[2:])
        else:
            assert argv[1:] == ["-m", "tools.versions"]
    assert len(files) <= 8  # what comes back from a lent machine's $OUT


def test_versions_names_the_machine_and_every_package(capsys):
    versions.main([])
    out = capsys.readouterr().out
    assert out.startswith("python 3.") and "\ntorch 2." in out and "\ncpu: " in out
    packages = out.split("packages: ", 1)[1].splitlines()[0].split(", ")
    assert [p.split()[0] for p in packages] == list(versions.PACKAGES)
    assert "pyyaml missing" not in packages  # installed here: a version
