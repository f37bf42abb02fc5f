"""The run configuration: typed dataclasses loaded from YAML, validated once, saved with the run.

A YAML file maps one-to-one onto ``Config``: a top-level section per dataclass field, a key per
field of that section, checked by ``common.config``. ``train`` holds what every run shares; a
post-training method's own section (``dpo:``, ``rl:``) is declared and validated beside the method
(``training/tasks/dpo/config.py``, ``training/tasks/grpo/config.py``). Keys that were taken out or
moved are answered from each section's ``REMOVED_KEYS``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml

from common.config import (
    ConfigError, Removed, build, check_types, read_yaml, read_yaml_file, require, require_in, require_one_of,
)
from common.files import atomic_write_text
from data.config import DataConfig
from data.chat import CHAT_SPECIAL_TOKENS
from model.layer_map import block_linears
from model.config import GPTConfig
from tracking.config import LoggingConfig
from training.fsdp import torch_too_old
from training.init_from import ParentRun, find_parent, model_section_from_parent, refuse_own_parent
from training.tasks.dpo.config import DPOConfig, check_dpo_run
from training.tasks.grpo.config import RLConfig, check_rl_run

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


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, training/lora.py): each targeted weight W of every block trains as
    W + (alpha / rank)·B·A, with W frozen and only A and B learned; dropout applies to the adapter's
    input, as in PEFT. ``targets`` names layers as ``model.gpt.Block`` does (``attn.qkv``,
    ``ffn.down``, ...) or whole groups: ``attention`` and ``feed_forward``.

    ``trainable_tokens`` are tokens whose rows of the token embedding (and of the LM head, the same
    matrix when tied) train in full, as PEFT's ``trainable_token_indices``: by default the chat
    format's tokens, which pretraining never shows. Frozen, the row that scores ``<|end|>`` keeps
    what pretraining taught it (never to be predicted), and low-rank adapters on the blocks hardly
    learn to end a turn."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["attention", "feed_forward"])
    trainable_tokens: list[str] = field(default_factory=lambda: list(CHAT_SPECIAL_TOKENS))

    def __post_init__(self) -> None:
        check_types(self, "train.lora")
        require(self.rank >= 1, f"train.lora.rank must be >= 1 (got {self.rank})")
        require_in(self.alpha, "train.lora.alpha", 0, math.inf, low_open=True, high_open=True)
        require_in(self.dropout, "train.lora.dropout", 0, 1, high_open=True)
        require(bool(self.targets), "train.lora.targets is empty; name the layers to adapt, e.g. "
                                    "[attention, feed_forward]")
        require(len(set(self.trainable_tokens)) == len(self.trainable_tokens),
                f"train.lora.trainable_tokens names a token twice: {self.trainable_tokens}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def layers(self, model: GPTConfig) -> list[str]:
        """The block's layers the targets name, in the block's order; a name that is no layer of
        ``model`` (say ``attn.qkv`` under latent attention) is refused, listing the layers it has."""
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
    # epoch: every non-overlapping window once per epoch, shuffled (see data/batches/text.py)
    sampling: str = "random"
    optimizer: str = "adamw"  # adamw | muon (Muon for hidden matrices, AdamW for the rest)
    lr: float = 3e-3  # AdamW's peak learning rate
    min_lr: float = 3e-4  # floor the decay ends at
    lr_schedule: str = "cosine"  # cosine | wsd (warmup, hold at lr, then linear decay to min_lr)
    lr_decay_fraction: float = 0.4  # wsd only: the final fraction of the budget spent decaying
    muon_lr: float = 0.02  # Muon's peak; the schedule scales it by the same factor as lr
    # AdamW's peak for the value-embedding tables (model.value_embeddings), scaled by the schedule
    # like muon_lr; null = lr. The small-model records train embedding tables far faster than the rest.
    value_embedding_lr: float | None = None
    muon_momentum: float = 0.95
    muon_momentum_warmup: int = 0  # steps over which Muon's momentum rises to muon_momentum (0 = none)
    warmup_steps: int = 100
    weight_decay: float = 0.1  # applied to weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    threads: int | str = "auto"  # CPU threads for torch; auto = the free CPUs (common/threads.py)
    precision: str = "auto"  # auto (bf16 autocast on GPUs and CPUs with bf16 arithmetic, else fp32) | bf16 | fp32
    compile: bool | str = "auto"  # auto (on for CUDA, off elsewhere) | true | false
    peak_flops: float | str = "auto"  # FLOP/s of one device for MFU; auto = table or measured
    init_from: str | None = None  # a run directory to start from (its weights, shape and tokenizer)
    # How torchrun's processes share the model: ddp (a whole copy each) or fsdp (each holds a slice
    # of every weight, gradient and optimizer state: for a model that does not fit one device).
    parallel: str = "ddp"
    # Recompute each block's activations in the backward pass instead of keeping them: less memory
    # for about a third more compute.
    activation_checkpointing: bool = False
    # Train low-rank adapters on a frozen copy of train.init_from's weights instead of every weight
    # (null = full fine-tuning).
    lora: LoraConfig | None = None

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
        "short_window": Removed(None, "(short windows first) was taken out: it tied by the records protocol "
                                      "(docs/records.md); delete the key"),
        "short_window_share": Removed(0.3, "went with train.short_window, which tied by the records protocol "
                                           "(docs/records.md); delete the key"),
        "dpo_beta": Removed(0.1, "is now dpo.beta, in a dpo: section beside train: (as in configs/tiny-dpo.yaml); "
                                 "move the value there"),
        "dpo_rpo_alpha": Removed(0.0, "is now dpo.rpo_alpha, in a dpo: section beside train: (as in "
                                      "configs/tiny-dpo.yaml); move the value there"),
    }

    def __post_init__(self) -> None:
        check_types(self, "train")
        require(
            not (self.max_steps is None and self.max_minutes is None and self.max_tokens is None),
            "no budget set: give train.max_steps, train.max_minutes or train.max_tokens",
        )
        require(self.max_steps is None or self.max_steps >= 1, "train.max_steps must be >= 1")
        require(self.max_minutes is None or (self.max_minutes > 0 and math.isfinite(self.max_minutes)),
                f"train.max_minutes must be a finite number > 0 (got {self.max_minutes!r})")
        require(self.max_tokens is None or self.max_tokens >= 1, "train.max_tokens must be >= 1")
        require(self.batch_size >= 1, "train.batch_size must be >= 1")
        require(self.grad_accum_steps >= 1, "train.grad_accum_steps must be >= 1")
        require_one_of(self.sampling, "train.sampling", ("random", "epoch"))
        require_one_of(self.optimizer, "train.optimizer", ("adamw", "muon"))
        require_in(self.lr, "train.lr", 0, MAX_LR, low_open=True)
        require_in(self.muon_lr, "train.muon_lr", 0, MAX_LR, low_open=True)
        if self.value_embedding_lr is not None:
            require_in(self.value_embedding_lr, "train.value_embedding_lr", 0, MAX_LR, low_open=True,
                        note=" (or null: the same as train.lr)")
        require_in(self.muon_momentum, "train.muon_momentum", 0, 1, high_open=True)
        require(self.muon_momentum_warmup >= 0, "train.muon_momentum_warmup must be >= 0 (0 = no warm-up)")
        require_in(self.min_lr, "train.min_lr", 0, self.lr, note=" (0 to train.lr)")
        require_one_of(self.lr_schedule, "train.lr_schedule", ("cosine", "wsd"))
        require_in(self.lr_decay_fraction, "train.lr_decay_fraction", 0, 1, low_open=True)
        require(self.warmup_steps >= 0, "train.warmup_steps must be >= 0")
        require_in(self.weight_decay, "train.weight_decay", 0, MAX_WEIGHT_DECAY)
        require_in(self.beta1, "train.beta1", 0, 1, high_open=True)
        require_in(self.beta2, "train.beta2", 0, 1, high_open=True)
        # Adam divides by sqrt(v) + eps: past 1 it would outweigh any gradient of a normal scale.
        require_in(self.eps, "train.eps", 0, 1, low_open=True)
        require_in(self.grad_clip, "train.grad_clip", 0, MAX_GRAD_CLIP, note=" (0 disables clipping)")
        require(
            self.device == "auto" or re.fullmatch(r"cpu|mps|cuda(:\d+)?", self.device) is not None,
            f"train.device must be auto, cpu, cuda, cuda:N or mps (got {self.device!r})",
        )
        require(self.threads == "auto" or (isinstance(self.threads, int) and self.threads >= 1),
                f"train.threads must be auto or a whole number >= 1 (got {self.threads!r})")
        require_one_of(self.precision, "train.precision", ("auto", "bf16", "fp32"))
        require_one_of(self.parallel, "train.parallel", ("ddp", "fsdp"))
        if self.parallel == "fsdp":
            require((too_old := torch_too_old(torch.__version__)) is None, str(too_old))
        require(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"train.compile must be auto, true or false (got {self.compile!r})",
        )
        require(
            self.peak_flops == "auto"
            or (not isinstance(self.peak_flops, str) and 0 < self.peak_flops < math.inf),
            f"train.peak_flops must be auto or a positive number (got {self.peak_flops!r})",
        )


@dataclass
class EvalConfig:
    """Periodic validation on a fixed subset, the final pass, and the text sample."""

    interval: int = 250  # steps between evaluations, or a tenth of train.max_minutes if sooner; 0 = final only
    max_batches: int = 20  # size of the fixed validation subset used during training
    batch_size: int | None = None  # None = train.batch_size
    final_max_batches: int | None = None  # None = the whole validation split at the end
    # None: derived from the run's data (data/sample_prompt.py): "ROMEO:" for the embedded plays,
    # the first words of the held-out text for any other corpus.
    sample_prompt: str | None = None
    sample_tokens: int = 64  # 0 disables the sample
    sample_temperature: float = 0.8
    sample_top_k: int | None = 50
    sample_seed: int = 0
    # Attention at every evaluation (text runs): each layer's mean entropy and the best induction
    # score, to metrics.jsonl and wandb; and every attention_image_interval-th evaluation a figure of
    # the maps over sample_prompt, to wandb only (0 = never). See docs/attention.md.
    attention_stats: bool = True
    attention_image_interval: int = 4

    def __post_init__(self) -> None:
        check_types(self, "eval")
        require(self.attention_image_interval >= 0, "eval.attention_image_interval must be >= 0 (0 = no images)")
        require(self.interval >= 0, "eval.interval must be >= 0 (0 = only at the end)")
        require(self.max_batches >= 1, "eval.max_batches must be >= 1")
        require(self.batch_size is None or self.batch_size >= 1, "eval.batch_size must be >= 1")
        require(
            self.final_max_batches is None or self.final_max_batches >= 1,
            "eval.final_max_batches must be >= 1 or null (whole split)",
        )
        require(self.sample_tokens >= 0, "eval.sample_tokens must be >= 0")
        require_in(self.sample_temperature, "eval.sample_temperature", 0, math.inf, high_open=True,
                   note=" (0 = greedy)")
        require(self.sample_top_k is None or self.sample_top_k >= 1,
                f"eval.sample_top_k must be a whole number >= 1, or null for no limit (got {self.sample_top_k!r})")


@dataclass
class RunConfig:
    out_dir: str | None = None  # the run directory; None = runs/<config file stem>
    overwrite: bool = False  # replace a run already in out_dir instead of refusing
    checkpoint_interval: int = 500  # steps between checkpoints; 0 = only at the end

    def __post_init__(self) -> None:
        check_types(self, "run")
        require(self.out_dir is None or self.out_dir.strip() != "", "run.out_dir must not be empty")
        require(self.checkpoint_interval >= 0, "run.checkpoint_interval must be >= 0")


@dataclass(kw_only=True)
class Config:
    model: GPTConfig
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig  # required: it holds the budget, which has no sensible default
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    dpo: DPOConfig | None = None  # data.format: preference only (left out: every default)
    rl: RLConfig | None = None  # data.format: rl only
    # The run train.init_from names, found and checked once, when the config is read
    # (config_from_dict); not a key of the YAML, and not saved: init_from says it.
    parent: ParentRun | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_types(self)
        # A larger model vocabulary is fine (padding to a multiple of 64 is a common speed trick);
        # a smaller one would index past the embedding table.
        require(
            self.model.vocab_size >= self.data.vocab_size,
            f"model.vocab_size ({self.model.vocab_size}) is smaller than data.vocab_size "
            f"({self.data.vocab_size}); remove model.vocab_size to use the data's",
        )
        if self.train.lora is not None:
            _check_lora(self.train, self.model)
        if self.data.format == "preference" and self.dpo is None:
            self.dpo = DPOConfig()  # written out whole in the run's config.yaml
        check_dpo_run(self)
        check_rl_run(self)

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


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a plain nested dict (as read from YAML) into a ``Config``; ``raw`` is left as it was."""
    raw = dict(raw)  # its sections are replaced below, never changed in place
    train = raw.get("train")
    parent = None
    if isinstance(train, dict) and train.get("init_from"):
        run = raw.get("run") if isinstance(raw.get("run"), dict) else {}
        out_dir = run.get("out_dir") or DEFAULT_OUT_DIR
        if isinstance(train["init_from"], str) and isinstance(out_dir, str):
            refuse_own_parent(train["init_from"], out_dir)
        # The parent run fixes the model's shape and the tokenizer's size.
        parent = find_parent(train["init_from"])
        raw["model"] = model_section_from_parent(raw.get("model"), parent)
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        raw["data"] = {**data, "vocab_size": parent.model_config.vocab_size}
    if "model" not in raw and parent is None:
        # A fine-tuning config (tiny-chat, a LoRA one) has no model section: its parent run gives it.
        raise ConfigError("missing required config key 'model': describe the model (as configs/tiny.yaml does), "
                          "or set train.init_from to a trained run directory to start from its model")
    model, data = raw.get("model"), raw.get("data")
    if isinstance(model, dict):
        # model.vocab_size defaults to the tokenizer's size, so it is filled in before validation.
        if "vocab_size" not in model:
            if isinstance(data, dict):
                # Checked as data's first, so that a bad data.vocab_size is named as the user wrote it,
                # not as the model.vocab_size it is copied into.
                raw["data"] = data = build(DataConfig, data, "data")
            vocab = data.vocab_size if isinstance(data, DataConfig) else DataConfig.vocab_size
            model = {**model, "vocab_size": vocab}
        raw["model"] = GPTConfig.from_dict(model)  # the model section's loader explains its values
    config = build(Config, raw)
    config.parent = parent
    return config


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
    sections = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return {name: None if section is None else dataclasses.asdict(section) for name, section in sections.items()}


def save_config(config: Config, path: str | Path) -> None:
    body = yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
    atomic_write_text(path, "# Resolved configuration of this run, written by the trainer.\n" + body)
