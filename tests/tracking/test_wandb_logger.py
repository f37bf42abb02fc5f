"""WandbLogger: mode resolution, what an offline run records (wandb_records.py), resume, failing harmlessly."""

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.errors import UserError
from tests.tracking.wandb_records import read_offline_runs
from tracking.wandb_logger import WandbConfig, WandbLogger, has_credentials, resolve_mode

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """An environment with no W&B credentials anywhere, and no WANDB_MODE override."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def write_netrc(path: Path, machine: str) -> Path:
    path.write_text(f"machine {machine}\n  login user\n  password abc123\n")
    path.chmod(0o600)
    return path


# Mode resolution (no wandb involved)


KEY = {"WANDB_API_KEY": "k" * 40}


@pytest.mark.parametrize("mode, env, netrc_host, expected, notes", [
    ("auto", {}, None, "offline", ["no W&B credentials"]),
    ("auto", KEY, None, "online", None),
    ("auto", {}, "api.wandb.ai", "online", None),
    # A netrc entry for another server is not a login for the one being used.
    ("auto", {"WANDB_BASE_URL": "https://wandb.example.com"}, "api.wandb.ai", "offline", ["no W&B credentials"]),
    # WANDB_MODE steers auto, but not an explicit mode.
    ("auto", {**KEY, "WANDB_MODE": "disabled"}, None, "disabled", None),
    ("auto", {**KEY, "WANDB_MODE": "dryrun"}, None, "offline", None),
    ("online", {**KEY, "WANDB_MODE": "disabled"}, None, "online", None),
    ("disabled", KEY, None, "disabled", None),
    # Online without credentials falls back to offline, and says how to log in.
    ("online", {}, None, "offline", ["WANDB_API_KEY", "wandb login"]),
])
def test_the_mode_follows_the_config_the_environment_and_the_credentials(tmp_path, mode, env, netrc_host,
                                                                         expected, notes):
    if netrc_host:
        write_netrc(tmp_path / ".netrc", netrc_host)
    got, note = resolve_mode(mode, {"HOME": str(tmp_path), **env})
    assert got == expected and (note is None if notes is None else all(n in note for n in notes)), note


def test_netrc_location_follows_NETRC_and_the_server_host_and_an_unknown_mode_is_refused(tmp_path):
    custom = write_netrc(tmp_path / "creds", "wandb.example.com")
    env = {"HOME": str(tmp_path), "NETRC": str(custom)}
    assert not has_credentials(env)
    assert has_credentials({**env, "WANDB_BASE_URL": "https://wandb.example.com:8443"})
    assert not has_credentials({"HOME": str(tmp_path), "WANDB_API_KEY": "  "})
    with pytest.raises(UserError, match="logging.wandb.mode must be one of"):
        resolve_mode("sometimes", {})


# Real offline runs, read back


def test_resumed_run_continues_the_same_wandb_run(tmp_path, no_credentials, capsys):
    run_dir = tmp_path / "Bob's run"  # the printed command must survive a space and a quote
    cfg = WandbConfig(mode="auto", project="scaling-test", tags=["t1"])  # no credentials: offline
    first = WandbLogger.start(cfg, run_dir=run_dir, run_config={"a": 1})
    first.log({"train/loss": 2.0}, step=1)
    first.finish({})
    first.finish({"ignored": 1})  # a second finish is a no-op, not an error
    run_id = first.run_id

    second = WandbLogger.start(cfg, run_dir=run_dir, run_config={"a": 1}, resume_id=run_id)
    assert second.run_id == run_id
    second.log({"train/loss": 1.5}, step=2)
    second.finish({"final/val_loss": 1.4})

    pieces = read_offline_runs(run_dir / "wandb")
    assert [p.run_id for p in pieces] == [run_id, run_id]
    assert [(p.project, p.tags, p.name, p.config["a"]) for p in pieces] == [("scaling-test", ["t1"], "Bob's run", 1)] * 2
    assert [p.series("train/loss") for p in pieces] == [[(1, 2.0)], [(2, 1.5)]]
    assert "ignored" not in pieces[0].summary and pieces[1].summary["final/val_loss"] == 1.4
    # The printed sync command covers both pieces (one line per start, saying why it is offline).
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and "no W&B credentials" in lines[0] and err == ""
    command = lines[1].split("upload later with: ", 1)[1]
    assert command.startswith(f"wandb sync --id {run_id} ") and command == second.sync_command

    # The command as a user pastes it, through a real shell, with wandb's own --dry-run: it finds
    # both pieces (it lists them by path; the upload orders them by start time). A closed port as
    # the server keeps it off the network.
    wandb_cli = shlex.quote(str(Path(sys.executable).parent / "wandb"))
    dry_run = command.replace("wandb sync", f"{wandb_cli} sync --dry-run", 1)
    env = {**os.environ, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_SILENT": "false"}
    done = subprocess.run(["bash", "-c", dry_run], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[-1] for line in (done.stdout + done.stderr).splitlines() if line.endswith(".wandb")]
    assert "Would sync 2 run(s)" in done.stdout + done.stderr
    assert sorted(Path(f).parent.name for f in listed) == sorted(p.directory.name for p in pieces), done.stdout + done.stderr


# Failing without harm


def test_failing_to_start_or_to_log_is_one_line_and_stops_logging(tmp_path, monkeypatch, capsys):
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("service exploded\nwith a second line")

    monkeypatch.setattr(wandb, "init", broken_init)
    logger = WandbLogger.start(WandbConfig(mode="offline"), run_dir=tmp_path, run_config={}, resume_id="abc123")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["wandb: could not start (RuntimeError: service exploded); training continues without wandb"]
    assert not logger.active and logger.run_id == "abc123"
    logger.log({"loss": 1.0}, step=1)
    logger.log_samples(1, [("a", "b")])
    logger.finish({"x": 1})
    assert capsys.readouterr() == ("", "")
    # A failing log call reports once and stops logging.
    class FlakyRun:
        def __init__(self):
            self.calls, self.finished_with = 0, None

        def log(self, metrics, step):
            self.calls += 1
            raise ConnectionError("network is down")

        def finish(self, exit_code=0):
            self.finished_with = exit_code

    run = FlakyRun()
    logger = WandbLogger(run=run, run_id="r1")
    logger.log({"loss": 1.0}, step=1)
    logger.log({"loss": 0.9}, step=2)
    logger.finish({"final": 1})
    assert run.calls == 1 and run.finished_with == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "wandb: could not log (ConnectionError: network is down); training continues without wandb"
    ]
    assert logger.run_id == "r1"


def test_non_main_ranks_and_disabled_mode_are_free(tmp_path):
    """Neither imports wandb nor writes a file; importing the module does not import wandb."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from tracking.wandb_logger import WandbLogger
        assert "wandb" not in sys.modules, "importing the logger imported wandb"

        class Cfg:
            mode, project, entity, name, tags = "online", "p", None, None, []

        run_dir = Path({str(tmp_path)!r}) / "run"
        logger = WandbLogger.start(Cfg(), run_dir=run_dir, run_config={{}}, resume_id="r7", is_main=False)
        Cfg.mode = "disabled"
        disabled = WandbLogger.start(Cfg(), run_dir=run_dir, run_config={{}}, resume_id=None)
        for lg in (logger, disabled):
            lg.log({{"loss": 1.0}}, step=1)
            lg.log_samples(1, [("a", "b")])
            lg.finish({{"x": 1}})
        assert (logger.run_id, disabled.run_id) == ("r7", None)
        assert "wandb" not in sys.modules, "a no-op logger imported wandb"
        assert not run_dir.exists()
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n" and result.stderr == ""


def test_never_prompts_even_on_a_terminal(tmp_path):
    """mode=online with no credentials and a terminal attached: wandb would normally ask for an
    API key and wait forever; the logger must log offline instead and return promptly."""
    import pty

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    script = textwrap.dedent(
        f"""
        from tracking.wandb_logger import WandbLogger

        class Cfg:
            mode, project, entity, name, tags = "online", "p", None, None, []

        logger = WandbLogger.start(Cfg(), run_dir={str(tmp_path / 'run')!r}, run_config={{}})
        logger.log({{"loss": 1.0}}, step=1)
        logger.finish({{}})
        """
    )
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], cwd=ROOT, env=env,
            stdin=follower, stdout=follower, stderr=follower, close_fds=True,
        )
        os.close(follower)
        output = b""
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(leader)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "API key" not in text and "logging offline instead" in text
    [run] = read_offline_runs(tmp_path / "run" / "wandb")
    assert run.series("loss") == [(1, 1.0)]
