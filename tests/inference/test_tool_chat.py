"""generate.py --chat --tools: calls run, kept in the conversation, and shown with their results."""

import io
import os
import re
import signal
import sys

import pytest

from data.chat import Message, ToolCall
from inference.chat import ChatSession
from inference.settings import GenerationSettings
from refusal_testkit import one_error_line
from run_testkit import build_run, chat_tokenizer_before_tools
from signal_testkit import start_paused, stop

GREEDY = dict(temperature=0, max_new_tokens=60)


def test_a_session_runs_the_call_and_keeps_it_in_the_conversation(tool_run):
    from tools import Toolbox, load_tools

    shown: list[str] = []
    with Toolbox(load_tools(["calculator"]), timeout_s=60) as toolbox:
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
    # tests/inference/test_chat.py's test_repl_over_stdin_resets_and_exits.
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
