"""Tools described by their signatures and run in a worker process: every failure a tool can have
(raising, hanging, exiting, crashing, printing, huge or odd results) comes back as an error result
the model reads, and the caller goes on; a timed-out worker is killed with what it started."""

import json
import os
import time

import pytest

from tools import BUILT_IN, ToolError, Toolbox, load_tool, load_tools
from tools.registry import check_arguments

# Generous: no test may depend on how fast a loaded machine starts a process or answers.
PATIENT = 60.0


def toolbox(*names: str, **options) -> Toolbox:
    options.setdefault("timeout_s", PATIENT)
    return Toolbox(load_tools([f"tool_testkit:{name}" for name in names]), **options)


def test_a_function_is_described_by_its_signature_and_docstring():
    tool = load_tool("tool_testkit:add")
    assert tool.schema() == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a"], "additionalProperties": False}}}
    assert load_tool("calculator") is BUILT_IN["calculator"]


@pytest.mark.parametrize("specs, fragment", [
    (["abacus"], "unknown tool 'abacus'"),
    (["no_such_module_here:f"], "cannot import no_such_module_here"),
    (["tool_testkit:missing"], "has no function 'missing'"),
    (["json:dumps"], "annotate parameter"),
    (["calculator", "calculator"], "two tools are named 'calculator'"),
])
def test_a_tool_that_cannot_be_set_up_is_refused_in_one_line(specs, fragment):
    with pytest.raises(ToolError, match=fragment) as info:
        load_tools(specs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("leaves, said", [
    ('sys.exit("leaving at import")', "cannot import mymod (SystemExit: leaving at import)"),
    ("os._exit(4)", "importing mymod ended its process (exit code 4)"),
    ("raise KeyboardInterrupt", "cannot import mymod (KeyboardInterrupt)"),
])
def test_a_tool_module_that_leaves_at_import_is_one_error_and_the_caller_goes_on(tmp_path, monkeypatch, leaves, said):
    (tmp_path / "mymod.py").write_text(f"import os, sys\n{leaves}\n")
    monkeypatch.syspath_prepend(tmp_path)
    with pytest.raises(ToolError) as info:
        load_tools(["calculator", "tool_testkit:add", "mymod:calculator"])
    assert str(info.value) == f"tool 'mymod:calculator': {said}"


@pytest.mark.parametrize("arguments, fragment", [
    ([1], "must be a JSON object"),
    ({}, "needs the argument 'a'"),
    ({"a": 1, "c": 2}, "takes no argument 'c'"),
    ({"a": "1"}, "'a' must be an integer"),
    ({"a": True}, "'a' must be an integer"),
])
def test_arguments_are_checked_against_the_parameters(arguments, fragment):
    assert fragment in check_arguments(load_tool("tool_testkit:add"), arguments)
    assert check_arguments(load_tool("tool_testkit:add"), {"a": 1, "b": 2}) is None


def test_calls_run_in_a_worker_and_every_failure_is_a_result():
    with toolbox("add", "fails", "exits", "crashes", "chatty", "huge", "structured", "surrogate",
                 max_result_chars=100) as tools:
        assert tools.run("add", '{"a": 2, "b": 40}').text == "42"
        assert tools._worker.process.pid != os.getpid()
        results = {
            "raises": tools.run("fails", '{"text": "purpose"}'),
            "exits": tools.run("exits", '{"code": 3}'),
            "crashes": tools.run("crashes", "{}"),
            "prints": tools.run("chatty", '{"text": "hi"}'),
            "huge": tools.run("huge", '{"size": 101}'),
            "bad json": tools.run("add", '{"a": 1'),
            "unknown": tools.run("abacus", "{}"),
            "wrong type": tools.run("add", '{"a": "x"}'),
        }
        assert results["raises"].text == "error: RuntimeError: broken on purpose"
        assert results["exits"].text == "error: SystemExit: 3"
        assert results["crashes"].text == "error: crashes ended its process without a result (exit code 7)"
        assert results["prints"].ok and results["prints"].text == "read '', said hi"
        assert results["huge"].text == "error: the result is 101 characters, over the limit of 100"
        assert results["bad json"].text.startswith("error: the arguments are not JSON")
        assert results["unknown"].text.startswith("error: there is no tool 'abacus'")
        assert "must be an integer" in results["wrong type"].text
        assert not any(result.ok or "\n" in result.text for name, result in results.items() if name != "prints")
        # After the crash a fresh worker took over, and calls go on.
        assert tools.run("huge", '{"size": 100}').text == "x" * 100
        assert tools.run("structured", '{"flag": true}').text == json.dumps({"flag": True, "items": [1, 2]})
        assert tools.run("surrogate", "{}").text == "a?b"


@pytest.mark.parametrize("name, arguments", [("hangs", '{"seconds": 600}'), ("spins", "{}")])
def test_a_tool_past_its_time_limit_is_stopped_and_the_next_call_works(name, arguments):
    with toolbox(name, "add") as tools:
        tools.run("add", '{"a": 1}')  # the worker is up: the limit below is the call's alone
        first = tools._worker.process
        tools.timeout_s = 0.5  # the tool never finishes, however fast the machine
        result = tools.run(name, arguments)
        assert result.text == f"error: {name} did not finish within 0.5 s" and not result.ok
        assert first.poll() is not None  # killed and reaped, not abandoned
        tools.timeout_s = PATIENT
        assert tools.run("add", '{"a": 1}').text == "2"


def test_a_timed_out_tool_takes_what_it_started_with_it(tmp_path):
    pid_file = tmp_path / "child.pid"
    with toolbox("hangs_with_a_child", "add", timeout_s=PATIENT) as tools:
        tools.run("add", '{"a": 1}')  # the worker is up and has imported the tools
        # Within the limit the tool only starts `sleep` and writes its pid: a fork, an exec and a
        # small write, far under 2 s however loaded the machine.
        tools.timeout_s = 2.0
        result = tools.run("hangs_with_a_child", json.dumps({"path": str(pid_file)}))
    assert "did not finish" in result.text
    child = int(pid_file.read_text())
    deadline = time.monotonic() + PATIENT
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_tool_that_closes_the_workers_pipes_is_an_error_result_and_nothing_else(capfd):
    with toolbox("closes_pipes", "add") as tools:
        assert tools.run("closes_pipes", "{}").text == "error: closes_pipes ended its process without a result " \
                                                        "(exit code 1)"
        assert tools.run("add", '{"a": 1}').text == "2"
        process = tools._worker.process
    assert process.poll() is not None  # closing the toolbox ended its worker
    assert capfd.readouterr().err == ""  # the worker shares the caller's stderr: no traceback of its own


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
