"""Decode speed of generate.py's path on the CPU, batch 1, greedy, side by side in one run: ours
eager (the KV cache), ours compiled (``--compile``: the step built ahead of time by AOTInductor,
``inference/aot_step.py``, or ``torch.compile``'s on a torch without it), ours with --no-cache (full
recomputation), Hugging Face ``transformers`` at the same dimensions, and ONNX Runtime on the same
weights (``export.py --format onnx``'s dynamic graph).

    python -m benchmarks.generate_speed [--run DIR] [--new-tokens 256] [--threads N]
    python -m benchmarks.generate_speed --device cuda --run runs/small [--dtype bf16]

Without ``--run`` the model is a random GPT of the tiny size (n_layer 4, n_embd 256, n_head 4,
n_kv_head 2, vocab 2048, block_size 512); speed does not depend on the weights. Two prompts: a
short one, and one long enough that the last token sits at the full context (block_size).

Decode tokens/s counts the tokens after the first, over the time after the first, so prefill is
left out of it and shown apart as time to first token (the compiled path's one-off compile is
printed apart too: the first run builds the package into compile_cache/, later runs load it).
transformers' ``generate`` exposes no per-token clock, so its decode time is t(N tokens) - t(1 token).
Each figure is the best of the repeats, taken round-robin over the paths (``shared.best_seconds``).

The arithmetic limit is the decode rate if a step cost only its matrix products at the FLOP/s this
host reaches on the step's own weight shapes (measured with 64 rows a call, so call overhead is
amortised). Batch 1 cannot reach it: each product then reads its whole weight for one row, so a
step is bound by how fast the host streams the weights in. "1-row matmuls alone" is the rate if a
step were only ATen's products (``F.linear``) at batch 1, with nothing around them: what the eager
step's products cost. The compiled step's own C++ products, written for its shapes and packed
weights (``inference/aot_step.py``), read the same weights faster and can pass it.

The goals are printed as ``goal:`` lines. ``transformers`` and ``onnxruntime`` are benchmark-only
extras; without one its row is skipped with a note.

``--device cuda`` times the same way on a GPU: the eager step against the compiled one (one CUDA
graph replayed per token) and transformers, and says whether eager and compiled chose the same
tokens. ``--dtype bf16`` casts the weights (and so the cache) to bfloat16 there. CI never runs it."""

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.shared import benchmark_parser, best_seconds, paired_ratio, table
from common.cli import path_arg, positive_int, run_command
from common.errors import UserError
from common.threads import thread_count
from inference.aot_step import aot_missing, cache_folder
from inference.compiled_step import compiler_missing
from inference.completion import generate_completions
from inference.settings import GenerationSettings
from model.config import GPTConfig
from model.gpt import GPT
from rundir.loading import LoadedRun, load_run

TINY = GPTConfig(vocab_size=2048, block_size=512, n_layer=4, n_head=4, n_kv_head=2, n_embd=256)
SHORT_PROMPT = 16
EAGER, COMPILED, NO_CACHE, ONNX = "ours, KV cache", "ours, compiled", "ours, --no-cache", "ONNX Runtime"
ONE_ROW = "1-row matmuls alone"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOPS_ROWS = 64  # rows per matmul when measuring the host's FLOP/s (see the module docstring)


@dataclass
class Row:
    name: str
    context: str
    time_to_first_token_s: float | None
    decode_tokens_per_s: float | None
    note: str = ""
    rounds: tuple[float, ...] = ()  # the decode rate of each round-robin round, in order


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("generate_speed", __doc__)
    parser.add_argument("--run", type=path_arg,
                        help="benchmark this run's model (default: a random one of the tiny size)")
    parser.add_argument("--new-tokens", type=positive_int, default=256,
                        help="tokens decoded per timed run (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="best of this many timed runs (default 3)")
    parser.add_argument("--threads", type=thread_count, help="intra-op threads (default: torch's choice)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to decode (default: cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                        help="the weights' and the cache's dtype on CUDA (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    if args.device == "cuda":
        return measure_cuda(args)
    if args.dtype != "fp32":
        raise UserError(f"--dtype {args.dtype} goes with --device cuda; the CPU paths decode in fp32")
    if args.threads:
        torch.set_num_threads(args.threads)
    run = load_run(args.run, torch.device("cpu")) if args.run else random_run(TINY)
    config = run.model.config
    new = args.new_tokens
    generator = torch.Generator().manual_seed(0)
    prompts = context_prompts(config, new)
    print(
        f"model: n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, "
        f"n_kv_head {config.n_kv_head}, ffn {config.ffn_dim}, vocab {config.vocab_size}, "
        f"block_size {config.block_size}; CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    flops = matmul_flops(run.model)
    print(f"host: {flops / 1e9:.1f} GFLOP/s on the decode step's matmul shapes ({FLOPS_ROWS} rows a call)")
    one_row = one_row_matmul_rate(run.model)
    weight_mb = sum(w.numel() * w.element_size() for w in linear_weights(run.model)) / 1e6
    print(f"host: the step's matmuls alone at 1 row, {one_row:.0f}/s ({weight_mb:.1f} MB of weights read "
          f"at {weight_mb * one_row / 1e3:.1f} GB/s)")

    rows: list[Row] = []
    hf_name, hf_model = transformers_model(config)
    no_compile = compiler_missing(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        onnx_note, session = onnx_session(run.model, Path(folder) / "model.onnx", torch.get_num_threads())
        for context, length in prompts.items():
            prompt = torch.randint(config.vocab_size, (length,), generator=generator).tolist()
            paths = {EAGER: ours_timer(run, prompt, new, use_cache=True)}
            if no_compile is None:
                paths[COMPILED] = ours_timer(run, prompt, new, use_cache=True, compile=True)
            paths[NO_CACHE] = ours_timer(run, prompt, new, use_cache=False)
            if hf_model is not None:
                paths[hf_name] = transformers_timer(hf_model, prompt, new)
            if session is not None:
                paths[ONNX] = onnx_timer(session, run.model, prompt, new)
            rows += round_robin(paths, context, args.repeats)
            limit = flops / (run.model.flops_per_token(length + new // 2) / 3)  # forward only: a third
            rows.append(Row("arithmetic limit", context, None, limit))
            rows.append(Row(ONE_ROW, context, None, one_row))
            for name, note in ((COMPILED, no_compile), ("transformers", hf_model is None and hf_name),
                               (ONNX, onnx_note)):
                if note:
                    rows.append(Row(name, context, None, None, note=f"skipped: {note}"))

    print_table(rows)
    print_ratios(rows, list(prompts))
    return 0


def round_robin(paths: dict, context: str, repeats: int) -> list[Row]:
    """Each path's best time to first token and best decode rate over ``repeats`` rounds, taken in turns."""
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, timer in paths.items():
            timings[name].append(timer())
    return [Row(name, context, min(t for t, _ in runs), max(rate for _, rate in runs),
                rounds=tuple(rate for _, rate in runs)) for name, runs in timings.items()]


def random_run(config: GPTConfig, device: torch.device = torch.device("cpu")) -> LoadedRun:
    torch.manual_seed(0)
    model = GPT(config).eval().to(device)
    # No tokenizer is needed to time decoding; streaming still decodes every token's bytes.
    token_bytes = [f"<{i}>".encode() for i in range(config.vocab_size)]
    return LoadedRun(Path("(random init)"), model, None, token_bytes, 0, device)


def ours_timer(run: LoadedRun, prompt: list[int], new: int, *, use_cache: bool, compile: bool = False):
    """A warmed-up callable returning (time to first token s, decode tokens/s) of one generation.
    Compiled, the first call compiles (once per process) and says how long that took."""
    settings = GenerationSettings(max_new_tokens=new, temperature=0, use_cache=use_cache, compile=compile)
    warm = generate_completions(run, prompt, GenerationSettings(max_new_tokens=8, temperature=0, use_cache=use_cache,
                                                                compile=compile))
    if warm.stats.compile_s is not None:
        how = "torch.compile" if aot_missing(run.device) else f"built ahead of time or loaded from {cache_folder()}/"
        print(f"{COMPILED}: the decode step ready in {warm.stats.compile_s:.1f} s ({how})")

    def timer() -> tuple[float, float]:
        stats = generate_completions(run, prompt, settings, on_text=lambda row, text: None).stats
        return stats.time_to_first_token_s, stats.decode_tokens_per_s

    return timer


def context_prompts(config: GPTConfig, new: int) -> dict[str, int]:
    """The two contexts every decode benchmark times: a short prompt, and one long enough that
    the last of ``new`` tokens sits at the full context; label -> prompt length."""
    full = max(1, config.block_size - new)
    return {f"{SHORT_PROMPT} + {new}": SHORT_PROMPT, f"{full} + {new} (full)": full}


def linear_weights(model: GPT) -> list[torch.Tensor]:
    return [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]


def one_row_matmul_rate(model: GPT) -> float:
    """Steps per second if a decode step were only ATen's matrix products at batch 1 (see above)."""
    return 1 / best_products_seconds(linear_weights(model), 1)


def matmul_flops(model: GPT) -> float:
    """FLOP/s of this host on the model's matmul weight shapes, ``FLOPS_ROWS`` rows a call."""
    shapes = [tuple(w.shape) for w in linear_weights(model)]
    work = sum(2 * FLOPS_ROWS * out * inp for out, inp in shapes)
    return work / best_products_seconds([torch.randn(shape) for shape in shapes], FLOPS_ROWS)


def best_products_seconds(weights: list[torch.Tensor], rows: int) -> float:
    """The best of 20 timings of one ``F.linear`` of ``rows`` random rows through each weight."""
    inputs = [torch.randn(rows, w.shape[1]) for w in weights]
    with torch.inference_mode():
        return best_seconds(lambda: [F.linear(x, w) for x, w in zip(inputs, weights)], 20)


def transformers_model(config: GPTConfig) -> tuple[str, object | None]:
    """(row name, LlamaForCausalLM with our dimensions), or (a note saying why, None)."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed (pip install transformers to compare)", None
    transformers.logging.set_verbosity_error()
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head,
        max_position_embeddings=config.block_size,
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
    )
    torch.manual_seed(0)
    return f"transformers {transformers.__version__}", transformers.LlamaForCausalLM(hf_config).eval()


def transformers_timer(model, prompt: list[int], new: int):
    """Like ``ours_timer``; generate() has no per-token clock, so decode = t(new) - t(1 token).
    On a GPU the clock waits for the device before it starts and stops."""
    ids = torch.tensor([prompt], device=model.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)

    def seconds_for(n: int) -> float:
        sync()
        start = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,  # never stop early at an end-of-sequence token
            pad_token_id=0,
        )
        sync()
        return time.perf_counter() - start

    seconds_for(8)  # warm-up

    def timer() -> tuple[float, float]:
        first = seconds_for(1)
        return first, (new - 1) / (seconds_for(new) - first)

    return timer


def onnx_session(model: GPT, path: Path, threads: int):
    """(None, an ONNX Runtime session of ``model`` exported to ``path``), or (why not, None)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed (pip install onnxruntime to compare)", None
    from exporting.onnx.graph import export_graph

    started = time.perf_counter()
    export_graph(model, path)
    print(f"exported the dynamic ONNX graph in {time.perf_counter() - started:.1f} s")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return None, ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_timer(session, model: GPT, prompt: list[int], new: int):
    """Like ``ours_timer``, for an ONNX Runtime session of the dynamic graph: the prompt in one call,
    then a token a call, the cache growing by one position each."""
    config = model.config
    names = [f"past_key_values.{i}.{kind}" for i in range(config.n_layer) for kind in ("key", "value")]

    def step(tokens: list[int], start: int, past: dict) -> tuple[int, dict]:
        logits, *presents = session.run(None, {
            "input_ids": np.array([tokens]), "attention_mask": np.ones((1, start + len(tokens)), np.int64),
            "position_ids": np.arange(start, start + len(tokens))[None], **past})
        return int(logits[0, -1].argmax()), dict(zip(names, presents))

    def decode(n: int) -> tuple[float, float]:
        begin = time.perf_counter()
        empty = {name: np.zeros((1, config.n_kv_head, 0, config.head_dim), np.float32) for name in names}
        token, past = step(prompt, 0, empty)
        first = time.perf_counter()
        for position in range(len(prompt), len(prompt) + n - 1):
            token, past = step([token], position, past)
        return first - begin, (n - 1) / (time.perf_counter() - first)

    decode(8)  # warm-up
    return lambda: decode(new)


def print_table(rows: list[Row]) -> None:
    print()
    print(table(("path", "prompt + new tokens", "first token ms", "decode tok/s"),
                ((r.name, r.context, r.note, "") if r.decode_tokens_per_s is None else
                 (r.name, r.context, "" if r.time_to_first_token_s is None else f"{r.time_to_first_token_s * 1e3:.1f}",
                  f"{r.decode_tokens_per_s:.1f}") for r in rows), left=2))


def print_ratios(rows: list[Row], contexts: list[str]) -> None:
    def row(prefix: str, context: str) -> Row | None:
        return next((r for r in rows if r.name.startswith(prefix) and r.context == context
                     and r.decode_tokens_per_s is not None), None)

    def rate(prefix: str, context: str) -> float | None:
        found = row(prefix, context)
        return None if found is None else found.decode_tokens_per_s

    print()
    ours = [name for name in (EAGER, COMPILED) if rate(name, contexts[0])]
    peers = [name for name in (NO_CACHE, "transformers", ONNX, COMPILED) if rate(name, contexts[0])]
    for context in contexts:
        for name in ours:
            mine = rate(name, context)
            ratios = [f"{mine / rate(peer, context):.2f}x {peer}" for peer in peers if peer != name]
            limit = mine / rate("arithmetic limit", context)
            matmuls = mine / rate(ONE_ROW, context)
            print(f"[{context}] {name}: " + ", ".join(ratios) + f"; {limit:.1%} of the arithmetic limit, "
                  f"{matmuls:.0%} of the 1-row matmuls' rate")
    full = contexts[-1]
    cached, no_cache = rate(EAGER, full), rate(NO_CACHE, full)
    print(f"goal: cache >= 5x --no-cache at full context: {'met' if cached >= 5 * no_cache else 'NOT met'}")
    best = COMPILED if COMPILED in ours else EAGER
    if rate(ONNX, full):
        # Judged round by round (``paired_ratio``); the best-of ratio is printed beside it.
        paired = {c: paired_ratio(row(best, c).rounds, row(ONNX, c).rounds) for c in contexts}
        worst = min(contexts, key=lambda c: paired[c][0])
        median, low, high = paired[worst]
        print(f"goal: {best} >= ONNX Runtime (worst context, round by round): {'met' if median >= 1 else 'NOT met'} "
              f"(median {median:.2f}x, rounds {low:.2f}-{high:.2f}x at {worst}; best of rounds "
              f"{rate(best, worst) / rate(ONNX, worst):.2f}x)")
    if rate("transformers", full):
        worst = min(rate(best, c) / rate("transformers", c) for c in contexts)
        print(f"goal: {best} >= 2x transformers (worst context): {'met' if worst >= 2 else 'NOT met'} ({worst:.2f}x)")


def measure_cuda(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise UserError("--device cuda needs a CUDA GPU; leave it out to time the CPU paths")
    device = torch.device("cuda")
    run = load_run(args.run, device) if args.run else random_run(TINY, device)
    run.model.to(DTYPES[args.dtype])
    config, new = run.model.config, args.new_tokens
    print(f"model: {run.directory}, n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, "
          f"n_kv_head {config.n_kv_head}, vocab {config.vocab_size}, block_size {config.block_size}, {args.dtype}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    generator = torch.Generator().manual_seed(0)
    prompts = context_prompts(config, new)
    hf_name, hf_model = transformers_model(config)
    if hf_model is not None:
        hf_model = hf_model.to(device, DTYPES[args.dtype])
    rows: list[Row] = []
    for context, length in prompts.items():
        prompt = torch.randint(config.vocab_size, (length,), generator=generator).tolist()
        eager, compiled = (generate_completions(run, prompt, GenerationSettings(max_new_tokens=new, temperature=0,
                                                                                compile=compile)) for compile in (False, True))
        if compiled.stats.compile_s:  # the process's first compile; later ones find its graphs
            print(f"{COMPILED}: the decode step compiled in {compiled.stats.compile_s:.1f} s")
        print(f"[{context}] {token_agreement(eager.completions[0].token_ids, compiled.completions[0].token_ids)}")
        paths = {EAGER: ours_timer(run, prompt, new, use_cache=True),
                 COMPILED: ours_timer(run, prompt, new, use_cache=True, compile=True)}
        if hf_model is not None:
            paths[hf_name] = transformers_timer(hf_model, prompt, new)
        rows += round_robin(paths, context, args.repeats)
    if hf_model is None:
        rows.append(Row("transformers", "", None, None, note=f"skipped: {hf_name}"))
    print_table(rows)
    print()
    for context in prompts:
        rate = {row.name: row.decode_tokens_per_s for row in rows if row.context == context}
        peers = ", ".join(f"{rate[COMPILED] / rate[name]:.2f}x {name}" for name in rate if name != COMPILED)
        print(f"[{context}] {COMPILED}: {peers}")
    return 0


def token_agreement(eager: list[int], compiled: list[int]) -> str:
    """Whether two paths chose the same tokens, in words: if not, where they first part."""
    if eager == compiled:
        return f"compiled and eager chose the same {len(eager)} greedy tokens"
    # One may stop early (an end token) where the other goes on: then they part where it stopped.
    first = next((i for i, (a, b) in enumerate(zip(eager, compiled)) if a != b), min(len(eager), len(compiled)))
    return f"compiled and eager greedy tokens first differ at new token {first} of {len(eager)}"

if __name__ == "__main__":
    sys.exit(main())
