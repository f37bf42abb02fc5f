"""serve.py's user errors: one line on stderr, exit code 2, nothing started; how it stops; and --compile
(e2e): concurrent requests get the eager server's replies, on the CPU and a CUDA GPU."""

import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from inference.compiled_step import compiler_missing
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


# --compile

PROMPTS = ["ROMEO: But soft", "JULIET: O", "The quick brown fox"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA GPU"))]


def replies(run_dir, *flags: str) -> tuple[list[str], str]:
    openai = pytest.importorskip("openai")
    with running_server(run_dir, "--max-batch", "3", *flags, timeout_s=300) as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=120)

        def complete(i: int) -> str:
            return client.completions.create(model="tiny-plain", prompt=PROMPTS[i], max_tokens=30, temperature=0.8,
                                             seed=i).choices[0].text

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(complete, range(len(PROMPTS))))
        return texts, server.output()


@pytest.mark.e2e  # a compile of its own
@pytest.mark.skipif(compiler_missing(torch.device("cpu")) is not None,
                    reason=str(compiler_missing(torch.device("cpu"))))
@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_server_replies_as_the_eager_one(plain_run_dir, device):
    # On CUDA the server compiles by default: no flag; on the CPU, --compile asks for it.
    compiled, log = replies(plain_run_dir, "--device", device, *(["--compile"] if device == "cpu" else []))
    eager, eager_log = replies(plain_run_dir, "--device", device, "--no-compile")
    assert " the decode step " in log and "compil" not in eager_log and "decode step" not in eager_log
    assert all(text for text in eager)  # an empty reply would prove nothing
    assert compiled == eager
