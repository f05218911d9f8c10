"""Training configs: typed YAML with sections, `base:` inheritance and `section.key=value`
overrides, loaded as a `Request` (training/plan.py settles it into the final config).

The files and overrides are merged as YAML data, in order, then typed by the schema's
`config_from_data`, the one reader of config data (a checkpoint's config.yaml too): no `${...}`
interpolation anywhere. An unknown key or a value of the wrong type names the key, the closest
valid one, and the file or override that set it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from common.errors import ConfigError
from data import DATA_DIR

# the schema's classes, imported from here as before
from runs.config_schema import Config as Config
from runs.config_schema import DataConfig as DataConfig
from runs.config_schema import FieldError, config_from_data, problems
from runs.config_schema import LogConfig as LogConfig
from runs.config_schema import OptimConfig as OptimConfig
from runs.config_schema import TrainConfig as TrainConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "shakespeare_char.yaml"


@dataclass
class Request:
    """A config as a command line asks for it, before training/plan.py settles it."""

    cfg: Config
    # dotted key -> the file or override that set it
    origins: dict[str, str] = field(default_factory=dict)
    name: str = "the default config"  # the config file, for messages
    # the command line's section.key=value items, in order (a resumed run applies them alone)
    overrides: tuple[str, ...] = ()


def _flatten(d: Any, prefix: str = "") -> list[str]:
    if not isinstance(d, dict):
        return [prefix[:-1]]
    out = []
    for k, v in d.items():
        out += _flatten(v, f"{prefix}{k}.")
    return out


def _unwrap(kind: Any) -> Any:
    """X for Optional[X] (an optional section such as lora), else kind itself."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def _keys_under(dotted: str) -> list[str]:
    """Valid keys of the section that `dotted` points into (for 'did you mean')."""
    section = _kind(dotted.rpartition(".")[0]) if "." in dotted else Config
    return [f.name for f in fields(section)] if is_dataclass(section) else []


def _check_keys(data: dict, source: str) -> None:
    """Every key of `data` (a file's or an override's) one the schema has, else one line naming the
    first unknown part, the closest valid key and `source`; no `${...}` in a value."""
    for dotted in _flatten(data):
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):
            if _kind(".".join(parts[:depth])) is None:
                key = ".".join(parts[:depth])
                valid = _keys_under(key)
                close = difflib.get_close_matches(parts[depth - 1], valid, n=1, cutoff=0.6)
                hint = (
                    f"did you mean {'.'.join(parts[: depth - 1] + close[:1])}?"
                    if close
                    else f"valid keys here: {', '.join(valid) or 'none, it takes a value'}"
                )
                raise ConfigError(f"unknown config key {key} (in {source}); {hint}")
        value = functools.reduce(lambda d, k: d[k], parts, data)
        if isinstance(value, str) and "${" in value:
            raise ConfigError(
                f"{dotted}: {value!r} is no interpolation here: configs hold plain values (in "
                f"{source}); write the value itself"
            )


def _merge(into: dict, data: dict) -> dict:
    """`data` over `into`, section by section; a value or list replaces what was there."""
    out = dict(into)
    for key, value in data.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def _typed(merged: dict, origins: dict[str, str]) -> Config:
    """The merged data as a Config (runs/config_schema.py's `config_from_data`); a value it refuses
    is one line naming the key and what set it."""
    try:
        return config_from_data(merged)
    except FieldError as e:
        where = origins.get(e.key.split("[")[0]) or "the defaults"
        raise ConfigError(f"{e} (in {where})") from None


def resolve_path(name: str) -> Path:
    """A config file by path, or by name in configs/ ('shakespeare_char' ->
    configs/shakespeare_char.yaml)."""
    for candidate in (Path(name), CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"config file {name} not found; give a path or one of: {available}")


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else "?"
        raise ConfigError(f"{path} line {line}: bad YAML: {e.problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None
    if data is None:
        return {}
    _check_layout(path, data)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (model:, data:, train:, ...), not a "
            f"{type(data).__name__}"
        )
    return data


def _check_layout(path: Path, data: Any) -> None:
    """Indentation mistakes said as such: a section's key at the top of the file (`train:` then its
    keys not indented), a section with nothing under it."""
    if not isinstance(data, dict):
        return
    sections = typing.get_type_hints(Config)
    for key in data:
        home = next((s for s in sections if key in _keys_under(f"{s}.{key}")), None)
        if key not in sections and home:
            raise ConfigError(
                f"{path}: {key} is a key of the {home} section; indent it under {home}: (two "
                "spaces)"
            )
    for key, value in data.items():
        if key in sections and value is None and key != "lora":  # lora: null is the section off
            raise ConfigError(
                f"{path}: section {key}: holds nothing; indent its keys under it (two spaces)"
            )


def _file_chain(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, dict]]:
    """[(source name, dict)] for the base chain of `path`, base first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(
            f"config {path} is its own base (cycle: {' -> '.join(map(str, seen + (path,)))})"
        )
    data = _read_yaml(path)
    base = data.pop("base", None)
    chain: list[tuple[str, dict]] = []
    if base is not None:
        candidates = [path.parent / str(base), CONFIG_DIR / str(base), CONFIG_DIR / f"{base}.yaml"]
        base_path = next((c for c in candidates if c.is_file()), None)
        if base_path is None:
            raise ConfigError(
                f"{path}: base config {base} not found (looked for {candidates[0]} and among the "
                f"shipped configs in {CONFIG_DIR})"
            )
        chain = _file_chain(base_path, seen + (path,))
    return [*chain, (str(path), data)]


def parse_override(item: str) -> dict:
    if "=" not in item or item.startswith("=") or "." not in item.split("=", 1)[0]:
        raise ConfigError(
            f"override {item!r} must look like section.key=value (e.g. train.max_iters=100)"
        )
    key, text = item.split("=", 1)
    text_key = _kind(key) is str
    try:
        value = yaml.safe_load(text)  # typed later, by the schema (1e-3 is text to YAML 1.1)
    except yaml.YAMLError as e:
        if not text_key:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"override {item!r} cannot be parsed: {problem}") from None
        value = text
    if isinstance(value, (dict, list)) and text_key:  # log.sample_prompt=ROMEO: is text
        value = text
    return functools.reduce(lambda inner, k: {k: inner}, reversed(key.split(".")), value)


def _kind(dotted: str) -> Any:
    """The schema's type of a dotted key (X for Optional[X]); None for a key it does not have."""
    node: Any = Config
    for part in dotted.split("."):
        node = _unwrap(typing.get_type_hints(node).get(part)) if is_dataclass(node) else None
    return node


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Request:
    """The config of file `path` (a path or a shipped config's name; None: the default) with the
    overrides applied, checked; and for each dotted key the file or override that set it last."""
    name = str(path) if path is not None else "the default config"
    path = resolve_path(str(path)) if path is not None else DEFAULT_CONFIG
    sources = _file_chain(path) + [(f"override {item}", parse_override(item)) for item in overrides]
    merged: dict = {}
    origins: dict[str, str] = {}
    for source, data in sources:
        _check_keys(data, source)
        merged = _merge(merged, data)
        origins.update(dict.fromkeys(_flatten(data), source))
    _check_required(sources)
    cfg = resolve_paths(_typed(merged, origins))
    found = problems(cfg)
    if found:
        key, msg = found[0]
        raise ConfigError(
            f"{key}: {msg} (in {_blame(key, msg, origins, sources) or 'the defaults'})"
        )
    return Request(cfg, origins, name, tuple(overrides))


def with_overrides(base: Config, overrides: tuple[str, ...], where: str) -> Config:
    """base (a checkpoint's config) with the overrides' keys set as load_config sets them, checked
    as it checks them. The overrides are typed on the schema's defaults alone."""
    merged: dict = {}
    origins: dict[str, str] = {}
    for item in overrides:
        data = parse_override(item)
        _check_keys(data, f"override {item}")
        merged = _merge(merged, data)
        origins.update(dict.fromkeys(_flatten(data), f"override {item}"))
    given = resolve_paths(_typed(merged, origins))
    cfg = base
    for key in origins:
        section, name = key.split(".", 1)
        # a section the checkpoint has not (lora on a full run): the schema's, as a fresh run has it
        ours = getattr(cfg, section) or getattr(given, section)
        value = getattr(getattr(given, section), name)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(ours, **{name: value})})
    found = problems(cfg)
    if found:
        key, msg = found[0]
        item = next((i for i in reversed(overrides) if i.startswith(f"{key}=")), None)
        raise ConfigError(f"{key}: {msg} (in {f'override {item}' if item else where})")
    return cfg


def _blame(
    key: str, msg: str, origins: dict[str, str], sources: list[tuple[str, dict]]
) -> str | None:
    """Where a problem came from: of the keys it names (its own, and the key=value ones its message
    holds: n_embd and n_head=3), the one set last, so that an override is blamed rather than the
    file it changed."""
    section = key.rsplit(".", 1)[0]
    named = [key] + [
        k if "." in k else f"{section}.{k}" for k in re.findall(r"\b([a-z_][a-z_.]*)=", msg)
    ]
    order = [source for source, _ in sources]
    found = [origins[k] for k in named if k in origins]
    if not found:  # a whole section's problem (lora): whatever set a key in it
        found = [v for k, v in origins.items() if k.startswith(f"{key}.")][:1]
    return max(found, key=order.index) if found else None


REQUIRED_EXAMPLES = {
    "train.init_from": "gpt2 (a hub name; or a Hugging Face model folder, a run of ours)"
}


def _check_required(sources: list[tuple[str, dict]]) -> None:
    """A key a config file leaves for the command line (`???`, as finetune_shakespeare's weights)
    must be given by a later file or override."""
    left: dict[str, str] = {}  # key -> the file that left it
    for source, data in sources:
        for key in _flatten(data):
            if functools.reduce(lambda d, k: d[k], key.split("."), data) == "???":
                left[key] = source
            else:
                left.pop(key, None)
    for key, source in left.items():
        example = REQUIRED_EXAMPLES.get(key, "VALUE")
        raise ConfigError(f"{key} is required by {source} (it holds ???); add {key}={example}")


def resolve_paths(cfg: Config) -> Config:
    """cfg with its paths resolved once, from the folder the command runs in, as a run records them:
    data.dir absolute (null: the project's data/), train.init_from absolute where it names a folder
    here (else it is a hub name). Later commands (eval.py, heads.py) then find them from any folder.
    train.out_dir stays as given: nothing reads it back from a run's config."""
    data_dir = os.path.abspath(os.path.expanduser(cfg.data.dir)) if cfg.data.dir else str(DATA_DIR)
    init_from = cfg.train.init_from
    if init_from and Path(init_from).expanduser().exists():
        init_from = os.path.abspath(os.path.expanduser(init_from))
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, dir=data_dir),
        train=dataclasses.replace(cfg.train, init_from=init_from),
    )


def from_arguments(args: list[str]) -> Request:
    """`CONFIG [section.key=value ...]` as train.py and tools.bench take it: the first argument
    names a config file unless it is an override."""
    path = args[0] if args and "=" not in args[0] else None
    return load_config(path, args[1:] if path is not None else args)


def shipped_configs() -> list[tuple[str, str]]:
    """(name, the first sentence of its opening comment) for each config in configs/."""
    return [
        (path.stem, first_sentence(path.read_text())) for path in sorted(CONFIG_DIR.glob("*.yaml"))
    ]


def first_sentence(yaml_text: str) -> str:
    """The first sentence of a config's opening comment, over as many lines as it takes (up to an
    indented example command or the YAML itself); a dot inside a word (train.init_from, 1.88) goes
    on."""
    prose = []
    for line in yaml_text.splitlines():
        if not line.startswith("#") or line.startswith("#  "):
            break
        prose.append(line.lstrip("#").strip())
    text = " ".join(prose)
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    return text[: end.start() + 1] if end else text
