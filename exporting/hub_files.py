"""The files the export formats write from a run's config and tokenizer, as transformers and
Optimum read them: ``config.json``, ``generation_config.json``, ``tokenizer_config.json`` and the
run's ``tokenizer.json``.

``<|endoftext|>`` is the end-of-text, beginning-of-text and padding token at once, as in GPT-2:
training puts it before every document, and padding positions are masked out. A chat run's
``<|end|>`` also ends a reply, and its role tokens are never sampled."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from common.errors import DataError
from common.files import atomic_write_text
from data.chat import CHAT_TEMPLATE, ChatTokenIds
from data.tokenizer import EOT, eot_id
from inference.settings import GenerationSettings
from model.config import GPTConfig
from rundir.files import TOKENIZER_FILE
from rundir.record import RunRecord

MODEL_TYPE = "minigpt"
LLAMA_MODEL_TYPE = "llama"  # a Llama-shaped run exported as transformers' own model (exporting.llama)
# The data formats (data.format) that tune a model on conversations: chat, and DPO and GRPO, whose
# pairs and prompts the chat format renders.
CHAT_TUNED_FORMATS = ("chat", "preference", "rl")
CONFIG_CLASS = "configuration_minigpt.MiniGPTConfig"
MODEL_CLASS = "modeling_minigpt.MiniGPTForCausalLM"


@dataclass(frozen=True)
class SpecialTokens:
    """What ends, starts and pads a sequence, and the chat tokens; ``end_of_turn`` is None and
    ``never_sampled`` empty for a tokenizer without chat tokens."""

    eot: int
    end_of_turn: int | None
    never_sampled: tuple[int, ...] = ()  # the chat's rule (``ChatTokenIds.suppress_ids``): the role tokens

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SpecialTokens:
        try:
            chat = ChatTokenIds.of(tokenizer)
        except DataError:  # trained before the chat format: a plain language model
            return cls(eot_id(tokenizer), None)
        return cls(eot_id(tokenizer), chat.end, chat.suppress_ids)

    @property
    def has_chat(self) -> bool:
        return self.end_of_turn is not None

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end generation: ``<|endoftext|>``, and ``<|end|>`` (a reply's end) for chat."""
        return [self.eot] if self.end_of_turn is None else [self.eot, self.end_of_turn]


def model_name(run_dir: Path) -> str:
    """The name an export gives the model: its run directory's, wherever the export is written."""
    return run_dir.resolve().name


def chat_template(run_dir: Path, tokens: SpecialTokens) -> str | None:
    """The chat template, for a run tuned on conversations, else None: a base run has the chat
    tokens too, but a runtime that finds a template would wrap every prompt in one, as if it
    could answer."""
    tuned = RunRecord.read(run_dir).data.get("format", "text") in CHAT_TUNED_FORMATS
    return CHAT_TEMPLATE if tokens.has_chat and tuned else None


def model_config(config: GPTConfig, tokens: SpecialTokens, dtype: str) -> dict:
    """``config.json``: the shipped MiniGPTConfig's fields, and where transformers finds its code."""
    return {
        "architectures": ["MiniGPTForCausalLM"],
        "auto_map": {"AutoConfig": CONFIG_CLASS, "AutoModelForCausalLM": MODEL_CLASS},
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "use_cache": True,
        "bos_token_id": tokens.eot,
        "eos_token_id": tokens.stop_ids,
        "pad_token_id": tokens.eot,
        "dtype": dtype,
        # Latent attention's fields, positions and value embeddings only where used: other exports stay as they were.
        **({"attention": "mla", "kv_latent_dim": config.kv_latent_dim, "q_latent_dim": config.q_latent_dim}
           if config.attention == "mla" else {}),
        **({"positions": config.positions, "rotary_base": config.rope_theta} if config.positions != "learned" else {}),
        **({"value_embeddings": True} if config.value_embeddings else {}),
    }


def generation_config(config: GPTConfig, tokens: SpecialTokens) -> dict:
    """``generation_config.json``: generate.py's sampling defaults, the stop tokens, the role tokens
    that chat never samples, and a ``max_new_tokens`` that keeps a prompt of up to half the window
    inside it (the pipeline's default of 256 would pass a small model's window; a ``max_length``
    here would make transformers warn at every call that names its own)."""
    defaults = GenerationSettings()
    settings = {
        "bos_token_id": tokens.eot,
        "eos_token_id": tokens.stop_ids,
        "pad_token_id": tokens.eot,
        "max_new_tokens": min(defaults.max_new_tokens, config.block_size // 2),
        "do_sample": defaults.temperature > 0,
        "temperature": defaults.temperature,
        "top_k": defaults.top_k or 0,  # 0 turns top-k off (transformers' default would be 50)
        "top_p": defaults.top_p,
        "repetition_penalty": defaults.repetition_penalty,
    }
    if tokens.never_sampled:
        settings["suppress_tokens"] = list(tokens.never_sampled)
    return settings


def tokenizer_config(config: GPTConfig, template: str | None) -> dict:
    """``tokenizer_config.json`` for the run's ``tokenizer.json``, which is copied unchanged, with
    the chat ``template`` where there is one."""
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
        "model_max_length": config.block_size,
        # Byte-level BPE decodes exactly; transformers' clean-up would delete spaces before punctuation.
        "clean_up_tokenization_spaces": False,
        # Left padding keeps every row's last token at the end, where generate() reads the next one.
        "padding_side": "left",
        # No token_type_ids: the model takes none, and transformers 4.x's generate refuses them.
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if template is not None:
        settings["chat_template"] = template
    return settings


def write_tokenizer_files(folder: Path, run_dir: Path, config: GPTConfig, template: str | None) -> None:
    """The run's ``tokenizer.json``, unchanged, and its ``tokenizer_config.json``."""
    write_json(folder / "tokenizer_config.json", tokenizer_config(config, template))
    shutil.copyfile(run_dir / TOKENIZER_FILE, folder / "tokenizer.json")


def write_json(path: Path, content: dict) -> None:
    atomic_write_text(path, json.dumps(content, indent=2) + "\n")
