"""serve.py's user errors: one line on stderr, exit code 2, nothing started; and how it stops."""

import signal

import httpx
import pytest

from server_process import running_server
from refusal_testkit import one_error_line
from serving.cli import main


@pytest.mark.parametrize("run, flags, fragments", [
    ("empty", ["--threads", "0"], ["--threads must be auto or a whole number of threads >= 1"]),
    ("empty", ["--max-batch", "0"], ["--max-batch must be at least 1"]),
    ("empty", ["--port", "70000"], ["--port must be in 0..65535"]),
    ("empty", ["--prefill-chunk", "0"], ["--prefill-chunk must be at least 1"]),
    ("empty", ["--prefix-cache-mb", "-1"], ["--prefix-cache-mb must be 0 (off) or more"]),
    ("empty", ["--prefix-cache-mb", "nan"], ["--prefix-cache-mb must be 0 (off) or more"]),
    ("empty", ["--device", "tpu"], ["unknown device 'tpu'"]),
    ("empty", ["--max-batch", "many"], ["invalid int value"]),
    ("empty", ["--max-body-bytes", "0"], ["--max-body-bytes must be at least 1"]),
    ("empty", ["--max-queue", "-1"], ["--max-queue must be >= 0, got -1"]),
    ("missing", [], ["does not exist"]),
    # The refusals that read the run, before a cache is allocated or a server started.
    ("chat", ["--draft-run", "somewhere"], ["--draft-run goes with --speculate"]),
    ("chat", ["--speculate-k", "3"], ["--speculate-k goes with --speculate"]),
    ("chat", ["--speculate", "draft"], ["--speculate draft needs --draft-run DIR"]),
    ("chat", ["--speculate", "lookup", "--speculate-k", "0"], ["--speculate-k must be 1 to 16, got 0"]),
    ("chat", ["--speculate", "lookup", "--speculate-k", "17"], ["--speculate-k must be 1 to 16, got 17"]),
    ("chat", ["--speculate", "guess"], ["argument --speculate: invalid choice: 'guess'"]),
    ("chat", ["--max-batch", "100000000"],
     ["error: --max-batch 100000000 needs a KV cache of ", " GiB ", "; pass --max-batch ", " or less"]),
    ("chat", ["--sinks", "4"], ["error: --sinks applies to runs with rotary or no positions", "drop --sinks"]),
    ("chat", ["--speculate", "draft", "--draft-run", "{plain}"], ["--draft-run {plain} has another tokenizer"]),
    ("chat", ["--speculate", "draft", "--draft-run", "{missing}"], ["is not a run directory"]),
])
def test_bad_input_is_one_line_and_exit_2(chat_run_dir, plain_run_dir, tmp_path, capsys, run, flags, fragments):
    runs = {"empty": tmp_path, "missing": tmp_path / "missing", "chat": chat_run_dir}
    paths = {"{plain}": str(plain_run_dir), "{missing}": str(tmp_path / "missing")}
    flags = [paths.get(flag, flag) for flag in flags]
    fragments = [fragment.replace("{plain}", str(plain_run_dir)) for fragment in fragments]
    code = main(["--run", str(runs[run]), "--port", "0", "--device", "cpu", *flags])
    one_error_line(code, *capsys.readouterr(), *fragments)


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_server_with_the_code_every_command_exits_with(chat_run_dir, signum):
    """Ctrl-C and SIGTERM shut the server down gracefully, exiting 130 and 143 as every command does."""
    with running_server(chat_run_dir) as server:
        assert httpx.post(f"{server.base}/v1/completions", json={"model": "tiny-chat", "prompt": "O", "max_tokens": 2},
                          timeout=60).status_code == 200
        server.process.send_signal(signum)
        assert server.process.wait(timeout=60) == 128 + signum, server.output()
        assert "Traceback" not in server.output()


def test_the_threads_help_gives_one_default_and_why(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    threads = out[out.index("--threads N|auto "):out.index("endpoints:")]
    assert threads.count("default") == 1 and "(default: 1: a decode step of a small model" in threads
