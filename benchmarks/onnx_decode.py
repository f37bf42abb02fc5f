"""Decode speed on the CPU, batch 1, greedy, at a context of 128: ONNX Runtime running the exported
graphs (``export.py --format onnx``, dynamic and ``--static-shapes``) against generate.py's own path
(PyTorch with the KV cache).

    python -m benchmarks.onnx_decode [--run DIR] [--context 128] [--new-tokens 64] [--threads N]

Without ``--run`` the model is generate_speed.py's random GPT of the tiny size (block_size 512);
speed does not depend on the weights. The prompt is ``--context`` tokens; decode tokens/s counts
the tokens after the first over the time after the first, as generate_speed.py does, and each
figure is the best of round-robin repeats (on a shared machine other load only slows a run down).
The dynamic graph reads the prompt in one call; the static graph one token a call, and attends
over all block_size slots at every step (its price for fixed shapes).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.generate_speed import Row, decode_parser, load_benchmark_run, ours_timer, print_table
from model import GPT
from exporting.onnx.graph import export_graph


def main(argv: list[str] | None = None) -> int:
    parser = decode_parser(__doc__, 64)
    parser.add_argument("--context", type=int, default=128, help="prompt tokens before decoding (default 128)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    run = load_benchmark_run(args)
    config = run.model.config
    if args.context + args.new_tokens > config.block_size:
        parser.error(f"--context + --new-tokens must fit block_size {config.block_size}")
    prompt = torch.randint(config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"model: n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, n_kv_head "
          f"{config.n_kv_head}, vocab {config.vocab_size}, block_size {config.block_size}; CPU, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, onnxruntime {ort.__version__}")

    with tempfile.TemporaryDirectory() as folder:
        paths = {"generate.py (PyTorch)": ours_timer(run, prompt, args.new_tokens, use_cache=True)}
        for name, static in (("ONNX Runtime, dynamic", False), ("ONNX Runtime, static", True)):
            session = _session(run.model, Path(folder) / f"{static}.onnx", static, torch.get_num_threads())
            paths[name] = _onnx_timer(session, run.model, prompt, args.new_tokens, static)
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(args.repeats):
            for name, timer in paths.items():
                timings[name].append(timer())
    context = f"{args.context} + {args.new_tokens}"
    rows = [Row(name, context, min(t for t, _ in runs), max(r for _, r in runs)) for name, runs in timings.items()]
    print_table(rows)
    return 0


def _session(model: GPT, path: Path, static: bool, threads: int):
    import onnxruntime as ort

    started = time.perf_counter()
    export_graph(model, path, static_batch=1 if static else None)
    print(f"exported the {'static' if static else 'dynamic'} graph in {time.perf_counter() - started:.1f} s")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _onnx_timer(session, model: GPT, prompt: list[int], new: int, static: bool):
    """A warmed-up callable returning (time to first token s, decode tokens/s) of one greedy decode."""
    config = model.config
    names = [f"past_key_values.{i}.{kind}" for i in range(config.n_layer) for kind in ("key", "value")]
    slots = config.block_size if static else 0
    shape = (1, config.n_kv_head, slots, config.head_dim)

    def step(tokens: list[int], start: int, past: dict, mask: np.ndarray) -> tuple[int, dict]:
        logits, *presents = session.run(None, {
            "input_ids": np.array([tokens]), "attention_mask": mask,
            "position_ids": np.arange(start, start + len(tokens))[None], **past})
        return int(logits[0, -1].argmax()), dict(zip(names, presents))

    def decode(n: int) -> tuple[float, float]:
        begin = time.perf_counter()
        past = {name: np.zeros(shape, np.float32) for name in names}
        if static:
            mask = np.zeros((1, slots), np.int64)
            for position, token in enumerate(prompt):
                mask[0, position] = 1
                token, past = step([token], position, past, mask)
        else:
            token, past = step(prompt, 0, past, np.ones((1, len(prompt)), np.int64))
        first = time.perf_counter()
        for position in range(len(prompt), len(prompt) + n - 1):
            if static:
                mask[0, position] = 1
            else:
                mask = np.ones((1, position + 1), np.int64)
            token, past = step([token], position, past, mask)
        return first - begin, (n - 1) / (time.perf_counter() - first)

    decode(8)  # warm-up
    return lambda: decode(new)


if __name__ == "__main__":
    sys.exit(main())
