"""Builders for tiny runs, shared by the inference, serving and export tests: a byte-level BPE
tokenizer (with or without the chat tokens) and a random GPT that does not degenerate, saved the
way train.py saves a run.

A plain module (not conftest): ``tests/conftest.py`` puts this directory on the path, so tests
import it as ``run_testkit``.
"""

from pathlib import Path

import torch
from tokenizers import Tokenizer, pre_tokenizers, trainers

from data.tokenizer import EOT, new_tokenizer, train_tokenizer
from model.config import GPTConfig
from model.gpt import GPT
from model.io import save_pretrained
from rundir.files import TOKENIZER_FILE

# Enough text for a few hundred merges, with accents, CJK and emoji so that the small vocabulary
# leaves multi-byte characters split across tokens.
CORPUS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east. ",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father. ",
    "Café crème, naïve façade, jalapeño piñata, smörgåsbord, Straße. ",
    "世界你好，今天天气很好。東京と大阪。 ",
    "Emoji: 😀 🎉 🚀 ❤️ 👍🏽 🐍 and more 😀🎉. ",
    "The quick brown fox jumps over the lazy dog, again and again and again. ",
]
VOCAB_SIZE = 300
BLOCK_SIZE = 32
# The model option that changes what a grouped-query model computes (value embeddings), with an
# explicit feed-forward width (configs/tiny.yaml sets one): an export that derived the width from
# n_embd instead of reading it would build the wrong shape. The cache, export, ONNX and serving tests
# run one model with them.
ALL_OPTIONS = dict(value_embeddings=True, ffn_hidden=160)
# Multi-head latent attention refuses value embeddings (see GPTConfig): the width alone.
MLA_OPTIONS = dict(ffn_hidden=160)


def chat_tokenizer(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Trained with data's own recipe (chat tokens reserved), so tests see the tokenizers runs hold."""
    return train_tokenizer(CORPUS * 20, vocab_size)


def tokenizer_without_chat(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """As runs were trained before the chat format: only <|endoftext|> is special."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer


def build_model(vocab_size: int, block_size: int = BLOCK_SIZE, *, n_kv_head: int = 2, tie: bool = True,
                seed: int = 0, **options) -> GPT:
    """A random GPT whose weights are scaled up 10x: at the standard init the logits are nearly
    flat and greedy decoding repeats one token, which would let a broken cache, position or mask
    pass unnoticed. ``options`` takes other GPTConfig fields: the latent-attention ones
    (attention="mla", kv_latent_dim, q_latent_dim) and those of ``ALL_OPTIONS``, whose gains and
    scalars are drawn away from their init (an export that ignored them would then differ)."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                       n_embd=64, tie_embeddings=tie, **options)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "value_gate" in name:  # zero at init, so every gate would be 1
                param.normal_(0.0, 0.3)
            elif param.dim() >= 2:
                param.mul_(10.0)
            elif "head_norm" in name or "lambdas" in name:
                param.uniform_(0.5, 1.5)
    return model


def build_run(directory: Path, tokenizer: Tokenizer, *, vocab_size: int | None = None, n_kv_head: int = 2,
              tie: bool = True, seed: int = 0, block_size: int = BLOCK_SIZE,
              never_predicts: tuple[str, ...] = (), **options) -> Path:
    """A run directory holding ``build_model``'s weights and the tokenizer (its vocabulary unless
    ``vocab_size`` says otherwise). The tokens in ``never_predicts`` get a zero output row: a logit of
    0 loses to the largest of the others, which is far above 0 at these scaled weights, so
    generation never ends at them."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / TOKENIZER_FILE))
    model = build_model(vocab_size or tokenizer.get_vocab_size(), block_size, n_kv_head=n_kv_head, tie=tie,
                        seed=seed, **options)
    with torch.no_grad():
        for token in never_predicts:
            model.lm_head.weight[tokenizer.token_to_id(token)] = 0.0
    save_pretrained(model, directory)
    return directory


# The conversations the tool-calling test run learns by heart: each question, a call to the
# calculator with the question's expression, the calculator's result, and the result as the answer.
TOOL_QUESTIONS = ("12*34", "7+8", "99-45")
TOOL_BLOCK_SIZE = 96


def tool_conversation(expression: str) -> list:
    from data.sources.tool_arithmetic import conversation

    return conversation(expression)


def build_tool_run(directory: Path, *, steps: int = 200, seed: int = 0) -> Path:
    """A run that really calls the calculator: a random GPT trained, by SFT's loss (the assistant's
    calls and answers only), on ``TOOL_QUESTIONS``' conversations until greedy decoding writes each
    call and each answer exactly. Checked before it is returned, so a test that uses it exercises
    the real path: the model writes ``<|call|>calculator{...}`` and reads the result back."""
    from data.chat import render_chat

    tokenizer = chat_tokenizer()
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=TOOL_BLOCK_SIZE, n_layer=2, n_head=4,
                       n_kv_head=2, n_embd=64)
    model = GPT(config)
    rendered = [render_chat(tokenizer, tool_conversation(q)) for q in TOOL_QUESTIONS]
    length = max(len(r.ids) for r in rendered)
    inputs = torch.zeros(len(rendered), length - 1, dtype=torch.long)
    targets = torch.full((len(rendered), length - 1), -1, dtype=torch.long)
    for row, r in enumerate(rendered):
        ids = torch.tensor(r.ids)
        inputs[row, :len(ids) - 1] = ids[:-1]
        learned = torch.tensor(r.loss_mask[1:])
        targets[row, :len(ids) - 1] = torch.where(learned, ids[1:], -1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    predicted = logits.argmax(-1)
    assert bool(((predicted == targets) | (targets == -1)).all()), f"the tool run did not learn (loss {loss.item():.4f})"
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / TOKENIZER_FILE))
    save_pretrained(model, directory)
    return directory


def chat_tokenizer_before_tools(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """As tokenizers were trained before the tool tokens: <|endoftext|> and the chat tokens only."""
    from data.chat import CHAT_SPECIAL_TOKENS

    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT, *CHAT_SPECIAL_TOKENS],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer
