"""The run's tokenizer as GGUF metadata, so llama.cpp tokenizes and detokenizes as we do.

Our byte-level BPE with GPT-2's pre-tokenizer is, in GGUF terms, the ``gpt2`` tokenizer model with
the ``gpt-2`` pre-tokenizer. Tokens are stored in id order as tokenizer.json holds them, merges as
"left right" strings, and the special tokens as control tokens. A model vocabulary larger than the
tokenizer's is filled with unused placeholders so that ids and embedding rows line up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import gguf
from tokenizers import Tokenizer

from common.errors import UserError
from exporting.hub_files import SpecialTokens

TOKENIZER_MODEL = "gpt2"
PRE_TOKENIZER = "gpt-2"


@dataclass(frozen=True)
class GgufVocab:
    tokens: list[str]
    types: list[int]  # gguf.TokenType per token
    merges: list[str]


def gguf_vocab(tokenizer: Tokenizer, vocab_size: int) -> GgufVocab:
    """The tokenizer's tokens, their types and its merges, padded to the model's ``vocab_size``."""
    spec = json.loads(tokenizer.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space") or spec.get("normalizer") is not None:
        raise UserError("the run's tokenizer.json is not the byte-level BPE that train.py makes, so GGUF's gpt2 "
                        "tokenizer would split text differently; export a run trained by this project")
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items()}
    special = {token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special}
    tokens, types = [], []
    for token_id in range(vocab_size):
        if token_id in by_id:
            tokens.append(by_id[token_id])
            types.append(gguf.TokenType.CONTROL if token_id in special else gguf.TokenType.NORMAL)
        else:  # an embedding row no token uses
            tokens.append(f"[PAD{token_id}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])]
    return GgufVocab(tokens, [int(kind) for kind in types], merges)


def add_tokenizer(writer: gguf.GGUFWriter, vocab: GgufVocab, tokens: SpecialTokens, chat_template: str | None) -> None:
    """Write the tokenizer's metadata and the special ids. Nothing is added to a prompt: training
    puts ``<|endoftext|>`` before documents itself, and a chat prompt is rendered whole."""
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(tokens.eot)
    writer.add_eos_token_id(tokens.eot)
    writer.add_pad_token_id(tokens.eot)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if tokens.end_of_turn is not None:
        writer.add_eot_token_id(tokens.end_of_turn)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
