"""The run configuration: declared sections loaded from YAML, validated once, saved with the run.

A YAML file maps one-to-one onto ``Config``: a top-level section per field, a key per field of that
section, checked by ``common.config``. ``train`` holds what every run shares; a post-training
method's own section (``dpo:``, ``rl:``) is declared and validated beside the method, which
registers it here. Keys that were taken out or moved are answered from each section's ``REMOVED_KEYS``."""

from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import torch
import yaml
from pydantic import Field, PositiveInt, PrivateAttr, SerializeAsAny, model_validator

from common.config import ConfigError, Removed, Section, build, read_yaml, read_yaml_file, require
from common.files import atomic_write_text
from data.config import DataConfig
from data.tokenizer import CHAT_SPECIAL_TOKENS
from model.config import GPTConfig
from tracking.wandb_logger import LoggingConfig

if TYPE_CHECKING:  # a parent run is read by training.init_from when a run starts from one
    from training.init_from import ParentRun

DEFAULT_OUT_DIR = "runs/default"  # where a config without run.out_dir (and no file name) trains


# The largest step size and weight decay a run may ask for. Far past anything that trains (the
# configs use a few thousandths), low enough that the optimizer's arithmetic stays finite: a typo
# such as 1e300 is refused here instead of overflowing mid-run.
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 10.0
# A clip far above any gradient norm is no clip, which 0 already says; a larger one is a typo.
MAX_GRAD_CLIP = 1e6


# What a LoRA target may name besides one layer of the block: every layer of the attention, or of
# the feed-forward (their names start with these prefixes, as in model.gpt.Block).
LORA_GROUPS = {"attention": "attn.", "feed_forward": "ffn."}


class LoraConfig(Section):
    """Low-rank adapters (LoRA, training/lora.py): each targeted weight W of every block trains as
    W + (alpha / rank)·B·A, with W frozen and only A and B learned; dropout applies to the adapter's
    input, as in PEFT. ``targets`` names layers as ``model.gpt.Block`` does (``attn.qkv``,
    ``ffn.down``, ...) or whole groups: ``attention`` and ``feed_forward``.

    ``trainable_tokens`` are tokens whose rows of the token embedding (and of the LM head, the same
    matrix when tied) train in full, as PEFT's ``trainable_token_indices``: by default the chat
    format's tokens, which pretraining never shows. Frozen, the row that scores ``<|end|>`` keeps
    what pretraining taught it (never to be predicted), and low-rank adapters on the blocks hardly
    learn to end a turn."""

    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0, allow_inf_nan=False)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] = Field(["attention", "feed_forward"], min_length=1, description="layers or groups to adapt")
    trainable_tokens: list[str] = list(CHAT_SPECIAL_TOKENS)

    @model_validator(mode="after")
    def _distinct_tokens(self) -> LoraConfig:
        require(len(set(self.trainable_tokens)) == len(self.trainable_tokens),
                f"train.lora.trainable_tokens names a token twice: {self.trainable_tokens}")
        return self

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def layers(self, model: GPTConfig) -> list[str]:
        """The block's layers the targets name, in the block's order; a name that is no layer of
        ``model`` (say ``attn.qkv`` under latent attention) is refused, listing the layers it has."""
        from model.layer_map import block_linears  # LoRA's alone

        available = list(block_linears(model))
        chosen = set()
        for target in self.targets:
            if target in LORA_GROUPS:
                chosen.update(name for name in available if name.startswith(LORA_GROUPS[target]))
            elif target in available:
                chosen.add(target)
            else:
                raise ConfigError(
                    f"train.lora.targets: {target!r} is not a layer of this model (model.attention: "
                    f"{model.attention}); choose from "
                    f"{', '.join([*LORA_GROUPS, *available])}"
                )
        return [name for name in available if name in chosen]


class TrainConfig(Section):
    """Optimisation, budgets and the hardware choices of the training loop."""

    # Budgets: the run ends cleanly at whichever comes first; at least one must be set.
    max_steps: int | None = Field(None, ge=1)
    max_minutes: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_tokens: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=1, description="sequences per micro-batch (per process)")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    sampling: Literal["random", "epoch"] = Field("random", description="random offsets, or each window once")
    optimizer: Literal["adamw", "muon"] = Field("adamw", description="Muon for hidden matrices, AdamW for the rest")
    lr: float = Field(3e-3, gt=0, le=MAX_LR, description="AdamW's peak learning rate")
    min_lr: float = Field(3e-4, ge=0, description="floor the decay ends at, at most lr")
    lr_schedule: Literal["cosine", "wsd"] = Field("cosine", description="wsd: warmup, hold at lr, then linear decay")
    lr_decay_fraction: float = Field(0.4, gt=0, le=1, description="wsd only: the final fraction spent decaying")
    muon_lr: float = Field(0.02, gt=0, le=MAX_LR, description="Muon's peak; the schedule scales it like lr")
    # The small-model records train embedding tables far faster than the rest.
    value_embedding_lr: float | None = Field(None, gt=0, le=MAX_LR, description="value tables' AdamW peak; null: lr")
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    warmup_steps: int = Field(100, ge=0)
    weight_decay: float = Field(0.1, ge=0, le=MAX_WEIGHT_DECAY, description="applied to weight matrices only")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    # Adam divides by sqrt(v) + eps: past 1 it would outweigh any gradient of a normal scale.
    eps: float = Field(1e-8, gt=0, le=1)
    grad_clip: float = Field(1.0, ge=0, le=MAX_GRAD_CLIP, description="max global grad norm; 0 disables clipping")
    seed: int = 1337
    device: str = Field("auto", description="auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps")
    threads: Literal["auto"] | PositiveInt = Field("auto", description="CPU threads for torch; auto: the free CPUs")
    precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 where the device has it")
    compile: bool | Literal["auto"] = Field("auto", description="auto: on for CUDA, off elsewhere")
    peak_flops: Literal["auto"] | Annotated[float, Field(gt=0, allow_inf_nan=False)] = "auto"  # one device's, for MFU
    init_from: str | None = Field(None, description="a run directory to start from (its weights, shape, tokenizer)")
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="fsdp: each process holds a slice of the model")
    activation_checkpointing: bool = Field(False, description="recompute activations: less memory, more compute")
    lora: LoraConfig | None = Field(None, description="adapters on a frozen init_from; null: full fine-tuning")

    def budget_reached(self, step: int, tokens: int, seconds: float) -> str | None:
        """The budget a run at ``step``, having seen ``tokens`` in ``seconds`` of training, has used
        up (``max_steps``, ``max_tokens`` or ``max_minutes``), or None while all have some left."""
        if self.max_steps is not None and step >= self.max_steps:
            return "max_steps"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return "max_tokens"
        if self.max_minutes is not None and seconds >= self.max_minutes * 60.0:
            return "max_minutes"
        return None

    # Keys taken out or moved, at the value each had when it changed nothing (common.config.Removed).
    REMOVED_KEYS: ClassVar[dict[str, Removed]] = {
        "bigram_lr": Removed(None),
        "muon_iteration": Removed("newton_schulz"),
        "normuon": Removed(False, "was removed: NorMuon tied by the records protocol (docs/records.md, tried and "
                                  "dropped); delete the key"),
        "cautious_weight_decay": Removed(False),
        "muon_momentum_warmup": Removed(0),
        "short_window": Removed(None, "(short windows first) was taken out: it tied by the records protocol "
                                      "(docs/records.md); delete the key"),
        "short_window_share": Removed(0.3, "went with train.short_window, which tied by the records protocol "
                                           "(docs/records.md); delete the key"),
        "dpo_beta": Removed(0.1, "is now dpo.beta, in a dpo: section beside train: (as in configs/tiny-dpo.yaml); "
                                 "move the value there"),
        "dpo_rpo_alpha": Removed(0.0, "is now dpo.rpo_alpha, in a dpo: section beside train: (as in "
                                      "configs/tiny-dpo.yaml); move the value there"),
    }

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        require(not (self.max_steps is None and self.max_minutes is None and self.max_tokens is None),
                "no budget set: give train.max_steps, train.max_minutes or train.max_tokens")
        require(self.min_lr <= self.lr, f"train.min_lr must be at most train.lr ({self.lr:g}), got {self.min_lr!r}")
        require(self.device == "auto" or re.fullmatch(r"cpu|mps|cuda(:\d+)?", self.device) is not None,
                f"train.device must be auto, cpu, cuda, cuda:N or mps (got {self.device!r})")
        if self.parallel == "fsdp":
            from training.fsdp import torch_too_old

            require((too_old := torch_too_old(torch.__version__)) is None, str(too_old))
        return self


class EvalConfig(Section):
    """Periodic validation on a fixed subset, the final pass, and the text sample."""

    interval: int = Field(250, ge=0, description="steps between evaluations (or a tenth of max_minutes); 0: at the end")
    max_batches: int = Field(20, ge=1, description="size of the fixed validation subset used during training")
    batch_size: int | None = Field(None, ge=1, description="null: train.batch_size")
    final_max_batches: int | None = Field(None, ge=1, description="null: the whole validation split at the end")
    sample_prompt: str | None = Field(None, description="null: from the data (training/tasks/text.py)")
    sample_tokens: int = Field(64, ge=0, description="0 disables the sample")
    sample_temperature: float = Field(0.8, ge=0, allow_inf_nan=False, description="0: greedy")
    sample_top_k: int | None = Field(50, ge=1, description="null: no limit")
    sample_seed: int = 0
    # See docs/attention.md for the attention statistics and figures.
    attention_stats: bool = Field(True, description="each layer's entropy and induction score at evaluations")
    attention_image_interval: int = Field(4, ge=0, description="evaluations per wandb figure of the maps; 0: none")


class RunConfig(Section):
    out_dir: str | None = Field(None, pattern=r"\S", description="the run directory; null: runs/<config file stem>")
    overwrite: bool = Field(False, description="replace a run already in out_dir instead of refusing")
    checkpoint_interval: int = Field(500, ge=0, description="steps between checkpoints; 0 = only at the end")


class MethodSection(Section):
    """A post-training method's own section (``dpo:``, ``rl:``), declared beside the method and
    registered with ``METHOD_SECTIONS`` by ``register_section`` when its module is imported."""

    @classmethod
    def left_out(cls, config: Config) -> MethodSection | None:
        """The section a run of this method's data.format gets when the config leaves it out."""
        return cls()

    def check_run(self, config: Config) -> None:
        """Refuse, in one line, what the rest of ``config`` asks that this method cannot train with."""


# Each method's section: the module that declares it (imported only when a config has its data.format
# or its key), and the data.format it goes with.
METHOD_SECTIONS = {"dpo": ("training.tasks.dpo.config", "preference"), "rl": ("training.tasks.grpo.config", "rl")}
_REGISTERED: dict[str, type[MethodSection]] = {}


def register_section(key: str) -> Callable[[type[MethodSection]], type[MethodSection]]:
    def register(cls: type[MethodSection]) -> type[MethodSection]:
        _REGISTERED[key] = cls
        return cls
    return register


def method_section(key: str) -> type[MethodSection]:
    importlib.import_module(METHOD_SECTIONS[key][0])
    return _REGISTERED[key]


class Config(Section):
    model: GPTConfig | None = None  # None until with_parent reads it from train.init_from's run
    data: DataConfig = DataConfig()
    train: TrainConfig  # required: it holds the budget, which has no sensible default
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()
    run: RunConfig = RunConfig()
    dpo: SerializeAsAny[MethodSection] | None = None  # data.format: preference only (left out: every default)
    rl: SerializeAsAny[MethodSection] | None = None  # data.format: rl only
    # Set by with_parent; not keys of the YAML, and not saved: init_from says it.
    _parent: ParentRun | None = PrivateAttr(None)
    _model_section: dict[str, Any] | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _method_sections(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        return {**raw, **{key: build(method_section(key), raw[key], key) for key in METHOD_SECTIONS
                          if isinstance(raw.get(key), dict)}}

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        # A larger model vocabulary is fine (padding to a multiple of 64 is a common speed trick);
        # a smaller one would index past the embedding table.
        require(
            self.model is None or self.model.vocab_size >= self.data.vocab_size,
            f"model.vocab_size ({self.model and self.model.vocab_size}) is smaller than data.vocab_size "
            f"({self.data.vocab_size}); remove model.vocab_size to use the data's",
        )
        if self.train.lora is not None:
            _check_lora(self.train, self.model)
        for key, (_, data_format) in METHOD_SECTIONS.items():
            if getattr(self, key) is None and self.data.format == data_format:
                setattr(self, key, method_section(key).left_out(self))  # written out whole in config.yaml
            require(getattr(self, key) is None or self.data.format == data_format,
                    f"the {key} section is for data.format: {data_format} (this run's is {self.data.format})")
            if getattr(self, key) is not None:
                getattr(self, key).check_run(self)
        return self

    @property
    def parent(self) -> ParentRun | None:
        return self._parent

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out_dir if self.run.out_dir is not None else DEFAULT_OUT_DIR)

    @property
    def rows_per_example(self) -> int:
        """Sequences the model computes for each example of a batch: a reply pair's chosen and
        rejected, an rl question's ``rl.group_size`` completions, else one."""
        if self.rl is not None:
            return self.rl.group_size
        return 2 if self.dpo is not None else 1


def _check_lora(train: TrainConfig, model: GPTConfig) -> None:
    """A LoRA setting that cannot work is refused in one line, before anything is built."""
    lora = train.lora
    require(train.init_from is not None,
            "train.lora adapts a trained run's weights: set train.init_from to its directory (e.g. runs/tiny)")
    # The adapters train with AdamW, as in PEFT and TRL: Muon orthogonalises each update of a matrix,
    # which for the thin factors A and B (B starting at zero) would fix the update's every direction
    # at one size, and their product's learning rate would no longer follow train.lr.
    require(train.optimizer == "adamw",
            "train.lora trains its adapters with AdamW; set train.optimizer: adamw (and train.lr for it)")
    require(train.parallel == "ddp",
            "train.lora is not supported with train.parallel: fsdp; use ddp (the frozen weights are shared, "
            "the adapters are small)")
    if model is None:
        return  # the parent's model is checked when the run starts (with_parent)
    from model.layer_map import block_linears

    layers = lora.layers(model)
    widths = {name: min(linear.in_features, linear.out_features) for name, linear in block_linears(model).items()}
    narrowest = min(layers, key=widths.__getitem__)
    require(lora.rank <= widths[narrowest],
            f"train.lora.rank {lora.rank} is above the width of {narrowest} ({widths[narrowest]}); "
            f"use a rank of at most {widths[narrowest]}, or leave {narrowest} out of train.lora.targets")


def load_run_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config, apply ``--set key=value`` overrides, validate, return a ``Config``."""
    path = Path(path)
    raw = read_yaml_file(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, train:, ...)")
    raw = apply_overrides(raw, overrides)
    # A run directory named after the config file keeps runs of different configs apart.
    run = raw.get("run") or {}
    if isinstance(run, dict) and run.get("out_dir") is None:
        raw["run"] = {**run, "out_dir": f"runs/{path.stem}"}
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any], parent: ParentRun | None = None) -> Config:
    """Validate a plain nested dict (as read from YAML) into a ``Config``; ``raw`` is left as it was.
    With train.init_from the model comes from the parent run, read when the run starts
    (``with_parent``): until then the config's own model section is kept as written."""
    raw = dict(raw)  # its sections are replaced below, never changed in place
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    model_section = None
    if parent is not None:  # the parent run fixes the model's shape and the tokenizer's size
        from training.init_from import model_section_from_parent

        raw["model"] = model_section_from_parent(raw.get("model"), parent)
        raw["data"] = {**(raw.get("data") or {}), "vocab_size": parent.model_config.vocab_size}
    elif train.get("init_from"):
        model_section = raw.pop("model", None)
    elif "model" not in raw:
        # A fine-tuning config (tiny-chat, a LoRA one) has no model section: its parent run gives it.
        raise ConfigError("missing required config key 'model': describe the model (as configs/tiny.yaml does), "
                          "or set train.init_from to a trained run directory to start from its model")
    model, data = raw.get("model"), raw.get("data")
    if isinstance(model, dict) and "vocab_size" not in model:
        # model.vocab_size defaults to the tokenizer's size. data is checked first, so that a bad
        # data.vocab_size is named as the user wrote it, not as the model.vocab_size it is copied into.
        vocab = build(DataConfig, data, "data").vocab_size if isinstance(data, dict) else DataConfig().vocab_size
        raw["model"] = {**model, "vocab_size": vocab}
    config = build(Config, raw)
    config._parent, config._model_section = parent, model_section
    return config


def with_parent(config: Config) -> Config:
    """``config`` with the run its train.init_from names found and checked (a run cannot start from
    its own directory), its model taken from the parent; what a run starts with, once."""
    if not config.train.init_from or config.parent is not None:
        return config
    from training.init_from import find_parent, refuse_own_parent

    refuse_own_parent(config.train.init_from, str(config.out_dir))
    return config_from_dict({**config_to_dict(config), "model": config._model_section},
                            find_parent(config.train.init_from))


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` applied (values parsed as YAML)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or "" in parts:
            raise ConfigError(f"--set expects section.key=value (e.g. train.max_steps=100), got {item!r}")
        node = raw
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[: depth + 1])!r} is a value, not a section")
        node[parts[-1]] = read_yaml(text, source=f"--set {key}")
    return raw


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists/scalars (what config.yaml holds)."""
    return {name: None if section is None else section.model_dump() for name, section in config}


def save_config(config: Config, path: str | Path) -> None:
    body = yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
    atomic_write_text(path, "# Resolved configuration of this run, written by the trainer.\n" + body)
