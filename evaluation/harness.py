"""The one place that calls lm-evaluation-harness (a development dependency, imported only when an
evaluation runs): its ``hf`` model on a local export, local jsonl tasks, offline."""

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, TextIO
from unittest import mock

from common.errors import UserError

INSTALL = 'pip install "lm-eval[hf]>=0.4.13,<0.5" (or pip install -r requirements-dev.txt)'
# Stderr of bits/byte and perplexity comes from bootstrap resamples of the plays; lm-eval's
# default count is meant for thousands of documents and only costs time on a handful.
BOOTSTRAP_ITERS = 1000


def require_lm_eval() -> None:
    """Raise a UserError saying how to install lm-eval when it is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise UserError(f"evaluation runs lm-evaluation-harness, which is not installed: {INSTALL}") from None


def run_lm_eval(
    export_dir: Path, task_dir: Path, tasks: list[str], *, batch_size: int, device: str,
    limit: int | None = None, verbose: bool = False, progress: TextIO | None = None,
) -> dict[str, Any]:
    """lm-eval's results for ``tasks`` (found in ``task_dir``) on the transformers folder ``export_dir``.
    ``progress``: where a bar per kind of request goes (lm-eval's own bars are shown with ``verbose``
    instead; None: no bar)."""
    require_lm_eval()
    # Offline before datasets and huggingface_hub are imported: they read the setting then.
    with mock.patch.dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"):
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        if not verbose:
            # lm-eval warns for every context it shortens to fit the window, which is expected here.
            logging.getLogger("lm_eval").setLevel(logging.ERROR)
        manager = TaskManager(include_path=str(task_dir), include_defaults=False)
        with contextlib.nullcontext() if verbose else _quiet():
            # Built as simple_evaluate builds model="hf" from its arguments.
            model = HFLM.create_from_arg_obj(
                # float32: the numbers must match train.py's fp32 evaluation, not a half-precision copy.
                {"pretrained": str(export_dir), "trust_remote_code": True, "dtype": "float32"},
                {"batch_size": batch_size, "device": device},
            )
            return lm_eval.simple_evaluate(
                model=model if verbose or progress is None else _with_progress(model, batch_size, progress),
                tasks=tasks,
                limit=limit,
                task_manager=manager,
                log_samples=False,
                bootstrap_iters=BOOTSTRAP_ITERS,
            )


# What one request of each kind is, for the bars.
_REQUESTS = {"loglikelihood": "choices", "loglikelihood_rolling": "documents"}


def _with_progress(model: Any, batch_size: int, out: TextIO) -> Any:
    """``model`` (an lm-eval ``LM``) handed its requests a part at a time, with one bar per kind of
    request: lm-eval's own bars come one per batch, hundreds of them. Each request is scored on its
    own, so the parts change no score beyond fp32 rounding."""
    from lm_eval.api.model import LM
    from tqdm import tqdm

    class WithProgress(LM):
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return self._in_parts(model.loglikelihood, requests, 8 * batch_size, "loglikelihood")

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            # A document is many windows: one at a time still fills every batch.
            return self._in_parts(model.loglikelihood_rolling, requests, 1, "loglikelihood_rolling")

        def generate_until(self, requests, disable_tqdm: bool = False):
            return model.generate_until(requests, disable_tqdm=True)  # no task here generates

        @staticmethod
        def _in_parts(score, requests, size: int, kind: str) -> list:
            results = []
            with tqdm(total=len(requests), desc=f"lm-eval {kind}", unit=f" {_REQUESTS[kind]}", file=out) as bar:
                for start in range(0, len(requests), size):
                    part = requests[start:start + size]
                    results += score(part, disable_tqdm=True)
                    bar.update(len(part))
            return results

    return WithProgress()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide lm-eval's and transformers' progress bars and transformers' note that a play is longer
    than the window (lm-eval's rolling windows handle that); shown should the evaluation fail."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    hidden = io.StringIO()
    try:
        with contextlib.redirect_stderr(hidden):
            yield
    except Exception:
        sys.stderr.write(hidden.getvalue())
        raise
    finally:
        transformers.logging.set_verbosity(level)


def results_table(results: dict[str, Any]) -> str:
    """lm-eval's own markdown table of the results."""
    from lm_eval.utils import make_table

    return make_table(results)


def summary_metrics(results: dict[str, Any]) -> dict[str, float]:
    """``{task}/{metric}`` -> value for every number lm-eval reported (stderr included), e.g.
    ``shakespeare_next_line/acc``; lm-eval's ``,none`` filter suffix is dropped."""
    metrics = {}
    for task, values in results["results"].items():
        for key, value in values.items():
            name, _, _filter = key.partition(",")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "alias":
                metrics[f"{task}/{name}"] = float(value)
    return metrics
