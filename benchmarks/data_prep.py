"""Data preparation speed: full Shakespeare prepare, cached re-run, verifying a cache entry, batch
assembly, bytes/token.

    python -m benchmarks.data_prep                 # everything (about a minute on 2 cores)
    python -m benchmarks.data_prep --no-sweep --synthetic-mb 512   # no vocab-size sweep, a larger file

Every prepare uses a fresh temporary cache, so "from scratch" really is from scratch (the
tokenizer is trained and the corpus tokenized). Times are wall-clock; CPU seconds are shown too,
because on a shared machine wall time also measures the neighbours. Opening a cache entry verifies
it (SHA-256 of each token file and its largest id): timed on the prepared entry and on a synthetic
token file of ``--synthetic-mb``, each the median of five reads from the page cache (a warm start).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.shared import benchmark_parser, in_turns
from common.cli import non_negative_int, positive_int, run_command
from data import DataConfig, PreparedData, TrainBatches, prepare_data
from data.prepared.token_files import digest_token_file

TARGET_PREPARE_S = 30.0
TARGET_CACHED_S = 2.0
TARGET_BATCH_TOKENS_PER_S = 1e6


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def cached_run_in_new_process(cache_dir: str, vocab_size: int) -> float:
    """Seconds for a fresh interpreter to import `data` and open the cached entry."""
    code = (
        "import time; t = time.perf_counter(); from data import DataConfig, prepare_data; "
        f"prepare_data(DataConfig(vocab_size={vocab_size}, cache_dir={cache_dir!r}), progress=False); "
        "print(time.perf_counter() - t)"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def batch_throughput(tokens, block_size: int, batch_size: int, steps: int) -> float:
    batches = TrainBatches(tokens, block_size, batch_size, seed=0)
    batches.next()  # page the token file in; we measure assembly, not first-touch disk reads
    start = time.perf_counter()
    for _ in range(steps):
        batches.next()
    return steps * batch_size * block_size / (time.perf_counter() - start)


def verification_seconds(entry: PreparedData, synthetic: Path, mb: int) -> tuple[float, float | None]:
    """Median seconds of opening ``entry`` (which verifies it), and of verifying a random uint16
    token file of ``mb`` MiB written to ``synthetic`` (None when ``mb`` is 0)."""
    reads = {"entry": lambda: PreparedData.open(entry.directory)}
    if mb:
        np.random.default_rng(0).integers(0, 2**15, mb * 2**20 // 2, dtype=np.uint16).tofile(synthetic)
        reads["synthetic"] = lambda: digest_token_file(synthetic, np.dtype(np.uint16))
    medians = {name: statistics.median(seconds) for name, seconds in in_turns(reads, 5).items()}
    return medians["entry"], medians.get("synthetic")


def bytes_per_token(data) -> tuple[float, float]:
    """(train, val) UTF-8 bytes per text token; the EOT before each document is not text."""
    out = []
    for split in ("train", "val"):
        s = data.meta["splits"][split]
        out.append(s["bytes"] / (s["tokens"] - s["documents"]))
    return out[0], out[1]


def row(name: str, value: str, target: str = "", ratio: str = "") -> None:
    print(f"| {name:<44} | {value:>16} | {target:>10} | {ratio:>8} |")


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("data_prep", __doc__)
    parser.add_argument("--vocab-size", type=positive_int, default=4096,
                        help="the vocabulary prepared and timed (default: %(default)s)")
    parser.add_argument("--sweep", type=positive_int, nargs="*", default=[1024, 2048, 4096, 8192],
                        help="vocabularies whose bytes per token are compared (default: %(default)s)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the vocabulary sweep")
    parser.add_argument("--synthetic-mb", type=non_negative_int, default=256,
                        help="size of the synthetic token file whose verification is timed; 0 skips it "
                             "(default: %(default)s)")
    parser.add_argument("--progress", action="store_true", help="show the prepare progress bars")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:

    with tempfile.TemporaryDirectory(prefix="data_prep_bench_") as cache_dir:
        cfg = DataConfig(vocab_size=args.vocab_size, cache_dir=cache_dir)
        data, prep_wall, prep_cpu = timed(lambda: prepare_data(cfg, progress=args.progress))
        _, hit_wall, _ = timed(lambda: prepare_data(cfg, progress=False))
        hit_process = cached_run_in_new_process(cache_dir, args.vocab_size)
        entry_s, synthetic_s = verification_seconds(data, Path(cache_dir) / "synthetic.bin", args.synthetic_mb)
        train = data.train_tokens()
        small = batch_throughput(train, 256, 32, 300)
        large = batch_throughput(train, 1024, 64, 60)
        meta = data.meta

        print()
        row("measure", "value", "target", "ratio")
        print(f"|{'-' * 46}|{'-' * 18}|{'-' * 12}|{'-' * 10}|")
        prep_s, cached_s = TARGET_PREPARE_S, TARGET_CACHED_S
        row(f"prepare Shakespeare from scratch (vocab {args.vocab_size})", f"{prep_wall:.1f} s",
            f"<= {prep_s:.0f} s", f"{prep_s / prep_wall:.1f}x")
        row("  of which CPU time (all threads)", f"{prep_cpu:.1f} s")
        row("cached re-run, prepare_data call", f"{hit_wall * 1000:.0f} ms",
            f"<= {cached_s:.0f} s", f"{cached_s / hit_wall:.0f}x")
        row("cached re-run, new process incl. imports", f"{hit_process:.2f} s",
            f"<= {cached_s:.0f} s", f"{cached_s / hit_process:.1f}x")
        entry_mb = (data.train_path.stat().st_size + data.val_path.stat().st_size) / 1e6
        row(f"open the entry, verified ({entry_mb:.1f} MB)", f"{entry_s * 1e3:.1f} ms")
        if synthetic_s is not None:
            row(f"verify a {args.synthetic_mb} MiB token file", f"{synthetic_s * 1e3:.0f} ms")
            row("  verification rate", f"{synthetic_s / (args.synthetic_mb * 2**20 / 1e9):.2f} s/GB")
        for label, speed in (("32 x 256", small), ("64 x 1024", large)):
            row(f"batch assembly, {label}", f"{speed / 1e6:.1f} M tok/s", ">= 1 M/s",
                f"{speed / TARGET_BATCH_TOKENS_PER_S:.0f}x")
        total_tokens = sum(s["tokens"] for s in meta["splits"].values())
        total_bytes = sum(s["bytes"] for s in meta["splits"].values())
        row("corpus", f"{total_bytes / 1e6:.2f} MB")
        row("tokens (train + val, incl. one EOT per play)", f"{total_tokens:,}")
        val = meta["splits"]["val"]
        print(f"\nheld out for validation (val_fraction {cfg.val_fraction}, seed {cfg.split_seed}): "
              f"{val['documents']} plays, {val['bytes'] / 1e6:.2f} MB: {', '.join(meta['val_document_ids'])}")

        if args.no_sweep:
            return 0
        print()
        print("| vocab | bytes/token train | bytes/token val | prepare wall s | prepare CPU s |")
        print("|-------|-------------------|-----------------|----------------|---------------|")
        for vocab in args.sweep:
            sweep_cfg = DataConfig(vocab_size=vocab, cache_dir=str(Path(cache_dir) / "sweep"))
            sweep_data, wall, cpu = timed(lambda: prepare_data(sweep_cfg, progress=False))
            train_bpt, val_bpt = bytes_per_token(sweep_data)
            print(f"| {vocab:>5} | {train_bpt:>17.3f} | {val_bpt:>15.3f} | {wall:>14.1f} | {cpu:>13.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
