"""Hugging Face model folders: reading one (config.json and safetensors weights, sharded too),
fetching one from the hub by name, and writing one for a model of ours, or a PEFT adapter folder for
its LoRA adapters.

Weights are read from safetensors only: a folder that has nothing but `pytorch_model.bin` (a pickle,
which can run code when loaded) is refused with a line saying how to convert it. The hub is reached
through huggingface_hub (the `hf` extra), imported only when a hub name is given: its cache first,
then a download of the files tinygpt reads (config, safetensors, tokenizer), never the whole
repository.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from common import json_text
from common.errors import UserError, first_line
from common.files import save_tensors
from data.tokenizers import METADATA_FILE
from model import GPTConfig
from model.config import LoRAConfig
from runs.pretrained import Pretrained
from runs.weight_checks import check_weight_shapes

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# PEFT's
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # gpt2, openai-community/gpt2
HUB_FILES = [
    CONFIG,
    WEIGHTS,
    INDEX,
    "model-*-of-*.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    METADATA_FILE,
]


def is_model_folder(path: Path) -> bool:
    return (path / CONFIG).is_file()


def is_hub_name(name: str) -> bool:
    return bool(HUB_NAME.match(name)) and not name.endswith((".json", ".safetensors", ".yaml"))


def read_config(folder: Path) -> dict:
    try:
        data = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{folder / CONFIG} cannot be read ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{folder / CONFIG} is not a transformers config (not a JSON object)")
    return data


def _weight_files(folder: Path) -> list[Path]:
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / INDEX).is_file():
        try:
            shards = json.loads((folder / INDEX).read_text())["weight_map"].values()
        except (json.JSONDecodeError, KeyError, AttributeError, UnicodeDecodeError) as e:
            raise UserError(f"{folder / INDEX} is damaged ({type(e).__name__}: {e})") from None
        return [folder / name for name in sorted(set(shards))]
    if any(folder.glob("pytorch_model*.bin")):
        raise UserError(
            f"{folder} holds its weights only as pytorch_model.bin, a pickle, which tinygpt never "
            "loads (it can run code); convert it with transformers: "
            "AutoModelForCausalLM.from_pretrained(FOLDER).save_pretrained(NEW_FOLDER) writes "
            "model.safetensors"
        )
    raise UserError(
        f"{folder} has {CONFIG} but no {WEIGHTS} (nor {INDEX}); the model folder is incomplete"
    )


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder's safetensors file(s)."""
    weights = {}
    for path in _weight_files(folder):
        try:
            weights.update(load_file(str(path)))
        except FileNotFoundError:
            raise UserError(f"{path} is missing; the model folder is incomplete") from None
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(
                f"{path} is damaged or not a safetensors file ({first_line(e)})"
            ) from None
    return weights


def read_model(folder: Path) -> tuple[GPTConfig, dict[str, torch.Tensor], dict | None, str]:
    """(our config, our weights, our tokenizer metadata or None, what the tokenizer is) of a model
    folder."""
    from hf import convert, tokenizer_files  # converting: only where a folder is read or written

    config = read_config(folder)
    cfg = convert.from_hf_config(config, str(folder))
    weights = convert.from_hf_weights(read_weights(folder), cfg, str(folder))
    tokenizer_meta, about = tokenizer_files.tokenizer_of(
        folder, config.get("model_type"), cfg.vocab_size
    )
    return cfg, weights, tokenizer_meta, about


def read_pretrained(name: str) -> Pretrained | None:
    """The model in Hugging Face model folder `name`, converted to ours and its weights checked, or
    None where `name` is no model folder: runs/pretrained.py's `OtherFormat`, which sample.py,
    eval.py, export.py and heads.py hand in."""
    path = Path(name)
    if not is_model_folder(path):
        return None
    model, weights, tokenizer_meta, about = read_model(path)
    check_weight_shapes({k: tuple(v.shape) for k, v in weights.items()}, model, path)
    return Pretrained(path, model, weights, tokenizer_meta, about)


def read_or_download(name: str) -> Pretrained | None:
    """`read_pretrained`, a hub name (gpt2) first fetched from the hub where no such folder exists:
    the `OtherFormat` of train.init_from."""
    if not Path(name).exists() and is_hub_name(name):
        name = str(download(name))
    return read_pretrained(name)


def download(name: str) -> Path:
    """The local folder of hub model `name`: from huggingface_hub's cache, else downloaded into
    it."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise UserError(
            f"{name} is not a folder; as a Hugging Face hub name it needs huggingface_hub: pip "
            "install -e '.[hf]'"
        ) from None
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except RepositoryNotFoundError:
        raise UserError(
            f"{name} is neither a folder nor a model on the Hugging Face hub; check the path or "
            "the name"
        ) from None
    except LocalEntryNotFoundError:
        raise UserError(
            f"{name} is not a folder, and the Hugging Face hub cannot be reached (offline) with "
            "nothing cached for it; connect to the internet once, or give a local model folder"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise UserError(
            f"could not get {name} from the Hugging Face hub ({first_line(e)})"
        ) from None


TRANSFORMERS = "transformers' GPT-2 or Llama models"  # what an export must match exactly


def write_model(
    folder: Path, cfg: GPTConfig, weights: dict[str, torch.Tensor], tokenizer_meta: dict
) -> str:
    """Write a transformers model folder for our model into the empty `folder`; returns its
    architecture. `weights` are ours by name (a tied LM head may be absent)."""
    from hf import convert, tokenizer_files  # converting: only where a folder is read or written

    convert.check_exportable(cfg, TRANSFORMERS)
    cfg, weights = convert.with_every_head(cfg, weights)
    eot = tokenizer_files.write_tokenizer(folder, tokenizer_meta, cfg.block_size)
    config = convert.to_hf_config(cfg, eot)
    save_tensors(convert.to_hf_weights(weights, cfg), folder / WEIGHTS, metadata={"format": "pt"})
    (folder / CONFIG).write_text(json_text.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": eot, "eos_token_id": eot, "max_length": cfg.block_size}
    (folder / "generation_config.json").write_text(json_text.dumps(generation, indent=2) + "\n")
    return config["architectures"][0]


def write_adapter(
    folder: Path, cfg: GPTConfig, lora: LoRAConfig, adapters: dict[str, torch.Tensor], base: str
) -> list[str]:
    """Write a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) for the LoRA
    `adapters` (ours, by name) of a model `cfg` into the empty `folder`, `base` naming the model it
    adapts; returns the target modules. `PeftModel.from_pretrained(base model, folder)` loads it."""
    from hf import convert  # converting: only where a folder is read or written

    convert.check_exportable(cfg, TRANSFORMERS, adapters=True)
    tensors, targets = convert.to_peft_weights(adapters, cfg)
    save_tensors(tensors, folder / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        # GPT-2's Conv1D stores its weights transposed
        "fan_in_fan_out": convert.family(cfg) == "gpt2",
        "bias": "none",
        "use_rslora": False,  # the scale is alpha / r, as ours
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    (folder / ADAPTER_CONFIG).write_text(json_text.dumps(config, indent=2) + "\n")
    return targets
