"""tools.bench end to end on a tiny config: its JSON, the ratio of two setups, memory against
context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, run_script


@pytest.mark.slow
def test_bench_compare_sample_and_memory(data_dir: Path, tmp_path: Path):
    out = tmp_path / "bench.json"
    common = ["configs/shakespeare_char.yaml", f"data.dir={data_dir}", *TINY]
    result = run_script(
        "-m",
        "tools.bench",
        *common,
        "optim.impl=forloop",
        "--compare",
        "optim.impl=fused",
        "--steps",
        "3",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--sample-tokens",
        "80",
        "--json",
        str(out),
        timeout=600,
        check=True,
    )
    r = json.loads(out.read_text())
    a, b = r["train"]
    assert a["setup"] == "A" and b["setup"] == "B" and a["steps_timed"] == b["steps_timed"] == 6
    assert a["tokens_per_iter"] == 8 * 32 and a["tokens_per_s"] > 0 and 0 < a["mfu"] < 1
    assert r["ratio_B_over_A_tokens_per_s"] == round(b["tokens_per_s"] / a["tokens_per_s"], 3)
    # eager: no compile
    paths = ["fp32", "int8", "fp32 x8 samples", "full recompute", "nanoGPT generator"]
    assert [row["path"] for row in r["sample"]] == paths * 2
    assert all(row["tok_s"] > 0 and row["of_floor"] > 0 for row in r["sample"])
    floor = r["sample_floor"][0]
    assert floor["read_GB_s"] > 0 and floor["memory_GB_s"] > 0 and floor["floor_tok_s"] > 0
    assert 0 < floor["int8_weights_MB_per_token"] < floor["weights_MB_per_token"] / 2
    memory = [m for m in r["memory"] if m["setup"] == "A"]
    assert [m["context"] for m in memory] == [512, 1024, 2048, 4096]
    # flash attention: memory grows about linearly with the context, not quadratically. A ratio of
    # two peaks in one run: a doubled context doubles a linear peak (2.0), a quadratic one 4.0; the
    # 0.2 is the allocator's rounding, on any CPU
    assert memory[-1]["growth_vs_previous"] <= 2.2
    assert "B / A training tokens/s" in result.stdout


def test_bench_rejects_unknown_measurements():
    result = run_script("-m", "tools.bench", "--only", "speed")
    assert (
        result.returncode == 2 and "--only takes train, sample, memory, attention" in result.stderr
    )


def test_attention_cost_grows_linearly_with_a_window_and_quadratically_with_a_dense_mask(
    tmp_path: Path,
):
    out, picture = tmp_path / "attention.json", tmp_path / "attention.png"
    args = ["--only", "attention", "--window", "64", "--contexts", "512,1024,2048", "--rounds", "1"]
    run_script("-m", "tools.bench", *args, "--json", str(out), "--plot", str(picture), check=True)
    rows = json.loads(out.read_text())["attention"]
    assert [(r["context"], r["path"]) for r in rows[:3]] == [
        (512, "full causal"),
        (512, "window 64"),
        (512, "window 64, dense mask"),
    ]
    # the allocator's count: deterministic
    peak = {(r["context"], r["path"]): r["peak_MB"] for r in rows}
    assert peak[2048, "window 64"] / peak[1024, "window 64"] < 2.2
    assert peak[2048, "window 64, dense mask"] / peak[1024, "window 64, dense mask"] > 2.5
    assert (
        peak[2048, "window 64"]
        < 1.5 * peak[2048, "full causal"]
        < peak[2048, "window 64, dense mask"]
    )
    assert all(r["ms"] > 0 for r in rows) and picture.stat().st_size > 10_000


# nanoGPT's model.py interface (GPTConfig, GPT, configure_optimizers, get_num_params) over our own
# model: what tools/vs_nanogpt.py calls of a nanoGPT checkout, for a test without one
STAND_IN = """
import json
from dataclasses import dataclass
from pathlib import Path
import torch
from model import GPT as Ours, GPTConfig as OursConfig

@dataclass
class GPTConfig:
    block_size: int; vocab_size: int; n_layer: int; n_head: int; n_embd: int
    dropout: float; bias: bool

class GPT(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        built = dict(c.__dict__, vocab_size=None)  # what the tool asked for, for the test to read
        (Path(__file__).parent / "built.json").write_text(json.dumps(built))
        self.inner = Ours(OursConfig(block_size=c.block_size, vocab_size=c.vocab_size,
                                     n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                                     bias=c.bias))
    def forward(self, idx, targets):
        return self.inner(idx, targets)
    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas)
"""


def test_vs_nanogpt_times_both_sides_alternating(data_dir: Path, tmp_path: Path):
    """tools/vs_nanogpt.py against a stand-in for a nanoGPT checkout (its model.py interface): both
    sides timed, the ratio and the MFUs printed; a folder without model.py is one line, exit 2."""
    checkout = tmp_path / "nanoGPT"
    checkout.mkdir()
    (checkout / "model.py").write_text(STAND_IN)
    common = [f"data.dir={data_dir}", f"train.out_dir={tmp_path / 'out'}", "--pairs", "3"]
    result = run_script("-m", "tools.vs_nanogpt", str(checkout), *common, check=True)
    assert "nanoGPT: " in result.stdout and "tinygpt: " in result.stdout
    assert "MFU" in result.stdout and "tinygpt's tokens/s against nanoGPT's: " in result.stdout
    # nanoGPT's CPU recipe as its README and train.py give it: train.py sets bias = False
    recipe = dict(block_size=64, vocab_size=None, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    assert json.loads((checkout / "built.json").read_text()) == recipe | {"bias": False}
    result = run_script("-m", "tools.vs_nanogpt", str(tmp_path), *common)
    assert result.returncode == 2 and "has no model.py" in result.stderr.strip().splitlines()[-1]
