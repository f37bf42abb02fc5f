"""Write a Llama-shaped run as a folder holding one GGUF file, ``model.gguf``: the weights in f32 and
the tokenizer, everything llama.cpp needs. The ``gguf`` package (llama.cpp's own writer) is a
development dependency: ``export.py`` says how to install it before it imports this package.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import gguf
import numpy as np

from exporting.folder import GGUF_FILE, staged_export
from exporting.gguf.tensors import gguf_tensors
from exporting.gguf.vocab import GgufVocab, add_tokenizer, gguf_vocab
from exporting.hf.writer import ExportResult
from exporting.hub_files import model_name
from exporting.llama.shape import LlamaRun, load_llama_run

ARCHITECTURE = "llama"


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
