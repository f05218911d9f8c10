"""Config loading: inheritance, overrides, and errors that name the key, a fix and the source."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_script, script, script_error

from common.errors import ConfigError, UserError
from runs.config import CONFIG_DIR, load_config
from runs.config_schema import to_yaml

REQUIRED = [
    "train.out_dir",
    "train.max_iters",
    "train.eval_interval",
    "train.eval_iters",
    "train.batch_size",
    "train.device",
    "train.seed",
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
    "model.block_size",
    "model.dropout",
    "data.dataset",
    "optim.lr",
    "log.wandb",
]


def test_every_shipped_config_loads_and_has_the_cli_contract_keys():
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        # fine-tuning
        needs = ["train.init_from=gpt2"] if "init_from: ???" in path.read_text() else []
        cfg = load_config(path, needs).cfg
        resolved = yaml.safe_load(to_yaml(cfg))
        for key in REQUIRED:
            section, name = key.split(".")
            assert name in resolved[section], f"{path.name} lacks {key}"
    cfg = load_config(None).cfg
    assert cfg.data.dataset == "shakespeare_char" and cfg.log.wandb is False


def test_a_finetune_config_refuses_to_start_without_pretrained_weights(capsys, tmp_path: Path):
    import train as train_script

    out = f"train.out_dir={tmp_path}"
    script_error(
        capsys, train_script.main, ["finetune_shakespeare", out], "train.init_from is required by"
    )
    with pytest.raises(ConfigError, match=r"add train.init_from=gpt2 \(a hub name"):
        load_config("finetune_shakespeare", ["train.max_iters=10"])
    # asked
    assert load_config("finetune_shakespeare", ["train.init_from=null"]).cfg.train.init_from is None
    # its own, after ???
    assert load_config("finetune_shakespeare_lora").cfg.train.init_from == "gpt2"
    assert (
        load_config("finetune_shakespeare", ["train.init_from=gpt2"]).cfg.train.init_from == "gpt2"
    )
    (tmp_path / "mine.yaml").write_text(
        "base: finetune_shakespeare\ntrain:\n  init_from: /models/gpt2\n"
    )
    assert load_config(tmp_path / "mine.yaml").cfg.train.init_from == "/models/gpt2"
    assert not (tmp_path / "last").exists()


def test_base_chain_then_file_then_overrides(tmp_path: Path):
    (tmp_path / "base.yaml").write_text(
        "model:\n  n_layer: 3\n  n_embd: 96\ntrain:\n  max_iters: 7\n"
    )
    (tmp_path / "child.yaml").write_text("base: base.yaml\nmodel:\n  n_layer: 5\n")
    request = load_config(tmp_path / "child.yaml", ["train.max_iters=9", "model.window=null"])
    cfg, origins = request.cfg, request.origins
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.train.max_iters) == (5, 96, 9)
    assert origins["model.n_embd"].endswith("base.yaml") and origins["model.n_layer"].endswith(
        "child.yaml"
    )
    assert origins["train.max_iters"] == "override train.max_iters=9"


def test_configs_are_found_by_name():
    cfg = load_config("shakespeare_char", ["train.max_iters=1"]).cfg
    assert cfg.train.out_dir == "out/shakespeare_char"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["train.max_iter=5"],
            "unknown config key train.max_iter (in override train.max_iter=5); did you mean "
            "train.max_iters?",
        ),
        (
            ["trian.max_iters=5"],
            "unknown config key trian (in override trian.max_iters=5); did you mean train?",
        ),
        (
            ["train.batch_size=abc"],
            "train.batch_size: must be a whole number, got 'abc' (in override "
            "train.batch_size=abc)",
        ),
        (
            ["train.device=tpu"],
            "train.device: must be one of auto, cpu, cuda, mps, got 'tpu' (in override "
            "train.device=tpu)",
        ),
        (["model.n_embd=100", "model.n_head=3"], "model.n_embd: 100 is not divisible by n_head=3"),
        (
            ["train.batch_size=0"],
            "train.batch_size: must be positive, got 0 (in override train.batch_size=0)",
        ),
        (["model.n_layer=-2"], "model.n_layer: must be a positive integer, got -2"),
        (["optim.lr=-1"], "optim.lr: must be positive"),
        # nan passes every `v <= 0`: each float must be finite
        (["optim.lr=nan"], "optim.lr: must be a finite number, got nan"),
        (["optim.eps=nan"], "optim.eps: must be a finite number, got nan"),
        (["optim.muon_lr=nan"], "optim.muon_lr: must be a finite number, got nan"),
        (["train.max_time=nan"], "train.max_time: must be a finite number, got nan"),
        (["train.dist_timeout=nan"], "train.dist_timeout: must be a finite number, got nan"),
        (["model.dropout=inf"], "model.dropout: must be a finite number, got inf"),
        (
            ["train.seed=1180591620717411303424"],
            "train.seed: must be a whole number from 0 to 2**63 - 1",
        ),
        (["train.max_iters"], "override 'train.max_iters' must look like section.key=value"),
        (
            ["optim.name=muon", "train.parallel=fsdp"],
            "optim.name: muon needs whole matrices and cannot run on FSDP",
        ),
    ],
)
def test_bad_values_name_the_key_and_source(overrides, message):
    with pytest.raises(UserError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_typo_in_a_file_names_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layers: 3\n")
    with pytest.raises(
        UserError,
        match=r"unknown config key model.n_layers \(in .*bad.yaml\); did you mean model.n_layer\?",
    ):
        load_config(bad)


def test_bad_yaml_gives_the_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 3\n  n_head: [4\ntrain:\n  max_iters: 1\n")
    with pytest.raises(UserError, match=r"bad.yaml line \d+: bad YAML"):
        load_config(bad)


def test_missing_file_and_cycles(tmp_path: Path):
    with pytest.raises(
        UserError,
        match=r"config file nope.yaml not found; give a path or one of: .*shakespeare_char",
    ):
        load_config("nope.yaml")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(UserError, match="cycle"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    "args,message",
    [
        (["train.max_iter=5"], "did you mean train.max_iters?"),
        (
            ["model.n_layer=two"],
            "model.n_layer: must be a whole number, got 'two' (in override model.n_layer=two)",
        ),
        (["model.n_embd=100", "model.n_head=3"], "model.n_embd: 100 is not divisible by n_head=3"),
        (["configs/missing.yaml"], "config file configs/missing.yaml not found"),
    ],
)
def test_train_cli_gives_one_line_and_exit_2(args, message):
    result = run_script("train.py", *args, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_print_config_prints_resolved_yaml():
    result = run_script(
        "train.py", "configs/shakespeare_char.yaml", "model.n_layer=3", "--print-config", check=True
    )
    resolved = yaml.safe_load(result.stdout)
    assert (
        resolved["model"]["n_layer"] == 3 and resolved["train"]["out_dir"] == "out/shakespeare_char"
    )


def test_integral_floats_are_accepted_for_integer_keys(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text("train:\n  max_iters: 5e3\n  eval_interval: 2.5e2\n")
    cfg = load_config(tmp_path / "mine.yaml", ["train.batch_size=1.6e1", "optim.lr=1e-3"]).cfg
    assert (cfg.train.max_iters, cfg.train.eval_interval, cfg.train.batch_size) == (5000, 250, 16)
    assert cfg.optim.lr == 0.001
    with pytest.raises(
        UserError, match=r"train.max_iters: must be a whole number, got 1.5 \(in override"
    ):
        load_config(None, ["train.max_iters=1.5"])


def test_a_config_elsewhere_can_build_on_a_shipped_one_by_name(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text("base: shakespeare_char.yaml\nmodel:\n  n_layer: 2\n")
    (tmp_path / "short.yaml").write_text("base: induction\n")
    cfg = load_config(tmp_path / "mine.yaml").cfg
    assert (cfg.model.n_layer, cfg.train.out_dir) == (2, "out/shakespeare_char")
    assert load_config(tmp_path / "short.yaml").cfg.data.dataset == "repeats"
    (tmp_path / "lost.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(
        UserError, match=r"base config nowhere.yaml not found .* among the shipped configs"
    ):
        load_config(tmp_path / "lost.yaml")


def test_train_help_lists_the_configs_and_how_to_override():
    result = run_script("train.py", "--help", check=True, timeout=60)
    shown = (
        "usage: python train.py",
        "shakespeare_char",
        "runs/config_schema.py",
        "model.n_layer=6",
    )
    for expected in shown:
        assert expected in result.stdout
    line = next(
        line for line in result.stdout.splitlines() if line.strip().startswith("induction ")
    )
    assert "Induction heads" in line  # each config with the first sentence of its opening comment


def test_wandb_without_a_login_is_one_line_before_training(tmp_path: Path):
    env = {
        "HOME": str(tmp_path),
        "WANDB_MODE": "",
        "WANDB_API_KEY": "",
        "NETRC": str(tmp_path / "netrc"),
    }
    result = run_script(
        "train.py", "log.wandb=true", f"train.out_dir={tmp_path}/out", env=env, timeout=60
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "no wandb login" in result.stderr and "wandb login" in result.stderr
    assert "WANDB_MODE=offline" in result.stderr and not (tmp_path / "out").exists()


def test_wandb_not_installed_is_one_line_before_training(monkeypatch):
    """log.wandb=true where wandb is not installed (a bare GPU image): what to install, before
    training."""
    from training.tracking import check_wandb_login

    # import wandb now fails, as where it is missing
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setenv("WANDB_MODE", "offline")  # a login would not be needed
    with pytest.raises(
        UserError, match=r"^log\.wandb=true needs the wandb package: pip install wandb "
    ):
        check_wandb_login()


def test_samples_are_drawn_at_evals():
    with pytest.raises(
        ConfigError, match=r"^log\.sample_every: 300 is not a multiple of train\.eval_interval=250 "
    ):
        load_config(None, ["log.sample_every=300"])
    assert load_config(None, ["log.sample_every=500"]).cfg.log.sample_every == 500


def test_kept_checkpoints_are_evals():
    """train.keep_iters names iterations at which a checkpoint is written: evals, or the last."""
    with pytest.raises(
        ConfigError,
        match=r"^train\.keep_iters: holds 310, which is no eval's iteration: .*; use 250 or 500",
    ):
        load_config(None, ["train.keep_iters=[250,310]"])
    cfg = load_config(None, ["train.keep_iters=[250,5000]"]).cfg
    assert cfg.train.keep_iters == [250, 5000]
    with pytest.raises(ConfigError, match=r"^train\.keep_iters: must be a list \(\[A,B\]"):
        load_config(None, ["train.keep_iters=300"])


def test_messages_name_the_source_and_a_fix(tmp_path: Path):
    # a learner tweaks the default config from the command line: the line names the override, not
    # the file
    with pytest.raises(
        ConfigError, match=r"\(try n_head=4, or n_embd=129\) \(in override model.n_head=3\)$"
    ):
        load_config(None, ["model.n_head=3"])
    (tmp_path / "mine.yaml").write_text("base: shakespeare_char\nmodel:\n  n_head: 3\n")
    with pytest.raises(ConfigError, match=r"\(in .*mine.yaml\)$"):  # set in the user's own file
        load_config(tmp_path / "mine.yaml")
    with pytest.raises(
        ConfigError,
        match=r"^model.window: 100 is more than block_size=64.*; set at most 64, or null",
    ):
        load_config(None, ["model.window=100"])
    assert load_config(None, ["model.window=64"]).cfg.model.window == 64
    # text keys take the text: a prompt that YAML would read as a mapping, true as true
    cfg = load_config(None, ["log.sample_prompt=ROMEO:", "train.compile=true"]).cfg
    assert cfg.log.sample_prompt == "ROMEO:" and cfg.train.compile == "true"
    # quoted, as before
    assert load_config(None, ['log.sample_prompt="a: b"']).cfg.log.sample_prompt == "a: b"
    (tmp_path / "compiled.yaml").write_text("train:\n  compile: true\n  final_eval: false\n")
    saved = yaml.safe_load(to_yaml(load_config(tmp_path / "compiled.yaml").cfg))["train"]
    assert (saved["compile"], saved["final_eval"]) == ("true", "false")
    # a mis-indented file: said as indentation
    (tmp_path / "flat.yaml").write_text("train:\nmax_iters: 5\n")
    with pytest.raises(
        ConfigError, match=r"flat.yaml: max_iters is a key of the train section; indent it under"
    ):
        load_config(tmp_path / "flat.yaml")
    (tmp_path / "empty.yaml").write_text("optim:\n")
    with pytest.raises(
        ConfigError, match=r"empty.yaml: section optim: holds nothing; indent its keys under it"
    ):
        load_config(tmp_path / "empty.yaml")


@pytest.mark.slow
def test_the_start_line_counts_the_parameters_the_dry_run_counts(
    capsys, data_dir: Path, tmp_path: Path
):
    import train as train_script

    args = [
        f"data.dir={data_dir}",
        f"train.out_dir={tmp_path}",
        "train.max_iters=0",
        "train.eval_iters=1",
    ]
    dry = script(capsys, train_script.main, *args, "--dry-run")
    count = re.search(r"model +([\d.]+M) parameters", dry).group(1)
    assert count == "0.81M"  # 0.80M without the position embedding, which the start line counted
    start = script(capsys, train_script.main, *args, "log.plot=false", "train.final_eval=false")
    assert f"model: {count} parameters" in start


def test_configs_hold_plain_values_typed_by_the_schema_as_a_checkpoint_is(tmp_path: Path):
    """Files and overrides are merged as YAML, then typed by runs/config_schema.py's
    config_from_data, the reader of a checkpoint's config.yaml too: numbers as people write them,
    a later file's good value over a base's bad one, and `${...}` refused, not left as text."""
    (tmp_path / "base.yaml").write_text("base: shakespeare_char\ntrain:\n  max_iters: lots\n")
    (tmp_path / "mine.yaml").write_text(
        "base: base.yaml\ntrain:\n  max_iters: 3e2\n  out_dir: 2026-12-05\noptim:\n  lr: 1e-3\n"
    )
    cfg = load_config(tmp_path / "mine.yaml", ["train.compile=true", "log.sample_prompt=5"]).cfg
    # text as typed where YAML would read another thing or nothing
    for prompt in ("ROMEO:", "[Enter", "a: b", "{x"):
        assert load_config(None, [f"log.sample_prompt={prompt}"]).cfg.log.sample_prompt == prompt
    assert (cfg.train.max_iters, cfg.train.out_dir, cfg.optim.lr) == (300, "2026-12-05", 0.001)
    assert (cfg.train.compile, cfg.log.sample_prompt, cfg.model.n_layer) == ("true", "5", 4)
    (tmp_path / "bad.yaml").write_text("train:\n  out_dir: out/${data.dataset}\n")
    with pytest.raises(
        ConfigError,
        match=r"^train.out_dir: 'out/\$\{data.dataset\}' is no interpolation here: configs hold "
        r"plain values \(in .*bad.yaml\); write the value itself$",
    ):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match=r"^unknown config key model.n_layer.x \(in override"):
        load_config(None, ["model.n_layer.x=1"])
    with pytest.raises(ConfigError, match=r"^model.bias: must be true or false, got 3 \(in over"):
        load_config(None, ["model.bias=3"])
    # what OmegaConf took for a bool, as configs written for it hold
    for given, bias in (("'true'", True), ("0", False), ("Off", False)):
        assert load_config(None, [f"model.bias={given}"]).cfg.model.bias is bias
