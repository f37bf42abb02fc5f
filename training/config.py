"""The run configuration: typed dataclasses loaded from YAML, validated once, saved with the run.

A YAML file maps one-to-one onto ``Config``: a top-level section per dataclass field, a key per
field of that section. Loading walks the dataclass fields and their type hints, so every section
(including ``model`` and ``data``, which other packages define) gets the same checks: unknown keys
are rejected with a suggestion, types are strict (``true`` is not an int, ``"3"`` is not a number,
an int is accepted where a float is expected), and each dataclass's ``__post_init__`` then checks
values. Anything wrong becomes a ``ConfigError`` naming the key, raised before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from common.errors import UserError
from common.files import atomic_write_text
from data import DataConfig
from model import GPTConfig


class ConfigError(UserError):
    """A configuration file or override the user has to fix."""


@dataclass
class TrainConfig:
    """Optimisation, budgets and the hardware choices of the training loop."""

    # Budgets: the run ends cleanly at whichever comes first; at least one must be set.
    max_steps: int | None = None
    max_minutes: float | None = None
    max_tokens: int | None = None
    batch_size: int = 32  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    # random: windows at uniformly random offsets, with replacement (nanoGPT's way);
    # epoch: every non-overlapping window once per epoch, shuffled (see data/batches.py)
    sampling: str = "random"
    optimizer: str = "adamw"  # adamw | muon (Muon for hidden matrices, AdamW for the rest)
    lr: float = 3e-3  # AdamW's peak learning rate
    min_lr: float = 3e-4  # floor the decay ends at
    lr_schedule: str = "cosine"  # cosine | wsd (warmup, hold at lr, then linear decay to min_lr)
    lr_decay_fraction: float = 0.4  # wsd only: the final fraction of the budget spent decaying
    muon_lr: float = 0.02  # Muon's peak; the schedule scales it by the same factor as lr
    muon_momentum: float = 0.95
    warmup_steps: int = 100
    weight_decay: float = 0.1  # applied to weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto (bf16 autocast where the GPU supports it, else fp32) | bf16 | fp32
    compile: bool | str = "auto"  # auto (on for CUDA, off elsewhere) | true | false
    peak_flops: float | str = "auto"  # FLOP/s of one device for MFU; auto = table or measured

    def __post_init__(self) -> None:
        if self.max_steps is None and self.max_minutes is None and self.max_tokens is None:
            raise ValueError(
                "no budget set: give train.max_steps, train.max_minutes or train.max_tokens"
            )
        _check(self.max_steps is None or self.max_steps >= 1, "train.max_steps must be >= 1")
        _check(self.max_minutes is None or self.max_minutes > 0, "train.max_minutes must be > 0")
        _check(self.max_tokens is None or self.max_tokens >= 1, "train.max_tokens must be >= 1")
        _check(self.batch_size >= 1, "train.batch_size must be >= 1")
        _check(self.grad_accum_steps >= 1, "train.grad_accum_steps must be >= 1")
        _check(
            self.sampling in ("random", "epoch"),
            f"train.sampling must be random or epoch (got {self.sampling!r})",
        )
        _check(
            self.optimizer in ("adamw", "muon"),
            f"train.optimizer must be adamw or muon (got {self.optimizer!r})",
        )
        _check(self.lr > 0, "train.lr must be > 0")
        _check(self.muon_lr > 0, "train.muon_lr must be > 0")
        _check(0 <= self.muon_momentum < 1, "train.muon_momentum must be in [0, 1)")
        _check(0 <= self.min_lr <= self.lr, "train.min_lr must be between 0 and train.lr")
        _check(
            self.lr_schedule in ("cosine", "wsd"),
            f"train.lr_schedule must be cosine or wsd (got {self.lr_schedule!r})",
        )
        _check(0 < self.lr_decay_fraction <= 1, "train.lr_decay_fraction must be in (0, 1]")
        _check(self.warmup_steps >= 0, "train.warmup_steps must be >= 0")
        _check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "train.beta1/beta2 must be in [0, 1)")
        _check(self.eps > 0, "train.eps must be > 0")
        _check(self.grad_clip >= 0, "train.grad_clip must be >= 0 (0 disables clipping)")
        _check(
            self.device == "auto" or re.fullmatch(r"cpu|mps|cuda(:\d+)?", self.device) is not None,
            f"train.device must be auto, cpu, cuda, cuda:N or mps (got {self.device!r})",
        )
        _check(
            self.precision in ("auto", "bf16", "fp32"),
            f"train.precision must be auto, bf16 or fp32 (got {self.precision!r})",
        )
        _check(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"train.compile must be auto, true or false (got {self.compile!r})",
        )
        _check(
            self.peak_flops == "auto"
            or (not isinstance(self.peak_flops, str) and self.peak_flops > 0),
            f"train.peak_flops must be auto or a positive number (got {self.peak_flops!r})",
        )


@dataclass
class EvalConfig:
    """Periodic validation on a fixed subset, the final pass, and the text sample."""

    interval: int = 250  # steps between evaluations; 0 = only the final pass
    max_batches: int = 20  # size of the fixed validation subset used during training
    batch_size: int | None = None  # None = train.batch_size
    final_max_batches: int | None = None  # None = the whole validation split at the end
    sample_prompt: str = "ROMEO:"
    sample_tokens: int = 64  # 0 disables the sample
    sample_temperature: float = 0.8
    sample_top_k: int | None = 50
    sample_seed: int = 0

    def __post_init__(self) -> None:
        _check(self.interval >= 0, "eval.interval must be >= 0 (0 = only at the end)")
        _check(self.max_batches >= 1, "eval.max_batches must be >= 1")
        _check(self.batch_size is None or self.batch_size >= 1, "eval.batch_size must be >= 1")
        _check(
            self.final_max_batches is None or self.final_max_batches >= 1,
            "eval.final_max_batches must be >= 1 or null (whole split)",
        )
        _check(self.sample_tokens >= 0, "eval.sample_tokens must be >= 0")
        _check(self.sample_temperature >= 0, "eval.sample_temperature must be >= 0")
        _check(self.sample_top_k is None or self.sample_top_k >= 1, "eval.sample_top_k must be >= 1")


@dataclass
class WandbConfig:
    mode: str = "auto"  # auto | online | offline | disabled
    project: str = "minigpt"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(
            self.mode in ("auto", "online", "offline", "disabled"),
            f"logging.wandb.mode must be auto, online, offline or disabled (got {self.mode!r})",
        )


@dataclass
class LoggingConfig:
    interval: int = 10  # steps between lines in metrics.jsonl (and wandb points)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        _check(self.interval >= 1, "logging.interval must be >= 1")


@dataclass
class RunConfig:
    out_dir: str | None = None  # the run directory; None = runs/<config file stem>
    overwrite: bool = False  # replace a run already in out_dir instead of refusing
    checkpoint_interval: int = 500  # steps between checkpoints; 0 = only at the end

    def __post_init__(self) -> None:
        _check(self.out_dir is None or self.out_dir.strip() != "", "run.out_dir must not be empty")
        _check(self.checkpoint_interval >= 0, "run.checkpoint_interval must be >= 0")


@dataclass(kw_only=True)
class Config:
    model: GPTConfig
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig  # required: it holds the budget, which has no sensible default
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        # A larger model vocabulary is fine (padding to a multiple of 64 is a common speed trick);
        # a smaller one would index past the embedding table.
        _check(
            self.model.vocab_size >= self.data.vocab_size,
            f"model.vocab_size ({self.model.vocab_size}) is smaller than data.vocab_size "
            f"({self.data.vocab_size}); remove model.vocab_size to use the data's",
        )

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out_dir if self.run.out_dir is not None else "runs/default")


# ---------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config, apply ``--set key=value`` overrides, validate, return a ``Config``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found; pass an existing YAML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e}") from None
    raw = _parse_yaml(text, source=str(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, train:, ...)")
    raw = apply_overrides(raw, overrides)
    run = raw.get("run")
    if isinstance(run, dict) and run.get("out_dir") is None:
        # A run directory named after the config file keeps runs of different configs apart.
        raw["run"] = {**run, "out_dir": f"runs/{path.stem}"}
    elif run is None:
        raw["run"] = {"out_dir": f"runs/{path.stem}"}
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a plain nested dict (as read from YAML) into a ``Config``."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping of sections")
    raw = dict(raw)
    # model.vocab_size defaults to the tokenizer's size, so it is filled in before validation.
    model = raw.get("model")
    if isinstance(model, dict) and "vocab_size" not in model:
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        data_vocab = data.get("vocab_size", _field_default(DataConfig, "vocab_size"))
        raw["model"] = {**model, "vocab_size": data_vocab}
    if "model" not in raw:
        raise ConfigError("missing config section 'model' (n_layer, n_head, n_kv_head, n_embd, block_size)")
    return _build(Config, raw, "")


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` applied (values parsed as YAML)."""
    raw = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or any(p == "" for p in parts) or len(parts) < 2:
            raise ConfigError(f"--set expects section.key=value (e.g. train.max_steps=100), got {item!r}")
        value = _parse_yaml(text, source=f"--set {key}")
        node = raw
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {key}: {where!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists/scalars (what config.yaml holds)."""
    return dataclasses.asdict(config)


def config_to_yaml(config: Config) -> str:
    import yaml

    body = yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
    return "# Resolved configuration of this run, written by the trainer.\n" + body


def save_config(config: Config, path: str | Path) -> None:
    atomic_write_text(path, config_to_yaml(config))


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML the way config files are parsed (YAML 1.2 numbers and booleans)."""
    return _parse_yaml(text, source)


# ---------------------------------------------------------------------------------------------
# YAML dialect


@functools.cache
def _yaml_loader() -> type:
    """A SafeLoader that reads numbers and booleans as YAML 1.2 does.

    PyYAML follows YAML 1.1, where ``3e-3`` (no dot) is a *string* and ``on``/``no`` are
    booleans; both surprise people writing learning rates and wandb modes, so only true/false are
    booleans here and any decimal or exponent form is a float.
    """
    import yaml

    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (bool_tag, float_tag)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Loader.add_implicit_resolver(
        float_tag,
        re.compile(
            r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                |[-+]?(?:[0-9][0-9_]*)[eE][-+]?[0-9]+
                |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    return Loader


def _parse_yaml(text: str, source: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}{where}: invalid YAML ({problem}); fix the syntax") from None


# ---------------------------------------------------------------------------------------------
# Validation by walking the dataclass fields


def _build(cls: type, raw: Any, path: str) -> Any:
    where = path or "the config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {_show(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in raw:
        if key not in fields:
            raise ConfigError(_unknown_key_message(str(key), list(fields), path))
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        key = f"{path}.{name}" if path else name
        if name in raw:
            kwargs[name] = _convert(raw[name], hints[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required config key {key!r}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (UserError, ValueError, TypeError) as e:  # e.g. DataError from the data section
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if path and not message.startswith(path):
            message = f"{path}: {message}"
        raise ConfigError(message) from None


def _convert(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin is Union or origin is types.UnionType:
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key} must be {_describe(hint)}, got null")
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key} must be {_describe(hint)}, got {_show(value)}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{key} must be one of {', '.join(map(repr, args))}, got {_show(value)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be {_describe(hint)}, got {_show(value)}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {_show(value)}")
        kt, vt = args if args else (Any, Any)
        return {_convert(k, kt, key): _convert(v, vt, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        if value is None:
            raise ConfigError(f"{key} must be a section (a mapping of keys), got null")
        return _build(hint, value, key)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is type(None):
        if value is None:
            return None
    elif isinstance(hint, type):
        if isinstance(value, hint):
            return value
    else:
        return value  # a hint this walker does not understand: leave it to __post_init__
    raise ConfigError(f"{key} must be {_describe(hint)}, got {_show(value)}")


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        parts = [_describe(a) for a in args if a is not type(None)]
        text = " or ".join(parts)
        return text + " or null" if type(None) in args else text
    if origin in (list, tuple):
        return f"a list of {_describe(args[0]) if args else 'values'}"
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if dataclasses.is_dataclass(hint):
        return "a section (mapping)"
    return getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _unknown_key_message(key: str, valid: list[str], path: str) -> str:
    full = f"{path}.{key}" if path else key
    kind = "config key" if path else "config section"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        suggestion = f"{path}.{close[0]}" if path else close[0]
        return f"unknown {kind} {full!r}; did you mean {suggestion!r}?"
    return f"unknown {kind} {full!r}; valid keys{' in ' + path if path else ''}: {', '.join(valid)}"


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
