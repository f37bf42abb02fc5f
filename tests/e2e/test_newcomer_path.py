"""The README's newcomer path for real, as a user types it (only the budget, run directory, data cache
and wandb overridden): train tiny.yaml briefly, then sample from the run."""

import json
from pathlib import Path

import pytest

from e2e_testkit import ROOT, run_ok


@pytest.mark.e2e
def test_train_tiny_then_generate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train = run_ok([str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
                    "--set", "train.max_steps=3", "--set", f"run.out_dir={run_dir}",
                    "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "logging.wandb.mode=disabled",
                    "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=2", "--no-progress"],
                   # generous: a loaded CI machine, and compile where tiny.yaml turns it on (CUDA)
                   cwd=tmp_path, timeout=480)
    assert "done: 3 steps" in train.stdout

    # The run directory explains itself: all generate.py needs, plus what --resume needs.
    for name in ("config.yaml", "tokenizer.json", "model_config.json", "model.safetensors",
                 "trainer_state.pt", "metrics.jsonl", "loss_curve.png"):
        assert (run_dir / name).is_file(), f"{name} missing from the run directory"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 3 for r in records)

    gen = run_ok([str(ROOT / "generate.py"), "--run", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "20",
                  "--temperature", "0"], cwd=tmp_path, timeout=120)
    assert gen.stdout.startswith("ROMEO:")
    # Three steps of training teach little (often newlines), so check that 20 tokens of
    # continuation came out, not what they say.
    assert len(gen.stdout) > len("ROMEO:"), "no continuation was printed"
    assert "generated 20 tokens" in gen.stderr
