"""generate.py --chat: the cache against recomputation, the window policy, the REPL, Ctrl-C and errors; with
--tools, calls run, kept in the conversation, and shown with their results."""

import io
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from data.chat import Message, ToolCall, render_chat
from refusal_testkit import one_error_line
from run_testkit import build_model, build_run, chat_tokenizer_before_tools, tokenizer_without_chat
from inference.chat import ChatSession
from inference.settings import GenerationSettings
from rundir.loading import LoadedRun
from signal_testkit import start_paused, stop

REPO = Path(__file__).resolve().parents[2]
MESSAGES = ["Who is there?", "O Romeo 😀", "the fox", "世界", "again and again"]


def _conversation(run, *, use_cache: bool, **settings):
    notices: list[str] = []
    session = ChatSession(run, GenerationSettings(**settings), system_prompt="You are JULIET.",
                          use_cache=use_cache, on_notice=notices.append)
    replies = [session.reply(message).token_ids for message in MESSAGES]
    return replies, notices, session


@pytest.mark.parametrize("settings", [dict(temperature=0, max_new_tokens=9), dict(seed=3, max_new_tokens=9, top_k=40)])
def test_multi_turn_chat_through_the_cache_equals_full_recomputation(loaded_run, settings):
    cached, cached_notices, session = _conversation(loaded_run, use_cache=True, **settings)
    recomputed, recomputed_notices, reference = _conversation(loaded_run, use_cache=False, **settings)
    assert cached == recomputed
    # A 32-token window cannot hold five exchanges: the oldest messages were dropped, the same way.
    assert cached_notices == recomputed_notices and cached_notices
    assert all("oldest message(s) were dropped (the system prompt is kept)" in n for n in cached_notices)
    assert session.messages == reference.messages
    assert session.tokens_encoded < reference.tokens_encoded
    # What is left is whole exchanges, the most recent ones, each a user message and its reply.
    kept = session.messages
    assert 2 <= len(kept) < 2 * len(MESSAGES) and [m.role for m in kept] == ["user", "assistant"] * (len(kept) // 2)
    assert [m.content for m in kept[::2]] == MESSAGES[-len(kept) // 2:]


def test_earlier_turns_come_from_the_prefix_cache_not_re_encoded(loaded_run):
    model = build_model(loaded_run.model.config.vocab_size, block_size=256)
    run = LoadedRun(loaded_run.directory, model, loaded_run.tokenizer, loaded_run.token_bytes, loaded_run.eot_id,
                    torch.device("cpu"))
    _, notices, session = _conversation(run, use_cache=True, temperature=0, max_new_tokens=6)
    assert not notices
    # The conversation kept is each user message and its reply, in order.
    assert [m.content for m in session.messages[::2]] == MESSAGES
    assert [m.role for m in session.messages[1::2]] == ["assistant"] * len(MESSAGES)
    # Each turn's prompt begins with the last one's: its whole pages are copied, the rest encoded.
    system = [Message("system", "You are JULIET.")]
    prompts = [len(render_chat(run.tokenizer, [*system, *session.messages[:2 * i], Message("user", m)],
                               add_generation_prompt=True).ids) for i, m in enumerate(MESSAGES)]
    page = session.engine.prefill_chunk
    reused = sum(page * (before // page) for before in prompts[:-1])
    assert reused > 0 and session.tokens_encoded == sum(prompts) - reused


def test_one_shot_prints_one_reply_and_a_run_without_chat_tokens_is_told_to_retrain(cli, copy_run, run_dir, loaded_run):
    run = copy_run("old")
    tokenizer_without_chat().save(str(run / "tokenizer.json"))
    code, out, err = cli("--run", run, "--chat", "--prompt", "hi")
    assert code == 2 and "it was trained before the chat format existed" in err and "pretrain a new run" in err
    # One shot prints one reply.
    code, out, err = cli("--run", run_dir, "--chat", "--prompt", MESSAGES[0], "--temperature", 0,
                         "--max-new-tokens", 7, "--system", "You are JULIET.")
    assert code == 0
    session = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=7), system_prompt="You are JULIET.")
    assert out == session.reply(MESSAGES[0]).text + "\n"


def test_repl_over_stdin_resets_and_exits(run_dir, loaded_run):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    stdin = f"{MESSAGES[0]}\n/reset\n{MESSAGES[0]}\n{MESSAGES[1]}\n/exit\nnever read\n"
    proc = subprocess.run(
        [sys.executable, str(REPO / "generate.py"), "--run", str(run_dir), "--chat", "--temperature", "0",
         "--max-new-tokens", "5", "--system", "You are JULIET."],
        input=stdin, capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "(conversation cleared)" in proc.stderr
    session = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=5), system_prompt="You are JULIET.")
    first = session.reply(MESSAGES[0]).text
    second = session.reply(MESSAGES[1]).text
    # After /reset the same first message gets the same first reply; /exit stops before the last line.
    assert proc.stdout == f"{first}\n{first}\n{second}\n"


def _chat_command(run_dir: Path) -> list[str]:
    return [sys.executable, str(REPO / "generate.py"), "--run", str(run_dir), "--chat", "--temperature", "0",
            "--max-new-tokens", "5"]


def test_repl_refuses_a_line_that_is_not_utf8_and_goes_on_and_help_is_not_sent(run_dir, loaded_run, cli,
                                                                              monkeypatch):
    # In-process: the REPL's command line as a process is test_repl_over_stdin_resets_and_exits's.
    stdin = b"\xff\xfe caf\xe9\n/help\n/nope\n" + MESSAGES[0].encode() + b"\n/quit\n" + MESSAGES[1].encode() + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code, out, err = cli(*_chat_command(run_dir)[2:])
    assert code == 0 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == ["error: that line is not valid UTF-8 (byte 0xff at offset 0); convert it to UTF-8",
                      "error: there is no command /nope; /help lists the commands"]
    assert "/reset" in err and "/exit" in err  # /help listed the commands...
    # ...and only the one real message reached the model, as the first turn of the conversation
    # (/quit left before the last line).
    expected = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=5)).reply(MESSAGES[0]).text
    assert out == expected + "\n"


def _read_until(fd: int, needle: bytes, seen: bytearray, count: int, timeout: float = 60.0) -> None:
    """Read the terminal into ``seen`` until ``needle`` occurs ``count`` times (or it closes)."""
    deadline = time.monotonic() + timeout
    while seen.count(needle) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"timed out waiting for {needle!r}; the terminal shows {bytes(seen)[-500:]!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            return
        if not chunk:
            return
        seen += chunk


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_at_a_terminal_lines_are_edited_recalled_and_ctrl_d_ends_the_line(run_dir):
    pytest.importorskip("readline")
    try:
        controller, terminal = os.openpty()
    except OSError as error:  # a container without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here ({error})")
    env = dict(os.environ, TERM="xterm", INPUTRC=os.devnull, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(_chat_command(run_dir), stdin=terminal, stdout=terminal, stderr=terminal, cwd=REPO,
                            env=env, close_fds=True)
    os.close(terminal)
    seen = bytearray()
    try:
        _read_until(controller, b"you> ", seen, 1)
        os.write(controller, MESSAGES[0].encode() + b"\r")
        _read_until(controller, b"you> ", seen, 2)
        os.write(controller, b"\x1b[A\r")  # Up arrow: the line before, sent again
        _read_until(controller, b"you> ", seen, 3)
        os.write(controller, b"\x04")  # Ctrl-D
        _read_until(controller, b"\0never", seen, 1)  # to the end of the output
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(controller)
    shown = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", bytes(seen)).replace(b"\r", b"").decode(errors="replace")
    assert "^[[A" not in shown and "Traceback" not in shown
    assert shown.count(MESSAGES[0]) == 2, shown  # typed once, recalled once
    assert shown.endswith("you> \n"), shown  # Ctrl-D leaves the shell prompt on a fresh line


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_ctrl_c_at_the_prompt_says_how_to_leave_and_a_second_in_a_row_quits(run_dir, loaded_run):
    """A Ctrl-C meant for a reply that has just ended lands on the prompt: it must not quit. (Replies go
    to a pipe, so lines are read with a plain read(), which a signal interrupts anywhere: no pause.)"""
    try:
        controller, terminal = os.openpty()
    except OSError as error:  # a container without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here ({error})")
    proc = subprocess.Popen(_chat_command(run_dir), stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(terminal)
    err = bytearray()

    def prompts(count: int) -> None:  # read stderr until the prompt has been shown `count` times
        while err.count(b"you> ") < count:
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            chunk = os.read(proc.stderr.fileno(), 4096) if ready else b""
            assert chunk, f"no prompt; stderr so far: {bytes(err)[-1000:]!r}"
            err.extend(chunk)

    try:
        prompts(1)
        proc.send_signal(signal.SIGINT)  # one Ctrl-C: a hint, and the prompt again
        prompts(2)
        os.write(controller, MESSAGES[0].encode() + b"\n")  # the conversation goes on
        prompts(3)
        proc.send_signal(signal.SIGINT)
        prompts(4)
        proc.send_signal(signal.SIGINT)  # a second in a row: quit
        out, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        os.close(controller)
    shown = (err + rest).decode()
    assert proc.returncode == 0 and "Traceback" not in shown, shown[-2000:]
    hint = "you> \n(to leave: Ctrl-C again, Ctrl-D or /exit)\n"
    assert shown.count(hint) == 2 and shown.endswith(hint + "you> \n"), shown
    expected = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=5)).reply(MESSAGES[0]).text
    assert out.decode() == expected + "\n"


def test_ctrl_c_in_a_reply_stops_it_and_keeps_what_was_said(loaded_run):
    session = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=9), system_prompt="You are JULIET.")
    whole = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=9),
                        system_prompt="You are JULIET.").reply(MESSAGES[0])
    shown: list[str] = []

    def interrupt_after_two_pieces(text: str) -> None:
        shown.append(text)
        if text and len([t for t in shown if t]) == 2:
            raise KeyboardInterrupt

    stopped = session.reply(MESSAGES[0], on_text=interrupt_after_two_pieces)
    assert stopped.finish_reason == "interrupted" and stopped.text == "".join(shown)
    assert whole.text.startswith(stopped.text) and len(stopped.token_ids) < len(whole.token_ids)
    assert session.messages == [Message("user", MESSAGES[0]), Message("assistant", stopped.text)]
    assert session.engine.active == 0  # the row is free: the next turn is answered
    assert session.reply(MESSAGES[1]).finish_reason in ("end", "length")


@pytest.fixture(scope="module")
def endless_run_dir(tmp_path_factory, tokenizer_path) -> Path:
    """A run whose replies never end by themselves: only the 2048-token window stops them."""
    return build_run(tmp_path_factory.mktemp("runs") / "endless", Tokenizer.from_file(str(tokenizer_path)),
                     block_size=2048, never_predicts=("<|end|>", "<|endoftext|>"))


def _read_more(fd: int, seen: bytearray, count: int, timeout: float = 60.0) -> None:
    """Read the terminal into ``seen`` until ``count`` more bytes have come."""
    goal = len(seen) + count
    while len(seen) < goal:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"timed out; the terminal shows {bytes(seen)[-500:]!r}"
        seen += os.read(fd, 4096)


@pytest.mark.e2e  # a real generate.py at a real terminal: seconds to start
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs a pseudo-terminal (pty.fork)")
def test_at_a_terminal_ctrl_c_stops_the_reply_and_two_at_an_empty_prompt_quit(endless_run_dir):
    import pty

    command = [sys.executable, str(REPO / "generate.py"), "--run", str(endless_run_dir), "--chat", "--temperature",
               "0", "--max-new-tokens", "100000"]
    env = dict(os.environ, TERM="xterm", INPUTRC=os.devnull, PYTHONUNBUFFERED="1")
    pid, controller = pty.fork()  # the child's controlling terminal: Ctrl-C there is its SIGINT
    if pid == 0:
        os.chdir(REPO)
        # As a terminal's shell starts it: a test run in the background inherits SIGINT ignored,
        # and a program keeps an ignored SIGINT ignored across exec.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(sys.executable, command, env)
    seen = bytearray()
    try:
        _read_until(controller, b"you> ", seen, 1)
        for turn, message in enumerate(MESSAGES[:2], start=1):
            os.write(controller, message.encode() + b"\r")
            _read_until(controller, message.encode(), seen, 1)  # the line, echoed
            _read_more(controller, seen, 40)  # the reply is streaming
            os.write(controller, b"\x03")
            _read_until(controller, b"reply stopped (Ctrl-C)", seen, turn)
            _read_until(controller, b"you> ", seen, turn + 1)
        # At an empty prompt: quit. Not the instant the prompt shows: CPython's readline loop checks
        # for a signal only when its select() is interrupted, so a SIGINT landing between drawing the
        # prompt and that select() waits for the next key; a person is never that quick.
        time.sleep(0.5)
        os.write(controller, b"\x03")  # the first says how to leave...
        _read_until(controller, b"(to leave: Ctrl-C again, Ctrl-D or /exit)", seen, 1)
        _read_until(controller, b"you> ", seen, 4)
        time.sleep(0.5)
        os.write(controller, b"\x03")  # ...and a second in a row quits
        _read_until(controller, b"\0never", seen, 1)  # to the end of the output
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(controller)
    shown = bytes(seen).replace(b"\r", b"").decode(errors="replace")
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown[-2000:]
    # Each notice starts a line of its own, after the stopped text, and the prompt comes back.
    assert shown.count("\nnotice: reply stopped (Ctrl-C); the conversation goes on\nyou> ") == 2, shown[-2000:]


# With --tools

GREEDY = dict(temperature=0, max_new_tokens=60)


def test_a_session_runs_the_call_and_keeps_it_in_the_conversation(tool_run, toolbox):
    shown: list[str] = []
    session = ChatSession(tool_run, GenerationSettings(**GREEDY), toolbox=toolbox)
    reply = session.reply("What is 12*34?", on_text=shown.append)
    assert (reply.text, reply.finish_reason, "".join(shown)) == ("408", "end", "408")
    call = ToolCall("calculator", '{"expression":"12*34"}')
    assert [step.call for step in reply.steps] == [call]
    assert session.messages == [Message("user", "What is 12*34?"), Message("assistant", "", (call,)),
                                Message("tool", "408"), Message("assistant", "408")]
    # Without tools the same question gets no call.
    session = ChatSession(tool_run, GenerationSettings(**GREEDY))
    reply = session.reply("What is 12*34?")
    assert reply.steps == [] and "<|call|>" not in reply.text
    assert [m.role for m in session.messages] == ["user", "assistant"]


# One shot: the answer, and the call with its result; a malformed call as written, with what is wrong.
@pytest.mark.parametrize("question, printed, shown", [
    ("What is 7+8?", r"15\n", '\n[calculator {"expression":"7+8"} -> 15]\n'),
    ("What is 5*5?", r"<\|call\|>calculator.*", "notice: the model wrote a call that could not be run (call 1 to calculator:"),
])
def test_one_shot_prints_the_answer_and_shows_the_call(cli, tool_run_dir, question, printed, shown):
    code, out, err = cli("--run", tool_run_dir, "--chat", "--tools", "calculator", "--prompt", question,
                         "--temperature", 0, "--max-new-tokens", 60)
    assert code == 0 and re.fullmatch(printed, out, re.S) and shown in "\n" + err  # a whole line, or a fragment


def test_the_repl_shows_calls_between_turns(tool_run_dir, cli, monkeypatch, tmp_path):
    # In-process (the tools still run in their worker process): the REPL as a process is
    # test_repl_over_stdin_resets_and_exits.
    stdin = "What is 12*34?\n/reset\nWhat is 99-45?\n/exit\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code, out, err = cli("--run", tool_run_dir, "--chat", "--tools", "calculator", "--temperature", 0,
                         "--max-new-tokens", 60)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert out == "408\n54\n"
    assert '[calculator {"expression":"12*34"} -> 408]' in err
    assert '[calculator {"expression":"99-45"} -> 54]' in err
    # A run from before tool calls chats but refuses tools in one line.
    run = build_run(tmp_path / "old", chat_tokenizer_before_tools())
    code, out, err = cli("--run", run, "--chat", "--prompt", "hi", "--temperature", 0, "--max-new-tokens", 3)
    assert code == 0 and out.endswith("\n")
    one_error_line(*cli("--run", run, "--chat", "--tools", "calculator", "--prompt", "hi"),
                   "error: this run's tokenizer has no tool tokens (<|tool|>, <|call|>)")


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.e2e), signal.SIGTERM])
def test_a_signal_while_a_tool_spins_ends_the_command_and_its_worker(tool_run_dir, tmp_path, signum):
    marker = tmp_path / "worker.pid"
    (tmp_path / "spin.py").write_text(
        f"import os\ndef calculator(expression: str) -> str:\n    open('{marker}.new', 'w').write(str(os.getpid()))\n"
        f"    os.replace('{marker}.new', '{marker}')\n"
        "    while True:\n        pass\n")
    process = start_paused(["generate.py", "--run", str(tool_run_dir), "--chat", "--tools", "spin:calculator",
                            "--prompt", "What is 12*34?", "--temperature", "0"], marker,
                           env={**os.environ, "PYTHONPATH": str(tmp_path)})
    worker = int(marker.read_text())
    code, err = stop(process, signum)
    assert code == 128 + signum and "Traceback" not in err, err
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # killed and reaped, not left spinning
