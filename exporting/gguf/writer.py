"""Write a Llama-shaped run as a folder holding one GGUF file, ``model.gguf``: the weights in f32 and
the tokenizer, everything llama.cpp needs. The ``gguf`` package (llama.cpp's own writer) is a
development dependency: ``export.py`` says how to install it before it imports this package.

The weights go under GGUF's names with each head's query and key rows reordered. Ours and
transformers' Llama rotate the pair (i, i + d/2) of a head; llama.cpp's llama architecture rotates
the neighbours (2i, 2i + 1), at the same frequency. So each head's query and key rows are
interleaved (row i to 2i, row i + d/2 to 2i + 1), as Hugging Face's own converter does: a dot product
is the same sum in any order of its numbers, so the scores are unchanged.

The tokenizer goes in as metadata, so llama.cpp tokenizes and detokenizes as we do. Our byte-level BPE
with GPT-2's pre-tokenizer is, in GGUF terms, the ``gpt2`` tokenizer model with the ``gpt-2``
pre-tokenizer. Tokens are stored in id order as tokenizer.json holds them, merges as "left right"
strings, and the special tokens as control tokens. A model vocabulary larger than the tokenizer's is
filled with unused placeholders so that ids and embedding rows line up."""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from common.errors import UserError
from exporting.folder import GGUF_FILE, staged_export
from exporting.hf.writer import ExportResult
from exporting.hub_files import SpecialTokens, model_name
from exporting.llama.writer import LlamaRun, load_llama_run
from model.config import GPTConfig

ARCHITECTURE = "llama"
TOKENIZER_MODEL = "gpt2"
PRE_TOKENIZER = "gpt-2"


def export_gguf(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> ExportResult:
    """Export the Llama-shaped run in ``run_dir`` to ``out_dir``/model.gguf (``overwrite`` as in
    ``exporting.hf.export_run``); any other run is refused, naming the options in the way."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run = load_llama_run(run_dir, out_dir, overwrite, "gguf")
    vocab = gguf_vocab(run.tokenizer, run.config.vocab_size)
    tensors = gguf_tensors(run.weights, run.config)

    size = sum(array.nbytes for array in tensors.values())
    _require_space(out_dir, size)

    with staged_export(out_dir, overwrite) as staging:
        writer = gguf.GGUFWriter(staging / GGUF_FILE, ARCHITECTURE)
        try:
            _write(writer, model_name(run_dir), run, vocab, tensors)
        except OSError as error:
            if error.errno is not None:
                raise
            # numpy writes the tensors, and its short write says how many bytes went but not why: a
            # disk that filled up meanwhile (another program's writes) is the likely reason.
            full = shutil.disk_usage(staging).free < size
            raise OSError(errno.ENOSPC if full else errno.EIO, f"{os.strerror(errno.ENOSPC if full else errno.EIO)} "
                          f"({error})", str(out_dir)) from None
        finally:
            writer.close()
    return ExportResult(out_dir, run.chat_template is not None, run.num_params, run.config.block_size)


def _require_space(out_dir: Path, size: int) -> None:
    """Refuse, as a full disk, a folder whose disk cannot hold ``size`` bytes."""
    existing = next(folder for folder in (out_dir.absolute(), *out_dir.absolute().parents) if folder.exists())
    if shutil.disk_usage(existing).free < size:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({size / 1e6:.1f} MB needed)", str(out_dir))


def _write(writer: gguf.GGUFWriter, name: str, run: LlamaRun, vocab: GgufVocab,
           tensors: dict[str, np.ndarray]) -> None:
    """The file's metadata (the model's name, the architecture's sizes, the tokenizer), then its tensors."""
    config = run.config
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.ffn_dim)
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.n_kv_head)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    add_tokenizer(writer, vocab, run.tokens, run.chat_template)
    for tensor_name, array in tensors.items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()


# Transformers' Llama layer names (as ``exporting.hf.weights`` writes them) -> GGUF's, per block.
_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_tensors(llama_weights: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, np.ndarray]:
    """Every tensor of ``llama_weights`` as float32 numpy under its GGUF name, query and key rows
    interleaved. A tied head has no ``output.weight``: llama.cpp then reads the token embedding."""
    tensors = {}
    for name, tensor in llama_weights.items():
        array = tensor.detach().to(torch.float32).numpy()
        module = name.removesuffix(".weight")
        if module in _TOP_NAMES:
            tensors[f"{_TOP_NAMES[module]}.weight"] = array
            continue
        _, _, layer, inner = module.split(".", 3)  # model.layers.{i}.{inner}
        gguf_name = _BLOCK_NAMES[inner]
        if gguf_name in ("attn_q", "attn_k"):
            heads = config.n_head if gguf_name == "attn_q" else config.n_kv_head
            array = interleave_halves(array, heads)
        tensors[f"blk.{layer}.{gguf_name}.weight"] = array
    return tensors


def interleave_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """``weight`` (heads·d, in) with each head's rows (first half, second half) reordered to
    (h0[0], h1[0], h0[1], h1[1], ...): from transformers' rotary pairs to llama.cpp's."""
    rows, columns = weight.shape
    half = rows // heads // 2
    return np.ascontiguousarray(weight.reshape(heads, 2, half, columns).swapaxes(1, 2).reshape(rows, columns))


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
