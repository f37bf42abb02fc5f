"""The induction lab over several seeds, and the held-out corpus that checks the probe on data the lab
did not make.

    python -m benchmarks.induction_lab --seeds 1337 1338 1339          # configs/induction.yaml per seed
    python -m benchmarks.induction_lab --heldout runs/heldout-corpus   # write the held-out corpus
    python -m benchmarks.induction_lab --seeds 1 --set data.source=files \\
        --set 'data.files.paths=[runs/heldout-corpus/repeats.jsonl]' --out runs/heldout

Each seed is a real ``train.py`` run (in ``--out``/s<seed>, one at a time, so that several do not share
the cores). The table reports, per seed, when the run began to copy (``analysis.history``).

The held-out corpus is made by its own generator, not ``data/sources/synthetic.py``: other letters, a
word list of another size and shape, other lengths and another seed, and each copy on its own line."""

import argparse
import json
import random
import time
from pathlib import Path

from analysis.history import first_copying, first_induction, first_layer_induction, read_attention_history
from benchmarks.shared import ROOT, add_set_flag, benchmark_parser, print_rows, run_train_py
from common.cli import path_arg, run_stoppable
from common.errors import UserError

CONFIG = ROOT / "configs" / "induction.yaml"


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("induction_lab", __doc__)
    p.add_argument("--seeds", type=int, nargs="+", help="train.seed of each run (default: train none)")
    p.add_argument("--config", type=path_arg, default=CONFIG,
                   help="the training config of every run (default: %(default)s)")
    p.add_argument("--out", type=path_arg, default=Path("runs/induction_lab"),
                   help="where the runs go (default: %(default)s)")
    add_set_flag(p)
    p.add_argument("--heldout", type=path_arg, metavar="DIR",
                   help="write the held-out corpus (repeats.jsonl) here (default: do not)")
    return p


def heldout_documents(count: int = 12000, seed: int = 2024) -> list[str]:
    """Random sequences of 10-30 words from 300 consonant-vowel-consonant words, each sequence on a
    line and then again on the next."""
    rng = random.Random(seed)
    onsets, vowels, codas = "cfhjlmnrstwy", "aeiouy", "bdgklmnprst"
    words = sorted({rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) + rng.choice(vowels)
                    for _ in range(2000)})
    words = rng.sample(words, 300)
    documents = []
    for _ in range(count):
        line = " ".join(rng.sample(words, rng.randint(10, 30)))
        documents.append(f"{line}\n{line}")
    return documents


def write_heldout(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "repeats.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(heldout_documents()):
            f.write(json.dumps({"id": f"heldout-{i}", "text": text}) + "\n")
    return path


def train(args: argparse.Namespace, seed: int) -> tuple[Path, float]:
    run_dir = args.out / f"s{seed}"
    start = time.perf_counter()
    run_train_py(args.config, [f"train.seed={seed}", f"run.out_dir={run_dir}", "run.overwrite=true", *args.set])
    return run_dir, time.perf_counter() - start


def report_cells(seed: int, run_dir: Path, wall: float) -> tuple:
    history, _ = read_attention_history(run_dir)
    fell, layer, head = first_copying(history), first_layer_induction(history), first_induction(history)
    passed = (layer.step if layer else "none", head.step if head else "none", f"{wall:.0f}")
    end = f"{history[-1].repeat_loss_second:.2f}"
    if fell is None:
        return seed, "did not fall", "", "", "", end, *passed
    before = history[max(history.index(fell) - 1, 0)]
    return (seed, fell.step, f"{_elapsed_at(run_dir, fell.step):.0f}", f"{before.repeat_loss_second:.2f}",
            f"{fell.repeat_loss_second:.2f}", end, *passed)


def _elapsed_at(run_dir: Path, step: int) -> float:
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval" and record["step"] == step:
            return float(record["elapsed_s"])
    raise ValueError(f"{run_dir} logged no evaluation at step {step}")


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, run_lab)


def run_lab(args: argparse.Namespace) -> int:
    if not args.seeds and args.heldout is None:
        raise UserError("nothing to do: give --seeds (one run for each, e.g. --seeds 1337 1338) or --heldout DIR "
                        "(write the held-out corpus)")
    if args.heldout is not None:
        print(f"wrote {write_heldout(args.heldout)}")
    print_rows(("seed", "second-copy loss fell at step", "seconds", "second-copy loss before", "at it", "at the end",
                "layer sum >= 0.6 at step", "head >= 0.5 at step", "train.py wall seconds"),
               (({}, report_cells(seed, *train(args, seed))) for seed in args.seeds or []), as_json=False, left=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
