"""Every script in benchmarks/ runs at a toy size as a user runs it (``python -m benchmarks.NAME``) and
prints its table; the figures mean nothing at this size, the words of each header are checked."""

import json
import math
import re
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed

from bench_testkit import ROOT, run_python
from signal_testkit import start_paused, stop

pytestmark = pytest.mark.e2e


def bench(name: str, *args: object, launcher: tuple[str, ...] = ()) -> str:
    """The benchmark's stdout, after checking that it exited 0 without a traceback."""
    proc = run_python([*launcher, "-m", f"benchmarks.{name}", *map(str, args)])
    assert proc.returncode == 0, f"benchmarks.{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def assert_words(out: str, *words: str) -> None:
    missing = [word for word in words if word not in out]
    assert not missing, f"missing {missing} in:\n{out[-3000:]}"


def test_chat_eval_scores_a_run_and_its_chat_tune(toy_run, toy_chat_run, toy_config) -> None:
    cache = toy_config.parent / "cache"
    out = bench("chat_eval", "--runs", toy_run, toy_chat_run, "--cache-dir", cache, "--replies", 2,
                "--max-new-tokens", 4, "--transcript")
    assert_words(out, "| run | assistant bits/byte |", "| repeated 4-gram (sampled) |", "held-out conversations",
                 "user: Who's there?")
    for run in (toy_run, toy_chat_run):
        row = re.search(rf"^\| {re.escape(str(run))} \| ([0-9.]+) \|", out, re.MULTILINE)
        assert row and math.isfinite(float(row.group(1))), out[-3000:]


def test_attention_variants_trains_each_variant(toy_config, bench_dir) -> None:
    plot = bench_dir / "attention_variants.png"
    out = bench("attention_variants", "--config", toy_config, "--latents", 16, 8, "--decode-steps", 2,
                "--out", bench_dir / "attention_variants", "--plot", plot, "--set", "train.max_minutes=null",
                "--set", "train.max_steps=2", "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=1")
    assert_words(out, "| variant |", "| MHA |", "| MQA |", "| MLA (latent 8) |", "figure:")
    assert plot.stat().st_size > 0


def test_attention_variants_trains_the_positions_axis(toy_config, bench_dir) -> None:
    plot = bench_dir / "positions.png"
    flags = ["--positions", "learned", "rope", "none", "--seeds", 1, 2, "--config", toy_config, "--steps", 2,
             "--eval-windows", 2, "--sink-windows", 2, "--out", bench_dir / "positions", "--plot", plot,
             "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=1"]
    out = bench("attention_variants", *flags)
    assert_words(out, "2 training steps per run", "| positions (GQA, 2 KV heads) |", "| rope |",
                 "vs learned: Δ (Δ/SE)", "| 64 tokens (1×) | 128 tokens (2×) | 256 tokens (4×) |",
                 "not possible (learned positions stop at 64)", "| layer.head | learned | rope | none |",
                 "spreads every query evenly", "figure:")
    assert plot.stat().st_size > 0
    # The same runs measured again, untouched; and refused under another budget than they had.
    weights = bench_dir / "positions" / "gqa2-rope-s1" / "model.safetensors"
    written = weights.stat().st_mtime_ns
    again = bench("attention_variants", *flags, "--reuse-runs")
    assert "reusing positions rope, seed 1" in again and "training positions" not in again
    assert again.split("| positions (GQA")[1] == out.split("| positions (GQA")[1]  # the same tables
    assert weights.stat().st_mtime_ns == written
    refused = run_python(["-m", "benchmarks.attention_variants", *map(str, flags), "--steps", "3", "--reuse-runs"])
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "was trained for 2 training steps, not 3 training steps" in refused.stderr


def test_attention_variants_times_the_latent_forms(toy_config) -> None:
    out = bench("attention_variants", "--forms", "--config", toy_config, "--latents", 16, 8, "--repeats", 1)
    assert_words(out, "kv_latent_dim 16", "kv_latent_dim 8", "expanded", "absorbed", "decode step")


def test_quality_per_minute_screens_at_equal_steps(toy_config, bench_dir) -> None:
    out = bench("quality_per_minute", "--config", toy_config, "--candidate", "rope", "model.positions=rope",
                "--seeds", 1337, "--steps", 2, "--short-steps", 1, "--pairs", 2, "--out", bench_dir / "quality_screen",
                "--set", "eval.max_batches=1", "--set", "eval.final_max_batches=1")
    assert_words(out, "equal steps (2; baseline also 1)", "| Δ at equal steps |", "| rope | 2 |",
                 "baseline at 1 steps")


def test_generate_speed(toy_run) -> None:
    out = bench("generate_speed", "--run", toy_run, "--new-tokens", 8, "--repeats", 1, "--threads", 1)
    assert_words(out, "ours, KV cache", "ours, compiled", "ours, --no-cache", "ONNX Runtime", "arithmetic limit",
                 "GFLOP/s", "1-row matmuls alone", "goal:")


def test_speculative(toy_run) -> None:
    args = ("--run", toy_run, "--draft-run", toy_run, "--new-tokens", 6, "--prompts", 2, "--repeats", 1)
    out = bench("speculative", *args)
    assert_words(out, "| text | proposer | k | plain tokens/s | speculative tokens/s |", "| input-grounded | lookup |",
                 "| free | draft |")
    rows = [json.loads(line) for line in bench("speculative", *args, "--json").splitlines()]
    assert [(row["kind"], row["proposer"]) for row in rows] == [
        ("input-grounded", "lookup"), ("input-grounded", "draft"), ("free", "lookup"), ("free", "draft")]
    assert all(row["identical"] and row["plain_tokens_per_s"] > 0 and row["speculative_tokens_per_s"] > 0
               for row in rows)


def test_generate_speed_on_cuda_runs_on_a_gpu_and_refuses_in_one_line_without_one(toy_run) -> None:
    args = ("--device", "cuda", "--run", toy_run, "--new-tokens", 8, "--repeats", 1)
    if torch.cuda.is_available():
        out = bench("generate_speed", *args)
        assert_words(out, "ours, KV cache", "ours, compiled", "greedy tokens")
        return
    proc = run_python(["-m", "benchmarks.generate_speed", *map(str, args)])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: --device cuda needs a CUDA GPU; leave it out to time the CPU paths\n"


def test_prefix_cache(toy_chat_run) -> None:
    out = bench("prefix_cache", "--run", toy_chat_run, "--clients", 2, "--turns", 2, "--reply-tokens", 2,
                "--cache-mb", 4)
    assert_words(out, "| prefix cache |", "| off |", "| on |", "same replies: True")


def test_serve_throughput(toy_run) -> None:
    out = bench("serve_throughput", "--run", toy_run, "--clients", 1, 2, "--requests", 2, "--max-tokens", 4,
                "--max-batch", 2)
    assert_words(out, "\nengine, eager (warm-up", "\nhttp, eager\n", "| clients |", "TTFT")


def test_serve_throughput_compiled_against_eager(toy_run) -> None:
    out = bench("serve_throughput", "--run", toy_run, "--clients", 1, 2, "--requests", 2, "--max-tokens", 4,
                "--max-batch", 2, "--compile", "both", "--only", "engine")
    assert_words(out, "\nengine, eager (warm-up", "\nengine, compiled (warm-up", "compiled over eager: 1 clients ")


def test_train_throughput_times_bf16_and_fp32_side_by_side(toy_config) -> None:
    out = bench("train_throughput", "--config", toy_config, "--steps", 2, "--warmup", 1, "--compile", "false",
                "--set", "train.device=cpu", "--set", "train.batch_size=2")
    assert_words(out, "MFU", "in bf16", "in fp32")
    rows = {(m["model"].strip(), m["precision"]): float(m["tokens"]) for m in re.finditer(
        r"^\| (?P<model>ours \(GQA, SwiGLU, RMSNorm\)|nanoGPT-style reference) \| (?P<precision>bf16|fp32) \| false \| "
        r"\S+ \| \S+ \| (?P<tokens>[0-9]+) \|", out, re.MULTILINE)}
    assert len(rows) == 4, out
    for model in ("ours (GQA, SwiGLU, RMSNorm)", "nanoGPT-style reference"):
        # The speed-up line is the ratio of the two rows above it, measured in this run.
        line = re.search(rf"^{re.escape(model)}, compile=false: bf16/fp32 tokens/s = ([0-9.]+); round by round: "
                         r"median [0-9.]+, middle half [0-9.]+-[0-9.]+ over 2 rounds$", out, re.MULTILINE)
        assert line, out
        assert float(line.group(1)) == pytest.approx(rows[model, "bf16"] / rows[model, "fp32"], rel=0.02, abs=0.006)
    for precision in ("bf16", "fp32"):
        assert f"compile=false, {precision}: MFU ratio ours/reference = " in out


def test_train_throughput_times_one_precision_when_asked(toy_config) -> None:
    out = bench("train_throughput", "--config", toy_config, "--steps", 1, "--warmup", 1, "--compile", "false",
                "--precision", "fp32", "--no-reference", "--set", "train.device=cpu", "--set", "train.batch_size=2")
    assert re.search(r"^\| ours \(GQA, SwiGLU, RMSNorm\) \| fp32 \| ", out, re.MULTILINE), out
    assert " bf16 " not in out and "bf16/fp32" not in out and "nanoGPT-style reference" not in out


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch has no gloo backend for a CPU torchrun")
def test_train_throughput_ddp_on_two_cpu_processes_sees_a_slow_all_reduce(toy_config) -> None:
    """The scaling efficiency is the single process's step time over DDP's, and an all-reduce made
    slow on purpose (a known answer: every step waits for it) shows in both."""
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    flags = ["--config", toy_config, "--steps", 2, "--warmup", 1, "--compile", "false",
             "--set", "train.device=cpu", "--set", "train.batch_size=2"]
    out = bench("train_throughput", "--ddp", *flags, launcher=torchrun)
    assert_words(out, "1 process", "2 processes (DDP)", "scaling efficiency")
    worker = str(Path(__file__).parent / "ddp_slow_allreduce_worker.py")
    proc = run_python([*torchrun, worker, "0.5", *map(str, flags)], env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    fast, slow = ddp_table(out), ddp_table(proc.stdout)
    assert slow["ddp_ms"] >= 500  # the delay is in every timed step
    for table in (fast, slow):
        assert table["efficiency"] == pytest.approx(100 * table["single_ms"] / table["ddp_ms"], rel=0.05, abs=1.5)
    assert slow["efficiency"] < fast["efficiency"]


def ddp_table(out: str) -> dict[str, float]:
    """The step times and scaling efficiency train_throughput --ddp printed."""
    single = re.search(r"^\| 1 process \| 1 \| ([0-9.]+) \|", out, re.MULTILINE)
    ddp = re.search(r"^\| 2 processes \(DDP\) \| 2 \| ([0-9.]+) \|", out, re.MULTILINE)
    efficiency = re.search(r"scaling efficiency: (\d+)%", out)
    assert single and ddp and efficiency, out[-3000:]
    return {"single_ms": float(single.group(1)), "ddp_ms": float(ddp.group(1)), "efficiency": float(efficiency.group(1))}


def test_induction_lab_trains_a_seed_and_writes_the_held_out_corpus(bench_dir) -> None:
    heldout = bench_dir / "heldout"
    bench("induction_lab", "--heldout", heldout)
    assert (heldout / "repeats.jsonl").stat().st_size > 0
    out = bench("induction_lab", "--seeds", 1, "--out", bench_dir / "induction_lab", "--set", "train.max_steps=4",
                "--set", "eval.interval=2", "--set", "logging.wandb.mode=disabled")
    assert_words(out, "seed")


def _assert_refuses_runs_already_there(lab: list[str]) -> None:
    """A lab run again over its own runs is refused in one line, whose advice is that command's own flags."""
    proc = run_python(lab)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert "pass --resume to continue the lab" in proc.stderr and "--overwrite" in proc.stderr


def _stopped_while_training(lab: list[str], stage: Path) -> None:
    """Ctrl-C once ``stage`` trains (its first step is logged) ends the whole lab: exit 130, no table."""
    code, err = stop(start_paused(lab, stage / "metrics.jsonl"), signal.SIGINT)
    assert code == 130 and "Traceback" not in err, err[-2000:]


def test_rl_lab_runs_a_seed_end_to_end_at_a_toy_size(bench_dir) -> None:
    lab = ["-m", "benchmarks.rl_lab", "--seeds", "1", "--size", "toy", "--out", str(bench_dir / "rl_lab")]
    _stopped_while_training(lab, bench_dir / "rl_lab" / "s1" / "rl")
    proc = run_python([*lab, "--json", "--resume"])  # --resume continues the stopped lab
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(row) >= {"seed", "pass@1_before", "pass@1_after", "pass@8_before", "pass@8_after", "rl_seconds"}
    assert row["seed"] == 1 and all(0 <= row[k] <= 1 for k in row if k.startswith("pass@"))
    assert (bench_dir / "rl_lab" / "s1" / "rl" / "curves.png").stat().st_size > 0
    table = bench("rl_lab", "--seeds", 1, "--size", "toy", "--out", bench_dir / "rl_lab", "--overwrite")
    assert_words(table, "| seed | pass@1 before | after | pass@8 before |")
    assert table.strip().splitlines()[-1] == f"curves: {bench_dir / 'rl_lab' / 's1' / 'rl' / 'curves.png'}"
    _assert_refuses_runs_already_there(lab)
    # --resume keeps the finished runs: each stage says so on stderr, and the table comes again.
    proc = run_python([*lab, "--resume"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(f"[seed 1] {stage}: " in proc.stderr and "(finished: kept)" in proc.stderr
               for stage in ("base", "chat", "rl"))
    assert_words(proc.stdout, "| seed | pass@1 before |", "curves: ")


def test_tool_lab_runs_a_seed_end_to_end_at_a_toy_size(bench_dir) -> None:
    lab = ["-m", "benchmarks.tool_lab", "--seeds", "1", "--size", "toy", "--out", str(bench_dir / "tool_lab")]
    _stopped_while_training(lab, bench_dir / "tool_lab" / "s1" / "grpo")
    proc = run_python([*lab, "--json", "--resume"])  # --resume continues the stopped lab
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(row) >= {"seed", "pass@1_no_tools", "pass@1_sft", "pass@1_grpo", "calling_grpo", "parsed_grpo",
                        "plays_calling", "bpb_sft_plays", "bpb_sft", "bpb_grpo", "base_seconds", "sft_plays_seconds",
                        "sft_seconds", "grpo_seconds", "seconds", "run"}
    assert row["seed"] == 1 and all(0 <= row[k] <= 1 for k in row
                                if k.startswith(("pass@", "calling", "parsed")) and "_by_" not in k)
    assert list(row["pass@1_by_turn"]) == ["1", "2", "3", "4", "5"] and row["pass@1_by_shape"]  # one conversation
    assert all(0 <= share <= 1 for share in [*row["pass@1_by_turn"].values(), *row["pass@1_by_shape"].values()])
    assert 0 <= row["plays_calling"] <= 1 and all(row[f"bpb_{s}"] > 0 for s in ("sft_plays", "sft", "grpo"))
    assert row["run"] == str(bench_dir / "tool_lab" / "s1" / "grpo") and row["seconds"] is None  # not timed whole
    assert (Path(row["run"]) / "model.safetensors").is_file()  # what serve.py --run takes
    assert (bench_dir / "tool_lab" / "tool_lab.png").stat().st_size > 0
    out = bench("tool_lab", "--seeds", 1, "--size", "toy", "--out", bench_dir / "tool_lab", "--overwrite", "--json")
    row = json.loads(out.strip().splitlines()[-1])
    assert row["seconds"] >= row["grpo_seconds"] > 0
    _assert_refuses_runs_already_there(lab)
    # --resume keeps the finished seed, and the table and the figure's place come again.
    proc = run_python([*lab, "--resume"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[seed 1] finished: kept" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"figure: {bench_dir / 'tool_lab' / 'tool_lab.png'}"
    assert_words(proc.stdout, "| seed | pass@1 no tools | SFT | GRPO | GRPO by turn 1-5 | worst shape (GRPO) |", "| 1 | ")
