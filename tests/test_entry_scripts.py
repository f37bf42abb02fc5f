"""Every entry script guards against a signal from its first import: only the standard library loads
before the guard, and a Ctrl-C or SIGTERM at any later import exits 128 + signal, no traceback.
An import hook raises the signal at a chosen import, so each case lands at the same point on any
machine (a fixed delay would not)."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["export.py", "generate.py", "serve.py", "evaluate.py", "attention.py", "train.py"]

# Runs `script --help` with an import hook. The guard's handlers are the ones from common.signals;
# an import is "before" while they have never been in place, and "guarded" while they are. At the
# guarded import `stage` (its number, from 1, or its module's name) the hook raises `signum`.
_DRIVER = """
import importlib.abc, json, runpy, signal, sys
script, stage, signum, report = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.argv = [script, "--help"]
seen = {"before": [], "guarded": []}

def guard_in_place():
    return all(getattr(signal.getsignal(s), "__module__", None) == "common.signals"
               for s in (signal.SIGINT, signal.SIGTERM))

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if guard_in_place():
            seen["guarded"].append(name)
            if stage in (str(len(seen["guarded"])), name) and "fired" not in seen:
                seen["fired"] = name
                signal.raise_signal(signum)
        elif not seen["guarded"]:
            seen["before"].append(name)
        return None

sys.meta_path.insert(0, Watch())
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(report, "w") as f:
        json.dump(seen, f)
"""

def _run(script: str, tmp_path: Path, stage: int | str, signum: int = signal.SIGINT) -> tuple[int, str, dict]:
    report = tmp_path / f"imports-{stage}.json"
    # Ctrl-C's default handler back, in case pytest runs as a shell's background job (SIGINT ignored).
    done = subprocess.run([sys.executable, "-c", _DRIVER, script, str(stage), str(int(signum)), str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return done.returncode, done.stderr, json.loads(report.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_signal_at_any_import_is_quiet(script, tmp_path):
    # Ctrl-C at the first import under the guard: all that came before it is the guard's own.
    code, err, seen = _run(script, tmp_path, 1)
    slow = [name for name in seen["before"]
            if name.split(".")[0] not in sys.stdlib_module_names and name not in ("common", "common.signals")]
    assert slow == [], f"{script} imports {len(slow)} modules before its Ctrl-C guard, from {slow[:3]}"
    assert seen.get("fired") and (code, err) == (130, ""), f"exit {code}\n{err[-3000:]}"
    # SIGTERM halfway through importing torch (numpy is imported from inside it), where an
    # interrupt once left a half-imported numpy; or, for a command that loads torch later,
    # halfway through the imports it makes under the guard.
    code, err, seen = _run(script, tmp_path, "numpy", signal.SIGTERM)
    if not seen.get("fired"):
        assert code == 0, err
        code, err, seen = _run(script, tmp_path, len(seen["guarded"]) // 2, signal.SIGTERM)
        assert seen.get("fired"), "the script imported nothing under the guard"
    assert (code, err) == (143, ""), f"SIGTERM while importing {seen['fired']}: exit {code}\n{err[-3000:]}"


# What train.py and generate.py import only when a config key or a flag asks for it.
OPTIONAL = ("training.tasks.chat", "training.tasks.dpo.config", "training.tasks.dpo.task", "training.tasks.grpo.config",
            "training.tasks.grpo.task", "training.lora", "training.recompute", "training.init_from", "rundir.record",
            "tools", "inference.chat", "inference.tool_use", "inference.speculative", "inference.compiled_step",
            "inference.aot_step", "inference.prefix_cache", "inference.batch_invariant", "data.sources.hub",
            "data.sources.local_files", "data.sources.synthetic", "data.sources.quotes", "data.sources.conversations",
            "analysis.history", "serving", "exporting")


def test_the_main_job_imports_no_optional_capability():
    code = ("import sys, training.cli, training.tasks.text, inference.cli, data.sources.shakespeare; "
            "print(' '.join(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(set(done.stdout.split()) & set(OPTIONAL)) == []
