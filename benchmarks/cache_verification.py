"""What verifying a data cache entry costs at start-up: SHA-256 plus the id-range check.

    python -m benchmarks.cache_verification                   # Shakespeare in a fresh temp cache
    python -m benchmarks.cache_verification --entry DIR       # an entry already prepared
    python -m benchmarks.cache_verification --synthetic-mb 512

Prints, for the Shakespeare entry, the time to open it with verification next to the time of the
size-only checks it replaced, and the verification rate on a synthetic token file, as seconds per
GB. Each figure is the median of a few repeats, read from the page cache (a warm start).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from common.cli import ArgumentParser, path_arg, positive_int, run_command
from data import DataConfig, PreparedData, prepare_data
from data.prepared.token_files import digest_token_file


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def size_only_check(entry: PreparedData) -> None:
    """The checks an entry had before checksums: file sizes against meta.json."""
    for split, path in (("train", entry.train_path), ("val", entry.val_path)):
        assert path.stat().st_size == entry.meta["splits"][split]["tokens"] * entry.dtype.itemsize


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.cache_verification", description=__doc__.split("\n\n")[0])
    parser.add_argument("--entry", type=path_arg, help="a prepared cache entry (default: prepare Shakespeare afresh)")
    parser.add_argument("--synthetic-mb", type=positive_int, default=256,
                        help="size of the synthetic token file hashed (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed repeats of each case; the median counts (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        entry = PreparedData.open(args.entry) if args.entry else prepare_data(DataConfig(cache_dir=tmp), progress=False)
        nbytes = entry.train_path.stat().st_size + entry.val_path.stat().st_size
        verified = median_seconds(lambda: PreparedData.open(entry.directory), args.repeats)
        size_only = median_seconds(lambda: size_only_check(entry), args.repeats)

        synthetic = Path(tmp) / "synthetic.bin"
        count = args.synthetic_mb * 2**20 // 2
        np.random.default_rng(0).integers(0, 2**15, count, dtype=np.uint16).tofile(synthetic)
        per_file = median_seconds(lambda: digest_token_file(synthetic, np.dtype(np.uint16)), args.repeats)

    rows = [
        ("Shakespeare entry, open with verification", f"{nbytes / 1e6:.1f} MB", f"{verified * 1e3:.1f} ms"),
        ("Shakespeare entry, size checks only", f"{nbytes / 1e6:.1f} MB", f"{size_only * 1e3:.2f} ms"),
        ("synthetic uint16 file, hash + max id", f"{count * 2 / 1e6:.0f} MB", f"{per_file * 1e3:.0f} ms"),
    ]
    print(f"{'case':<45} {'size':>10} {'median':>10}")
    for name, size, seconds in rows:
        print(f"{name:<45} {size:>10} {seconds:>10}")
    print(f"verification rate: {per_file / (count * 2 / 1e9):.2f} s per GB of token files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
