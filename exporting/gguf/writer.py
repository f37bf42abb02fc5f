"""Write a Llama-shaped run as a folder holding one GGUF file, ``model.gguf``: the weights in f32 and
the tokenizer, everything llama.cpp needs to load, tokenize and generate.

The folder is built and published as the other formats' are (``exporting.folder``), so a killed
export never leaves half a file where ``--out`` points. The ``gguf`` package (llama.cpp's own
writer, on PyPI) is a development dependency, as ONNX's exporter is: ``export.py`` says how to
install it before it imports this package.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from data.chat import CHAT_TEMPLATE
from exporting.folder import GGUF_FILE, staged_export
from exporting.gguf.tensors import gguf_tensors
from exporting.gguf.vocab import GgufVocab, add_tokenizer, gguf_vocab
from exporting.hf.weights import hf_state_dict
from exporting.hub_files import SpecialTokens
from exporting.llama.shape import load_llama_run
from model import GPTConfig

ARCHITECTURE = "llama"


@dataclass(frozen=True)
class GgufExportResult:
    out_dir: Path
    has_chat: bool
    num_params: int

    @property
    def file(self) -> Path:
        return self.out_dir / GGUF_FILE


def export_gguf(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> GgufExportResult:
    """Export the Llama-shaped run in ``run_dir`` to ``out_dir``/model.gguf (``overwrite`` as in
    ``exporting.hf.export_run``); any other run is refused, naming the options in the way."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run = load_llama_run(run_dir, out_dir, overwrite, "gguf")
    config = run.model.config
    tokens = SpecialTokens.of(run.tokenizer)
    vocab = gguf_vocab(run.tokenizer, config.vocab_size)
    tensors = gguf_tensors(hf_state_dict(run.model), config)

    size = sum(array.nbytes for array in tensors.values())
    _require_space(out_dir, size)

    with staged_export(out_dir, overwrite) as staging:
        writer = gguf.GGUFWriter(staging / GGUF_FILE, ARCHITECTURE)
        try:
            _write(writer, out_dir.name, config, vocab, tokens, tensors)
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
    return GgufExportResult(out_dir, tokens.has_chat, run.model.num_params())


def _require_space(out_dir: Path, size: int) -> None:
    """Refuse, as a full disk, a folder whose disk cannot hold ``size`` bytes: checked before
    writing, because a short write of the tensors would not say why it stopped."""
    existing = next(folder for folder in (out_dir.absolute(), *out_dir.absolute().parents) if folder.exists())
    if shutil.disk_usage(existing).free < size:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({size / 1e6:.1f} MB needed)", str(out_dir))


def _write(writer: gguf.GGUFWriter, name: str, config: GPTConfig, vocab: GgufVocab, tokens: SpecialTokens,
           tensors: dict[str, np.ndarray]) -> None:
    """The file's metadata (the architecture's sizes, the tokenizer), then its tensors."""
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
    add_tokenizer(writer, vocab, tokens, CHAT_TEMPLATE if tokens.has_chat else None)
    for tensor_name, array in tensors.items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
