"""Training configs: typed YAML with sections, `base:` inheritance and `section.key=value`
overrides, loaded as a `Request` (training/plan.py settles it into the final config).

An unknown key or a value of the wrong type is caught when a file or override is merged in, and the
error names the key, the closest valid one, and where it came from. A checkpoint's config.yaml is
data, not a config file: `config_from_data` builds it field by field, without OmegaConf, so
`${...}` in it stays text (OmegaConf would interpolate it, `${oc.env:HOME}` reading the
environment).
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
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from common.errors import ConfigError
from data import DATA_DIR

# the schema's classes, imported from here as before
from runs.config_schema import Config as Config
from runs.config_schema import DataConfig as DataConfig
from runs.config_schema import LogConfig as LogConfig
from runs.config_schema import OptimConfig as OptimConfig
from runs.config_schema import TrainConfig as TrainConfig
from runs.config_schema import problems

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


def _keys_under(schema: type, dotted: str) -> list[str]:
    """Valid keys of the section that `dotted` points into (for 'did you mean')."""
    node = schema
    for part in dotted.split(".")[:-1]:
        node = _unwrap(typing.get_type_hints(node).get(part)) if is_dataclass(node) else None
    if node is None or not is_dataclass(node):
        return []
    return [f.name for f in fields(node)]


def _explain(e: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(e, "full_key", None) or "?"
    if isinstance(e, ConfigKeyError):
        valid = _keys_under(Config, key)
        close = difflib.get_close_matches(key.split(".")[-1], valid, n=1, cutoff=0.6)
        hint = (
            f"did you mean {'.'.join(key.split('.')[:-1] + close[:1])}?"
            if close
            else f"valid keys here: {', '.join(valid)}"
        )
        return ConfigError(f"unknown config key {key} (in {source}); {hint}")
    if isinstance(e, ValidationError):
        msg = getattr(e, "msg", str(e)).splitlines()[0]
        if "is not a ListConfig" in msg:
            msg = "must be a list ([A,B] on the command line)"
        return ConfigError(f"{key}: {msg} (in {source})")
    return ConfigError(f"{key}: {str(e).splitlines()[0]} (in {source})")


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
    keys not indented), a section with nothing under it. OmegaConf would say "field 'train' is not
    Optional"."""
    if not isinstance(data, dict):
        return
    sections = typing.get_type_hints(Config)
    for key in data:
        home = next((s for s in sections if key in _keys_under(Config, f"{s}.{key}")), None)
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
    return [*chain, (str(path), _integral(data))]


def _integral(data: Any, schema: type = Config) -> Any:
    """`data` with integral numbers written as floats (1e3, 5.0e3, '5e3') made ints where the schema
    wants an int, as people write iteration counts (1.5 stays a float, for the type check to
    refuse), and true and false as that text where it wants text (train.compile)."""
    if not isinstance(data, dict) or not is_dataclass(schema):
        return data
    hints = typing.get_type_hints(schema)
    out = {}
    for key, value in data.items():
        kind = _unwrap(hints.get(key))
        if is_dataclass(kind):
            value = _integral(value, kind)
        elif (
            kind in (int, Optional[int])
            and isinstance(value, (float, str))
            and not isinstance(value, bool)
        ):
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                value = int(number)
        # `compile: true` is the text true, not 'True'
        elif kind is str and isinstance(value, bool):
            value = str(value).lower()
        out[key] = value
    return out


def parse_override(item: str) -> dict:
    if "=" not in item or item.startswith("=") or "." not in item.split("=", 1)[0]:
        raise ConfigError(
            f"override {item!r} must look like section.key=value (e.g. train.max_iters=100)"
        )
    try:
        data = _integral(OmegaConf.to_container(OmegaConf.from_dotlist([item])))
    except OmegaConfBaseException as e:
        raise ConfigError(f"override {item!r} cannot be parsed: {str(e).splitlines()[0]}") from None
    key, text = item.split("=", 1)
    value = functools.reduce(
        lambda d, k: d.get(k) if isinstance(d, dict) else None, key.split("."), data
    )
    # log.sample_prompt=ROMEO: is text, not YAML
    if isinstance(value, (dict, list)) and _kind(key) is str:
        data = functools.reduce(lambda inner, k: {k: inner}, reversed(key.split(".")), text)
    return data


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
    merged = OmegaConf.structured(Config)
    origins: dict[str, str] = {}
    for source, data in sources:
        try:
            merged = OmegaConf.merge(merged, data)
        except OmegaConfBaseException as e:
            raise _explain(e, source) from None
        origins.update(dict.fromkeys(_flatten(data), source))
    _check_required(sources)
    cfg: Config = resolve_paths(OmegaConf.to_object(merged))
    found = problems(cfg)
    if found:
        key, msg = found[0]
        raise ConfigError(
            f"{key}: {msg} (in {_blame(key, msg, origins, sources) or 'the defaults'})"
        )
    return Request(cfg, origins, name, tuple(overrides))


def with_overrides(base: Config, overrides: tuple[str, ...], where: str) -> Config:
    """base (a checkpoint's config) with the overrides' keys set as load_config sets them, checked
    as it checks them. The overrides are typed on the schema's defaults alone: base's values never
    pass through OmegaConf (config.yaml is data: `${...}` in it stays text)."""
    typed = OmegaConf.structured(Config)
    keys: list[str] = []
    for item in overrides:
        data = parse_override(item)
        try:
            typed = OmegaConf.merge(typed, data)
        except OmegaConfBaseException as e:
            raise _explain(e, f"override {item}") from None
        keys += _flatten(data)
    given: Config = resolve_paths(OmegaConf.to_object(typed))
    cfg = base
    for key in dict.fromkeys(keys):
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
    must be given by a later file or override: merging `???` keeps the schema's default, so
    OmegaConf cannot tell."""
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
    """`CONFIG [section.key=value ...]` as train.py and tools/bench.py take it: the first argument
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


def to_dict(cfg: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))
