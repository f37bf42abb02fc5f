"""Find a trained run and load it for inference: model in eval mode, tokenizer, token bytes. Every
reader of a trained model loads it here; nothing here unpickles anything, and every problem a user
can fix is a one-line ``UserError`` naming the file and what to do."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from common.errors import UserError
from data.tokenizer import RUN_TOKENIZER_ADVICE, eot_id, load_tokenizer, token_byte_table
from model.gpt import GPT
from model.io import ModelFileError, load_pretrained
from rundir.files import RUN_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE

RUNS_DIR = Path("runs")
TRAIN_COMMAND = "python train.py --config configs/tiny.yaml"


@dataclass
class LoadedRun:
    directory: Path
    model: GPT
    tokenizer: Tokenizer
    token_bytes: list[bytes]  # what each token id decodes to, for streaming (inference.streaming)
    eot_id: int
    device: torch.device

    @property
    def block_size(self) -> int:
        return self.model.config.block_size


def find_latest_run(runs_dir: Path = RUNS_DIR) -> Path:
    """The run under ``runs_dir`` whose weights were written last (a resumed run counts as recent)."""
    weights = [path for path in Path(runs_dir).glob(f"*/{WEIGHTS_FILE}") if path.is_file()]
    if not weights:
        raise UserError(f"no trained run found under {runs_dir}/; train one with: {TRAIN_COMMAND}")
    newest = max(weights, key=lambda path: (path.stat().st_mtime_ns, str(path)))
    return newest.parent


def load_run(directory: str | Path, device: torch.device) -> LoadedRun:
    """Load a run's tokenizer and weights onto ``device``; the model comes back in eval mode
    (``load_pretrained`` returns it so)."""
    directory = Path(directory)
    if not directory.is_dir():
        problem = "is not a directory" if directory.exists() else "does not exist"
        raise UserError(
            f"run directory {directory} {problem}; pass --run a directory written by train.py, "
            f"or leave --run out to use the most recent run under {RUNS_DIR}/"
        )
    if not (directory / WEIGHTS_FILE).is_file():
        runs_inside = sorted(path.parent for path in directory.glob(f"*/{WEIGHTS_FILE}"))
        fix = (
            f"it holds runs: pass one of them, e.g. --run {runs_inside[0]}"
            if runs_inside
            else f"pass --run a run directory written by train.py (train one with: {TRAIN_COMMAND})"
        )
        raise UserError(f"{directory} has no {WEIGHTS_FILE}; {fix}")
    if not (directory / TOKENIZER_FILE).is_file():
        raise UserError(
            f"{directory} has no {TOKENIZER_FILE}; copy in the tokenizer.json the model was trained "
            "with (train.py saves it in the run directory)"
        )
    # The tokenizer first: it is cheap, and a wrong one makes loading the weights pointless.
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE, RUN_TOKENIZER_ADVICE)  # DataError (a UserError) if unusable
    token_bytes = token_byte_table(tokenizer)
    try:
        model = load_pretrained(directory, device=str(device))
    except ModelFileError as error:
        raise UserError(str(error)) from None
    vocab_size = model.config.vocab_size
    if len(token_bytes) > vocab_size:
        raise UserError(
            f"{directory / TOKENIZER_FILE} has {len(token_bytes)} tokens but the model's vocab_size "
            f"is {vocab_size}, so they do not belong together; use the tokenizer.json saved with "
            "these weights"
        )
    return LoadedRun(directory, model, tokenizer, token_bytes, eot_id(tokenizer), device)


def validation_tokens(run: LoadedRun, otherwise: str) -> np.ndarray:
    """The run's held-out text, tokenized by its own tokenizer (prepared and cached like training's).
    A run with no config to find it, or trained on other than plain text, is refused with the
    ``otherwise`` advice (what the caller can take instead, e.g. "pass --text-file")."""
    from common.config import build
    from data.config import DataConfig
    from data.prepared.text import prepare_data
    from rundir.record import read_config

    if not (run.directory / RUN_CONFIG_FILE).is_file():
        raise UserError(f"{run.directory} has no {RUN_CONFIG_FILE} to find its validation text; {otherwise}")
    data = build(DataConfig, read_config(run.directory).get("data") or {}, "data")
    if data.format != "text":
        raise UserError(f"{run.directory} was trained on {data.format} data; {otherwise} (held-out plain text)")
    prepared = prepare_data(data, progress=False, tokenizer_file=run.directory / TOKENIZER_FILE)
    return np.asarray(prepared.val_tokens())
