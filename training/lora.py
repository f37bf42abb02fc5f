"""LoRA (``train.lora``): low-rank adapters on the linear layers of a frozen model.

Each targeted weight W is read as ``W + scale·B·A`` (scale = alpha / rank) through
``torch.nn.utils.parametrize``, so every reader of ``layer.weight`` sees the adapted weight, latent
attention's absorbed decoding included. B starts at zero: an adapted model starts equal to its
parent. Dropout, as in PEFT, drops the adapter's input alone, which the weight cannot carry, so a
forward hook adds the difference while training. Reading the weight whole makes the backward pass
cost about what full fine-tuning's does; what LoRA saves is the optimizer state, the gradients and
the checkpoint.

The run keeps the adapter in PEFT's files under the Hugging Face export's layer names
(``model.layer_map.block_linears``), so ``peft.PeftModel.from_pretrained`` on the parent's export
computes this model: one A and a stacked B on ``attn.qkv`` are three LoRAs on q, k and v sharing A
(likewise ``gate_up``, ``down`` and ``kv_up``). ``model.safetensors`` holds the merged weights."""

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ContextManager

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from common.files import atomic_write_bytes, atomic_write_text
from model.layer_map import block_linears
from model.gpt import GPT
from rundir.files import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from training.adapters import Adapters
from training.config import ConfigError, LoraConfig

# PEFT's prefix for the wrapped transformers model (PeftModel.base_model.model).
_PEFT_PREFIX = "base_model.model."


class LowRankDelta(nn.Module):
    """The parametrization of one linear layer's weight: ``weight + scale·B·A``."""

    def __init__(self, weight: torch.Tensor, rank: int, scale: float, dropout: float) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        options = dict(device=weight.device, dtype=weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, **options))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, **options))
        # nn.Linear's (and PEFT's) initialisation for A; B at zero leaves the weight unchanged.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = scale
        self.dropout = nn.Dropout(dropout)
        self.enabled = True  # off inside adapters_disabled

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return weight
        return weight + self.scale * (self.lora_B @ self.lora_A)

    def input_dropout(self, layer: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor | None:
        """A forward hook: the layer computed ``x (W + sBA)ᵀ``; PEFT's dropout wants
        ``x Wᵀ + s·drop(x) (BA)ᵀ``, which is that plus ``s·(drop(x) - x) (BA)ᵀ``."""
        if not (self.training and self.enabled):
            return None
        x = args[0]
        return output + self.scale * F.linear(F.linear(self.dropout(x) - x, self.lora_A), self.lora_B)


class TrainedRows(nn.Module):
    """The parametrization of a token matrix (the embedding, the LM head) whose rows for a few tokens
    train in full: the weight with rows ``index`` replaced by ``rows``, as PEFT's trainable tokens
    compute it. The rows start as the frozen weight's, so the model starts as its parent."""

    def __init__(self, weight: torch.Tensor, index: list[int]) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor(index, dtype=torch.long, device=weight.device))
        self.rows = nn.Parameter(weight.detach()[self.index].clone())
        self.enabled = True  # off inside adapters_disabled

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.index_copy(0, self.index, self.rows) if self.enabled else weight


def add_adapters(model: GPT, lora: LoraConfig, token_ids: list[int] | None = None) -> None:
    """Freeze ``model`` and give the layers ``lora`` targets their adapters and the token matrices
    the trainable rows ``token_ids``: then the only trainable parameters. Draws A from torch's generator."""
    model.requires_grad_(False)
    for block in model.blocks:
        for name in lora.layers(model.config):
            layer = block.get_submodule(name)
            delta = LowRankDelta(layer.weight, lora.rank, lora.scale, lora.dropout)
            parametrize.register_parametrization(layer, "weight", delta)
            if lora.dropout > 0:
                layer.register_forward_hook(delta.input_dropout)
    if token_ids:
        rows = TrainedRows(model.tok_emb.weight, token_ids)
        parametrize.register_parametrization(model.tok_emb, "weight", rows)
        # A tied head is the same matrix: it reads the same rows (one parameter, trained once).
        head_rows = rows if model.config.tie_embeddings else TrainedRows(model.lm_head.weight, token_ids)
        parametrize.register_parametrization(model.lm_head, "weight", head_rows)


def parametrized(model: nn.Module, kind: type | tuple[type, ...]) -> Iterator[tuple[str, nn.Module, nn.Module]]:
    """(name, layer, parametrization) of each layer of ``model`` whose weight a ``kind`` parametrizes
    (a tied head shares the embedding's)."""
    for name, module in model.named_modules():
        if parametrize.is_parametrized(module, "weight"):
            for part in module.parametrizations.weight:
                if isinstance(part, kind):
                    yield name, module, part


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """``model`` as its frozen base for the block (a DPO reference without a second copy of the
    weights), then with its adapters (and trained rows) back on."""
    deltas = [part for _, _, part in parametrized(model, (LowRankDelta, TrainedRows))]
    for delta in deltas:
        delta.enabled = False
    try:
        yield
    finally:
        for delta in deltas:
            delta.enabled = True


def merged_copy(model: GPT) -> GPT:
    """A plain model whose weights are the adapted ones (``W + scale·B·A``): what the run saves
    as ``model.safetensors``. ``model`` itself when it has no adapters."""
    adapted = [(name, layer) for name, layer, _ in parametrized(model, (LowRankDelta, TrainedRows))]
    if not adapted:
        return model
    # A new model rather than a deep copy with the parametrizations removed: parametrize gives each
    # layer a class of its own, which a copy shares, and removing them from the copy would edit it.
    state = {name: tensor for name, tensor in model.state_dict().items() if ".parametrizations." not in name}
    with torch.no_grad():
        state |= {f"{name}.weight": layer.weight.detach() for name, layer in adapted}
    device = model.tok_emb.weight.device
    # The new model's initialisation draws no number from the run's generators: a save must leave
    # them as they are, or a resumed run (whose state was captured before) would drift from this one.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        merged = GPT(model.config)
    merged.load_state_dict(state)
    return merged.train(model.training)


def adapted_state(model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plain model's ``weights`` (what ``model.safetensors`` holds) as a state dict for ``model``:
    each adapted layer's frozen weight becomes its merged weight and its B zero, so ``model`` then
    computes exactly ``weights``. ``weights`` unchanged when ``model`` has no adapters."""
    adapted, rows = list(parametrized(model, LowRankDelta)), list(parametrized(model, TrainedRows))
    if not adapted and not rows:
        return weights
    state = {key: weights.get(key, tensor) for key, tensor in model.state_dict().items()}
    for name, _, delta in adapted:
        state[f"{name}.parametrizations.weight.original"] = weights[f"{name}.weight"]
        state[f"{name}.parametrizations.weight.0.lora_B"] = torch.zeros_like(delta.lora_B)
    for name, _, trained in rows:  # the rows of the merged matrix, over the merged matrix
        state[f"{name}.parametrizations.weight.original"] = weights[f"{name}.weight"]
        merged = weights[f"{name}.weight"]
        state[f"{name}.parametrizations.weight.0.rows"] = merged[trained.index.to(merged.device)]
    return state


def peft_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The adapters under PEFT's keys for the Hugging Face export: a fused layer's A for each of its
    parts, and B split by the parts' rows (``model.layer_map.block_linears``)."""
    linears = block_linears(model.config)
    state = {}
    for i, block in enumerate(model.blocks):
        for name, _, delta in parametrized(block, LowRankDelta):
            parts = linears[name].parts
            rows = delta.lora_B.split([part.rows for part in parts])
            for part, b in zip(parts, rows, strict=True):
                key = f"{_PEFT_PREFIX}model.layers.{i}.{part.name}"
                state[f"{key}.lora_A.weight"] = delta.lora_A
                state[f"{key}.lora_B.weight"] = b
    # PEFT's trainable tokens: the embedding's rows, and an untied head's (a tied head reads the embedding's).
    for name, _, rows in parametrized(model, TrainedRows):
        if name == "tok_emb" or not model.config.tie_embeddings:
            key = {"tok_emb": "model.embed_tokens", "lm_head": "lm_head"}[name]
            state[f"{_PEFT_PREFIX}{key}.token_adapter.trainable_tokens_delta"] = rows.rows
    # Copies: the parts of a fused layer share A, and safetensors stores no tensor twice.
    return {key: tensor.detach().to("cpu", copy=True).contiguous() for key, tensor in state.items()}


def peft_config(model: GPT, lora: LoraConfig) -> dict[str, object]:
    """``adapter_config.json``: PEFT's LoRA settings for the export's layer names, defaults left to
    PEFT; ``base_model_name_or_path`` empty (the parent's export has no fixed path). Trained rows are
    ``trainable_token_indices``: one list (PEFT ties the head), or one per matrix when untied."""
    linears = block_linears(model.config)
    modules = sorted({part.name.rpartition(".")[2] for name in lora.layers(model.config) for part in linears[name].parts})
    indices = next((rows.index.tolist() for _, _, rows in parametrized(model, TrainedRows)), None)
    if indices is not None and not model.config.tie_embeddings:
        indices = {"embed_tokens": indices, "lm_head": indices}
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "trainable_token_indices": indices,
        "inference_mode": True,
    }


def save_adapter(directory: Path, model: GPT, lora: LoraConfig) -> None:
    """Write the adapter in PEFT's two files into ``directory``, each atomically."""
    from safetensors.torch import save

    # Serialised in memory and written by Python, so a full disk is an OSError naming the file.
    weights = save(peft_state_dict(model), metadata={"format": "pt"})
    atomic_write_bytes(directory / ADAPTER_WEIGHTS_FILE, weights)
    atomic_write_text(directory / ADAPTER_CONFIG_FILE, json.dumps(peft_config(model, lora), indent=2) + "\n")


def describe(model: GPT, lora: LoraConfig) -> str:
    """What trains: the adapted layers, the token rows, and the share of the parameters that learn."""
    trained, total = trainable_parameters(model), model.num_params()
    rows = ""
    if lora.trainable_tokens and any(True for _ in parametrized(model, TrainedRows)):
        matrix = "the token embedding (the LM head's too, tied)" if model.config.tie_embeddings else (
            "the token embedding and the LM head")
        rows = f", and the rows of {' '.join(lora.trainable_tokens)} in {matrix}"
    return (f"LoRA rank {lora.rank} (alpha {lora.alpha:g}) on {', '.join(lora.layers(model.config))} of every "
            f"block{rows}: {trained:,} of {total:,} parameters train ({100 * trained / total:.2f}%)")


class LoraAdapters(Adapters):
    """``train.lora``: the parent's weights frozen, low-rank adapters on them train (see ``training.adapters``)."""

    holds_base = True

    def __init__(self, lora: LoraConfig) -> None:
        self.lora = lora

    def apply(self, model: GPT, tokenizer: Any) -> None:
        ids = [tokenizer.token_to_id(token) for token in self.lora.trainable_tokens]
        missing = [token for token, token_id in zip(self.lora.trainable_tokens, ids) if token_id is None]
        if missing:
            raise ConfigError(f"train.lora.trainable_tokens: {', '.join(missing)} not in the run's tokenizer; name "
                              "tokens it has, or set train.lora.trainable_tokens: []")
        add_adapters(model, self.lora, ids)

    def trained(self, model: GPT) -> str:
        return f"{trainable_parameters(model):,} of {model.num_params() / 1e6:.2f}M parameters"

    def describe(self, model: GPT) -> str:
        return describe(model, self.lora)

    def merged(self, model: GPT) -> GPT:
        return merged_copy(model)

    def state_for(self, model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return adapted_state(model, weights)

    def save(self, run_dir: Path, model: GPT) -> None:
        save_adapter(run_dir, model, self.lora)

    def report(self, model: GPT, run_dir: Path) -> tuple[str, dict[str, Any]]:
        trained, size = trainable_parameters(model), (run_dir / ADAPTER_WEIGHTS_FILE).stat().st_size
        line = (f"LoRA: {trained:,} of {model.num_params():,} parameters trained; the adapter "
                f"({size / 1024:.1f} KiB) is in PEFT's files beside the merged weights")
        return line, {"trained_params": trained, "adapter_bytes": size}

    def base(self, model: nn.Module) -> ContextManager[None]:
        return adapters_disabled(model)
