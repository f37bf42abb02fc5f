"""Memory planning: what one device holds while training, estimated from the config alone, so that
a run that cannot fit is refused before anything is allocated, with the settings that would fit.

Per device: fp32 weights, gradients and optimizer moments (divided among processes under fsdp, plus
the blocks being gathered); the activations kept for the backward pass at the per-process
micro-batch, counted in the rows the model computes (``Config.rows_per_example``), with constants
fitted to the CPU's measured peak (tests/training/test_memory_budget.py); and the KV cache of the rows
an rl step decodes, which is gone before the backward pass, so the peak holds the larger of the two."""

from dataclasses import dataclass

import torch

from common.device import device_memory_bytes
from model.config import GPTConfig
from training.config import Config, ConfigError, TrainConfig

# fp32 weights, their gradients and two optimizer moments (AdamW's; Muon keeps one, so this is
# an upper bound). Activations come on top and scale with the batch.
BYTES_PER_PARAMETER = 4 * 4
# Values kept per token and layer, per unit of model width and of MLP width (norm inputs and
# outputs, queries, keys, values, attention output, residuals; the MLP's gate, up, activation
# and product), and per vocabulary entry for the logits (the logits, their log-softmax, and the
# gradients of both, with one temporary).
ACTIVATION_WIDTHS = 12
ACTIVATION_MLP_WIDTHS = 5
LOGIT_COPIES = 5
# With activation checkpointing, the block being differentiated holds its recomputed activations,
# their gradients and the temporaries of its backward at once: as much as about four blocks keep.
RECOMPUTED_BLOCKS = 4
GATHERED_BLOCKS = 2  # FSDP holds the block it computes and the one it prefetches


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    sampling: int = 0  # the KV cache of the rows decoded at once (none: the run decodes nothing)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + max(self.activations, self.sampling)

    def describe(self) -> str:
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer", self.optimizer),
                 ("activations", self.activations)]
        if self.sampling:
            parts.append(("sampling cache", self.sampling))
        return f"{_gib(self.total)} ({', '.join(f'{name} {_gib(n)}' for name, n in parts)})"


def estimate_memory(
    model: GPTConfig, train: TrainConfig, *, world_size: int = 1, micro_batch: int | None = None, bf16: bool = False,
    decoded_rows: int = 0,
) -> MemoryEstimate:
    """The peak memory of one device training ``model`` as ``train`` says, among ``world_size``
    processes, each computing ``micro_batch`` sequences at a time (default train.batch_size) and
    decoding ``decoded_rows`` rows at a time."""
    params = model.num_params()
    layer = _layer_params(model)
    shards = world_size if train.parallel == "fsdp" else 1
    gathered = min(GATHERED_BLOCKS, model.n_layer) * layer if shards > 1 else 0
    moments = 2 * params if train.optimizer == "adamw" else 2 * params - model.n_layer * layer
    return MemoryEstimate(
        weights=4 * (params // shards + gathered),
        gradients=4 * (params // shards + gathered),
        optimizer=4 * (moments // shards),
        activations=_activations(model, train, micro_batch or train.batch_size, bf16),
        sampling=decoded_rows * model.block_size * model.n_layer * _cached_values(model) * 4,
    )


def check_model_fits(config: GPTConfig, device: torch.device) -> None:
    """Raise ConfigError when the weights, gradients and optimizer state alone of ``config`` need
    more memory than ``device`` has (an absurd size, refused before the data is prepared)."""
    params = config.num_params()
    need = params * BYTES_PER_PARAMETER
    have = device_memory_bytes(device)
    if have is not None and need > have:
        raise ConfigError(
            f"the model has {params / 1e6:,.0f}M parameters and needs at least {need / 2**30:,.1f} GiB "
            f"for weights, gradients and optimizer state, more than the {have / 2**30:,.1f} GiB of "
            f"{device}; lower model.vocab_size, model.n_embd or model.n_layer"
        )


def plan_memory(
    model: GPTConfig, train: TrainConfig, device: torch.device, *, world_size: int, micro_batch: int, bf16: bool,
    decoded_rows: int = 0, rows_named: str = "train.batch_size",
) -> str:
    """One line saying what a training step needs per device and what the device has; raises
    ConfigError, naming the settings to change, when the estimate does not fit. ``micro_batch`` and
    ``decoded_rows`` as ``estimate_memory`` takes them; ``rows_named``: the settings that make the
    rows (a run with several per example names its own setting beside the batch)."""
    estimate = estimate_memory(model, train, world_size=world_size, micro_batch=micro_batch, bf16=bf16,
                               decoded_rows=decoded_rows)
    have = device_memory_bytes(device)
    line = f"memory per device: about {estimate.describe()} ({train.parallel}, {world_size} process(es))"
    if have is None:
        return line
    line += f" of {_gib(have)} on {device}"
    if estimate.total <= have:
        return line
    advice = [f"lower {rows_named} (raise train.grad_accum_steps to keep the global batch)"]
    if not train.activation_checkpointing:
        advice.append("set train.activation_checkpointing=true")
    if train.parallel == "ddp" and world_size > 1:
        fsdp = estimate_memory(model, train.model_copy(update={"parallel": "fsdp"}), world_size=world_size,
                               micro_batch=micro_batch, bf16=bf16, decoded_rows=decoded_rows)
        advice.append(f"set train.parallel=fsdp (about {_gib(fsdp.total)})")
    elif world_size == 1:
        advice.append("shard over more devices with torchrun and train.parallel=fsdp")
    raise ConfigError(f"this run would not fit: {line}; {', or '.join(advice)}")


def plan_run_memory(config: Config, device: torch.device, *, world_size: int, micro_batch: int, bf16: bool) -> str:
    """``plan_memory`` for a run: its micro-batch of ``micro_batch`` examples counted in the rows the
    model computes for them, and an rl run's decoding (a micro-batch's questions, ``rl.group_size``
    completions each, or an evaluation batch's, ``rl.eval_samples`` each) counted in."""
    rows, decoded, named = micro_batch * config.rows_per_example, 0, "train.batch_size"
    if config.rl is not None:
        eval_batch = config.eval.batch_size or config.train.batch_size
        decoded = max(micro_batch * config.rl.group_size, eval_batch * config.rl.eval_samples)
        named = "train.batch_size, rl.group_size or rl.eval_samples"
    return plan_memory(config.model, config.train, device, world_size=world_size, micro_batch=rows, bf16=bf16,
                       decoded_rows=decoded, rows_named=named)


def _layer_params(model: GPTConfig) -> int:
    """The parameters of one block (the hidden matrices and their norm gains)."""
    C = model.n_embd
    table = (model.vocab_size + model.block_size) * C
    head = 0 if model.tie_embeddings else model.vocab_size * C
    values = len(model.value_embedding_layers) * model.vocab_size * model.n_kv_head * model.head_dim
    return (model.num_params() - table - head - values - C) // model.n_layer


def _cached_values(model: GPTConfig) -> int:
    """Values the KV cache keeps per token and layer: keys and values of the key/value heads, or
    latent attention's one latent (with its rotary key)."""
    if model.attention == "mla":
        return model.kv_latent_dim + model.rope_dim
    return 2 * model.n_kv_head * model.head_dim


def _activations(model: GPTConfig, train: TrainConfig, batch: int, bf16: bool) -> int:
    tokens = batch * model.block_size
    per_layer = ACTIVATION_WIDTHS * model.n_embd + ACTIVATION_MLP_WIDTHS * model.ffn_dim
    if train.activation_checkpointing:
        kept = model.n_layer * model.n_embd + RECOMPUTED_BLOCKS * per_layer  # every block's input
    else:
        kept = model.n_layer * per_layer
    value_bytes = 2 if bf16 else 4
    # The logits are computed in fp32 for the loss even under autocast.
    return tokens * (value_bytes * kept + 4 * LOGIT_COPIES * model.vocab_size)


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"
