"""serve.py's user errors: one line on stderr, exit code 2, nothing started."""

from __future__ import annotations

import re
import signal

import httpx
import pytest

from server_process import running_server
from serving.cli import main


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--threads", "0"], "--threads must be auto or a whole number of threads >= 1"),
        (["--max-batch", "0"], "--max-batch must be at least 1"),
        (["--port", "70000"], "--port must be in 0..65535"),
        (["--prefill-chunk", "0"], "--prefill-chunk must be at least 1"),
        (["--prefix-cache-mb", "-1"], "--prefix-cache-mb must be 0 (off) or more"),
        (["--prefix-cache-mb", "nan"], "--prefix-cache-mb must be 0 (off) or more"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--max-batch", "many"], "invalid int value"),
        (["--max-body-bytes", "0"], "--max-body-bytes must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, fragment):
    code = main(["--run", str(tmp_path), "--port", "0", *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert main(["--run", str(tmp_path / "missing"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1


def test_a_kv_cache_larger_than_memory_is_one_line_before_allocating(chat_run_dir, capsys):
    code = main(["--run", str(chat_run_dir), "--port", "0", "--device", "cpu", "--max-batch", "100000000"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert re.match(r"error: --max-batch 100000000 needs a KV cache of [\d,.]+ GiB .* pass --max-batch \d+ or less$", err)


def test_sinks_on_a_learned_run_are_refused_in_one_line(chat_run_dir, capsys):
    code = main(["--run", str(chat_run_dir), "--port", "0", "--device", "cpu", "--sinks", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: --sinks applies to runs with rotary or no positions") and "drop --sinks" in err


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_server_with_the_code_every_command_exits_with(chat_run_dir, signum):
    """Ctrl-C and SIGTERM shut the server down gracefully, then exit 130 and 143 as train.py,
    generate.py and export.py do (a shell and a supervisor read them as "stopped by a signal")."""
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
