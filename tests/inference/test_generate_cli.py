"""generate.py through ``main(argv)``: output, run discovery and user errors, and a few real processes; at the
edges, near-zero temperature, and stdout closed, full or left by its reader (one line, exit 2, or quiet);
and windows of a few tokens, every kind of positions, through generate.py and its chat."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from refusal_testkit import one_error_line
from run_testkit import build_model, build_run
from inference.completion import encode_prompt, generate_completions
from inference.engine import decode
from inference.sampling import SamplingSettings, sample_next_token
from inference.settings import GenerationSettings
from rundir.loading import load_run

REPO = Path(__file__).resolve().parents[2]
PROMPT = "JULIET: O 世界 😀"


def library_text(loaded_run, prompt=PROMPT, **settings) -> list[str]:
    ids = encode_prompt(loaded_run, prompt).ids
    result = generate_completions(loaded_run, ids, GenerationSettings(**settings))
    return [completion.text for completion in result.completions]


def test_help_gives_the_defaults(cli):
    code, out, _ = cli("--help")
    assert code == 0
    for default in ("default: 200", "default: 0.8", "default: 0.95", "default: auto", "SEED+i", "before the stop"):
        assert default in out


def test_json_reports_every_sample_with_its_seed(cli, run_dir, loaded_run):
    code, out, err = cli(
        "--run", run_dir, "--prompt", PROMPT, "--num-samples", 3, "--seed", 5,
        "--top-k", 20, "--max-new-tokens", 30, "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["prompt"] == PROMPT and report["run"] == str(run_dir)
    assert [s["seed"] for s in report["samples"]] == [5, 6, 7]
    singles = [library_text(loaded_run, seed=5 + i, top_k=20, max_new_tokens=30)[0] for i in range(3)]
    assert [s["text"] for s in report["samples"]] == singles
    assert all(len(s["token_ids"]) == 30 and s["finish_reason"] == "length" for s in report["samples"])
    assert report["tokens_generated"] == 90 and report["decode_tokens_per_s"] > 0


def test_samples_headers_quiet_and_the_prompt_from_stdin_or_a_file(cli, run_dir, loaded_run, monkeypatch, tmp_path):
    texts = library_text(loaded_run, seed=1, num_samples=2, max_new_tokens=20)
    args = ["--run", run_dir, "--prompt", PROMPT, "--seed", 1, "--max-new-tokens", 20]
    code, out, _ = cli(*args, "--num-samples", 2)
    assert code == 0
    assert out == "".join(f"--- sample {i + 1}/2 (seed {1 + i}) ---\n{PROMPT}{texts[i]}\n" for i in range(2))
    code, out, err = cli(*args, "--quiet")
    assert (code, out, err) == (0, texts[0] + "\n", "")
    # The prompt from stdin and from a file.
    expected = PROMPT + library_text(loaded_run, temperature=0, max_new_tokens=10)[0] + "\n"
    common = ["--run", run_dir, "--temperature", 0, "--max-new-tokens", 10]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(PROMPT.encode())))
    assert cli(*common, "--prompt", "-")[:2] == (0, expected)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_bytes(b"\xef\xbb\xbf" + PROMPT.encode())  # a BOM is not part of the prompt
    assert cli(*common, "--prompt-file", prompt_file)[:2] == (0, expected)


def test_stop_string_ends_the_printed_text_and_a_long_prompt_is_cropped(cli, run_dir, loaded_run):
    full = library_text(loaded_run, temperature=0, max_new_tokens=60)[0]
    stop = full[30:33]
    code, out, _ = cli("--run", run_dir, "--prompt", PROMPT, "--temperature", 0, "--stop", stop, "--quiet")
    assert (code, out) == (0, full[: full.index(stop)] + "\n")
    # A long prompt is cropped, with a notice.
    prompt = "and again " * 40
    code, out, err = cli("--run", run_dir, "--prompt", prompt, "--max-new-tokens", 3, "--seed", 0)
    assert code == 0 and out.startswith(prompt)
    assert err.count("\n") == 2 and err.startswith("notice: the prompt is") and "last 32" in err


def test_latest_run_under_runs_is_used_by_default(cli, monkeypatch, copy_run, tmp_path):
    older, newer = copy_run("runs/older"), copy_run("runs/newer")
    (tmp_path / "runs" / "notes").mkdir()  # a directory without weights is not a run
    os.utime(older / "model.safetensors", (2_000_000_000, 2_000_000_000))
    os.utime(newer / "model.safetensors", (1_000_000_000, 1_000_000_000))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("--max-new-tokens", 2, "--json")
    assert code == 0 and json.loads(out)["run"] == str(Path("runs") / "older")
    # The choice is said on stderr: after a fine-tune the newest run may not be the one meant.
    assert f"using {Path('runs') / 'older'}, the most recently trained run" in err
    code, _, err = cli("--max-new-tokens", 2, "--quiet")
    assert code == 0 and err == ""


def assert_user_error(cli, argv, *needles) -> None:
    one_error_line(*cli(*argv), *needles)  # nothing on stdout: no prompt echo before a failure


@pytest.mark.parametrize("flags, needle", [
    (["--temperature", "-0.5"], "temperature must be a finite number >= 0"),
    (["--temperature", "inf"], "temperature must be a finite number >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--top-p", "nan"], "top_p must be in (0, 1]"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-k", "0"], "top_k must be a positive integer"),
    (["--max-new-tokens", "-1"], "max_new_tokens must be >= 0"),
    (["--num-samples", "0"], "num_samples must be >= 1"),
    (["--repetition-penalty", "0"], "repetition_penalty must be a finite number > 0"),
    (["--temperature", "hot"], "invalid float value"),
    (["--prompt", "a", "--prompt-file", "b"], "not allowed with"),
    (["--prompt-file", "/no/such/prompt.txt"], "cannot read prompt file"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "cuda:99"], "cuda:99"),
    (["--num-samples", "10000000"], "num_samples must be >= 1 and at most 1024"),
    (["--prompt", "ok", "--stop", "ab\udcff"],
     "--stop is not valid UTF-8 (byte 0xff at offset 2); convert it to UTF-8"),
    (["--prompt", "ab\udcff"], "--prompt is not valid UTF-8 (byte 0xff at offset 2); convert it to UTF-8"),
    (["--prompt", "x", "--compile", "--no-cache"],
     "--compile compiles the cached decode step; drop --no-cache or --compile"),
    (["--prompt", "O", "--sinks", "2"], "--sinks applies to runs with rotary or no positions"),
    (["--prompt", "O", "--sinks", "2"], "drop --sinks"),
    (["--chat", "--num-samples", "2", "--prompt", "hi"], "--chat gives one reply at a time"),
    (["--system", "You are X.", "--prompt", "hi"], "--system needs --chat"),
    (["--chat", "--prompt", "x" * 200], "tokens: more than the 31 tokens the model's window leaves for them"),
    (["--tools", "calculator", "--prompt", "hi"], "--tools needs --chat"),
    (["--chat", "--tools", "abacus", "--prompt", "hi"], "--tools: unknown tool 'abacus'"),
    (["--chat", "--tools", "no_such_module_here:f", "--prompt", "hi"], "cannot import no_such_module_here"),
    (["--chat", "--max-tool-calls", "2", "--prompt", "hi"], "--max-tool-calls needs --tools"),
    (["--chat", "--tools", "calculator", "--max-tool-calls", "-1", "--prompt", "hi"], "must be 0 or more"),
    (["--prompt", "hi", "--speculate", "lookup", "--no-cache"],
     "--speculate checks its guesses through the KV cache; drop --no-cache"),
    (["--prompt", "hi", "--speculate", "lookup", "--speculate-k", "31"], "--speculate-k must be 1 to 16, got 31"),
    (["--prompt", "hi", "--speculate", "lookup", "--draft-run", "x"], "--speculate draft needs --draft-run DIR"),
    (["--prompt", "hi", "--speculate-k", "2"], "--speculate-k goes with --speculate"),
])
def test_bad_flags_are_one_line_errors(cli, run_dir, flags, needle):
    assert_user_error(cli, ["--run", run_dir, *flags], needle)


def test_missing_runs_files_and_unreadable_prompts(cli, monkeypatch, copy_run, tmp_path, run_dir):
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli, [], "no trained run found", "python train.py --config configs/tiny.yaml")
    assert list(tmp_path.iterdir()) == []
    assert_user_error(cli, ["--run", "nowhere"], "nowhere does not exist")
    no_weights = copy_run("no_weights")
    (no_weights / "model.safetensors").unlink()
    assert_user_error(cli, ["--run", no_weights], "has no model.safetensors", "train.py")
    no_tokenizer = copy_run("no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    assert_user_error(cli, ["--run", no_tokenizer], "has no tokenizer.json")
    assert_user_error(cli, ["--run", tmp_path], "it holds runs", f"--run {tmp_path / 'no_tokenizer'}")
    (no_tokenizer / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    assert_user_error(cli, ["--run", no_tokenizer], "not a valid tokenizer.json")
    # Unreadable prompts.
    assert_user_error(cli, ["--run", run_dir, "--prompt-file", tmp_path], "cannot read prompt file")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait")))
    assert_user_error(cli, ["--run", run_dir, "--prompt", "-"], "not valid UTF-8", "0xe9 at offset 3")


def test_damaged_weights_and_mismatched_tokenizer(cli, copy_run, tmp_path, tokenizer_path):
    from model.io import save_pretrained

    truncated = copy_run("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_user_error(cli, ["--run", truncated], "model.safetensors")
    corrupt = copy_run("corrupt")
    data = bytearray((corrupt / "model.safetensors").read_bytes())
    data[-100:-50] = bytes(50)  # inside the tensor data, where only the checksum can tell
    (corrupt / "model.safetensors").write_bytes(bytes(data))
    assert_user_error(cli, ["--run", corrupt], "corrupt")
    mismatched = tmp_path / "mismatched"
    save_pretrained(build_model(vocab_size=200), mismatched)
    (mismatched / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    assert_user_error(cli, ["--run", mismatched], "has 300 tokens but the model's vocab_size is 200")


# One intra-op thread: the test model is tiny and the test machine's cores are shared.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}


def generate_py(*argv, cwd=REPO, stdin: bytes = b"", stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """generate.py as a process, with ``stdout`` its standard output (a pipe by default, or a file descriptor)."""
    return subprocess.run([sys.executable, str(REPO / "generate.py"), *map(str, argv)], cwd=cwd, input=stdin,
                          stdout=stdout, stderr=subprocess.PIPE, env=ENV, timeout=120)


def test_subprocess_prints_the_prompt_then_greedy_text_and_stats_the_same_without_cache(run_dir, loaded_run, cli):
    expected = PROMPT + library_text(loaded_run, temperature=0, max_new_tokens=300)[0] + "\n"
    args = ["--run", run_dir, "--prompt", PROMPT, "--temperature", 0, "--max-new-tokens", 300]
    done = generate_py(*args)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode("utf-8") == expected
    assert b"generated 300 tokens" in done.stderr and b"Traceback" not in done.stderr
    assert b"time to first token" in done.stderr and b"tokens/s" in done.stderr
    # Without the cache, past the window: the same text, through the same main (one start-up is enough).
    code, out, err = cli(*args, "--no-cache")
    assert (code, out) == (0, expected) and "generated 300 tokens" in err


# Both are refused in-process above (test_unreadable_prompts, test_missing_runs_and_files); as a
# process, the one refused after the run has loaded by default, the other with the slow tests.
@pytest.mark.parametrize("case", ["stdin-not-utf8", pytest.param("no-runs", marks=pytest.mark.e2e)])
def test_subprocess_user_errors_exit_2_without_traceback(run_dir, tmp_path, case):
    if case == "no-runs":
        done = generate_py("--prompt", "hi", cwd=tmp_path)  # no runs/ here
    else:
        done = generate_py("--run", run_dir, "--prompt", "-", stdin=b"\xff\xfe not utf-8")
    assert done.returncode == 2 and done.stdout == b""
    err = done.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_sinks_reach_a_rolling_run_and_are_refused_past_its_window(cli, tokenizer_path, tmp_path):
    rope = build_run(tmp_path / "rope", Tokenizer.from_file(str(tokenizer_path)), positions="rope")
    code, out, err = cli("--run", rope, "--prompt", "O", "--sinks", 32)
    assert code == 2 and err == "error: --sinks must be 0 to 31 (the window less one), got 32\n"
    # Past the 32-token window: the default keeps 4 sinks; keeping none evicts another way.
    texts = [cli("--run", rope, "--prompt", "O", "--temperature", 0, "--max-new-tokens", 90, "--quiet",
                 *sinks)[1] for sinks in ([], ["--sinks", 4], ["--sinks", 0])]
    assert texts[0] == texts[1] != texts[2]


# At the edges


def test_tiny_temperatures_sample_the_argmax_and_ties_share_the_draw(cli, run_dir):
    logits = torch.tensor([[1.0, 5.0, 2.0, -3.0], [7.0, 7.0, 0.0, float("-inf")]])
    for temperature in (1e-39, 1e-30, 1e-45):
        g = torch.Generator().manual_seed(0)
        picked = sample_next_token(logits, temperature=temperature, generator=g)
        assert picked[0].item() == 1 and picked[1].item() in (0, 1)
    # Across seeds, a tie at the maximum is split between the tied ids and nothing else.
    seen = {sample_next_token(logits[1:], temperature=1e-39, generator=torch.Generator().manual_seed(s)).item()
            for s in range(32)}
    assert seen == {0, 1}
    # generate.py at a near-zero temperature prints the greedy text.
    greedy, tiny = (cli("--run", run_dir, "--prompt", "JULIET:", "--temperature", temperature, "--max-new-tokens", 24,
                        "--quiet") for temperature in ("0", "1e-39"))
    assert greedy[0] == 0 and greedy == tiny, greedy[2]


def _reader_gone() -> int:
    """The writing end of a pipe whose reader has already left (as `| head` does after its bytes):
    every write fails with EPIPE, from the first, however quick or slow the machine."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def test_a_reader_that_leaves_ends_the_command_quietly_and_a_closed_stdout_is_one_line(run_dir):
    pipe = _reader_gone()
    try:
        # --quiet: the first write is the first token's text, from inside the decode loop.
        done = generate_py("--run", run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 60, "--quiet", stdout=pipe)
    finally:
        os.close(pipe)
    assert (done.returncode, done.stderr.decode()) == (0, "")
    # Closed stdout is one line and exit 2.
    command = f'"{sys.executable}" generate.py --run "{run_dir}" --prompt hi --max-new-tokens 4 >&-'
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip() == "error: standard output is closed; redirect it to a file or a pipe"
    # A reader that leaves the chat ends it quietly.
    pipe = _reader_gone()
    try:
        done = generate_py("--run", run_dir, "--chat", "--max-new-tokens", 5, stdout=pipe,
                           stdin=b"".join(f"line {i}\n".encode() for i in range(200)))
    finally:
        os.close(pipe)
    err = done.stderr.decode()
    assert done.returncode == 0 and err == f"chatting with {run_dir} (type a message; /help lists the commands)\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="this system has no /dev/full")
def test_a_full_disk_under_output_is_one_line(cli, run_dir, monkeypatch):
    with open("/dev/full", "w") as full:  # every flush fails with ENOSPC
        monkeypatch.setattr(sys, "stdout", full)
        code, _, err = cli("--run", run_dir, "--prompt", "hi", "--max-new-tokens", 4)
        monkeypatch.undo()
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: cannot write the output: ") and "No space left on device" in err
    # Streamed from a process.
    with open("/dev/full", "wb") as full:
        done = generate_py("--run", run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 60, "--quiet",
                           stdout=full.fileno())
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err[-3000:]
    assert err.startswith("error: cannot write the output: ") and "No space left on device" in err


# Windows of a few tokens

WINDOWS = (2, 3, 4)
POSITIONS = ("learned", "rope", "none")
LONG_PROMPT = "ROMEO: But soft, what light through yonder window breaks?"
NEW = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer_path):
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    folder = tmp_path_factory.mktemp("small-windows")
    return {(block, positions): build_run(folder / f"{positions}-{block}", tokenizer, block_size=block,
                                          positions=positions, never_predicts=("<|endoftext|>", "<|end|>"))
            for block in WINDOWS for positions in POSITIONS}


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("block", WINDOWS)
def test_generate_py_continues_a_long_prompt_in_any_small_window(block, positions, runs, cli):
    run_dir = runs[block, positions]
    code, out, err = cli("--run", run_dir, "--prompt", LONG_PROMPT, "--max-new-tokens", NEW, "--temperature", 0,
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    run = load_run(run_dir, torch.device("cpu"))
    ids = run.tokenizer.encode(LONG_PROMPT).ids
    rolls = positions != "learned"
    # The whole prompt where the window rolls; its last block_size tokens where it re-encodes.
    seen = ids if rolls else ids[-block:]
    assert report["prompt_tokens"] == len(seen) and "longer than the model's" in err
    assert ("rolls through the cache" in err) == rolls and ("sees only the last" in err) != rolls
    greedy = SamplingSettings(max_new_tokens=NEW, temperature=0.0, top_p=None)
    expected, = decode(run.model, [seen], greedy)
    assert report["samples"][0]["token_ids"] == list(expected.token_ids) and len(expected.token_ids) == NEW


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("block", WINDOWS)
def test_a_chat_in_any_small_window_replies_or_says_in_one_line_why_not(block, positions, runs, cli):
    code, out, err = cli("--run", runs[block, positions], "--chat", "--prompt", "Who's there?", "--max-new-tokens", NEW,
                         "--temperature", 0)
    if positions == "learned":  # a turn's own tokens outgrow the window: nothing to roll, so refused
        assert (code, out) == (2, "") and err.count("\n") == 1
        assert err.startswith("error: the last message is ") and err.endswith("shorten it\n")
    else:
        assert code == 0 and "Traceback" not in err
        assert out.endswith("\n") and len(out) > 1
