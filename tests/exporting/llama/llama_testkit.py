"""Builders and references for the Llama and GGUF export tests."""

from pathlib import Path

import numpy as np
import torch
import yaml

import run_testkit
from data.tokenizer import EOT

VOCAB = 300  # run_testkit's tokenizer
BLOCK_SIZE = 48  # room for a prompt and a few dozen greedy tokens


def build_llama_run(directory: Path, *, tie: bool = True, data_format: str = "chat") -> Path:
    """A random Llama-shaped run (rope, GQA 2:1, no options) in which <|endoftext|> never wins; config.yaml
    says it was tuned on ``data_format``."""
    run_testkit.build_run(directory, run_testkit.chat_tokenizer(), tie=tie, positions="rope", rope_theta=500.0,
                          block_size=BLOCK_SIZE, never_predicts=(EOT,))
    (directory / "config.yaml").write_text(yaml.safe_dump({"data": {"format": data_format}}))
    return directory


def our_greedy_tokens(run_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """What ``generate.py --temperature 0`` produces (a plain completion: it stops at nothing)."""
    from inference.completion import generate_completions
    from inference.settings import GenerationSettings
    from rundir.loading import load_run

    run = load_run(run_dir, torch.device("cpu"))
    settings = GenerationSettings(max_new_tokens=new_tokens, temperature=0.0, seed=0)
    return generate_completions(run, prompt, settings).completions[0].token_ids


def random_ids(seed: int, length: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(5, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def read_gguf(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The metadata (key -> value) and tensors (name -> numpy array, rows as PyTorch's) of a GGUF
    file, through the gguf package's reader."""
    import gguf

    reader = gguf.GGUFReader(path)
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    return metadata, {tensor.name: np.array(tensor.data) for tensor in reader.tensors}


def llama_cpp_reference_logits(metadata: dict, tensors: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits (T, vocab) of ``ids`` in float64, as llama.cpp's llama architecture reads the GGUF file:
    neighbour-pair rotary, query head h reading kv head h // group, the embedding as head when no output.weight."""
    arch = metadata["general.architecture"]
    heads, kv_heads = metadata[f"{arch}.attention.head_count"], metadata[f"{arch}.attention.head_count_kv"]
    eps, base = metadata[f"{arch}.attention.layer_norm_rms_epsilon"], metadata[f"{arch}.rope.freq_base"]
    weight = {name: array.astype(np.float64) for name, array in tensors.items()}

    def norm(x, gain):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain

    def rope(x):  # x (T, heads, d)
        d = x.shape[-1]
        angles = np.arange(len(ids))[:, None, None] * base ** (-np.arange(0, d, 2) / d)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * np.cos(angles) - odd * np.sin(angles)
        out[..., 1::2] = even * np.sin(angles) + odd * np.cos(angles)
        return out

    T = len(ids)
    x = weight["token_embd.weight"][ids]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for layer in range(metadata[f"{arch}.block_count"]):
        w = {name.split(".", 2)[2].removesuffix(".weight"): array for name, array in weight.items()
             if name.startswith(f"blk.{layer}.")}
        h = norm(x, w["attn_norm"])
        q = rope((h @ w["attn_q"].T).reshape(T, heads, -1))
        k = rope((h @ w["attn_k"].T).reshape(T, kv_heads, -1))
        v = (h @ w["attn_v"].T).reshape(T, kv_heads, -1)
        group = heads // kv_heads
        out = np.empty_like(q)
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(q.shape[-1])
            scores = np.where(causal, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = probs / probs.sum(-1, keepdims=True) @ v[:, head // group]
        x = x + out.reshape(T, -1) @ w["attn_output"].T
        h = norm(x, w["ffn_norm"])
        gate = h @ w["ffn_gate"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
    head = weight.get("output.weight", weight["token_embd.weight"])
    return norm(x, weight["output_norm.weight"]) @ head.T
