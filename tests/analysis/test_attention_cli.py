"""attention.py end to end on saved runs of both attention kinds, and its one-line refusals; --copy's
scores where a prompt writes a span twice."""

import json
import re
import shutil
import subprocess

import pytest
import torch

from analysis.cli import main
from analysis.maps import SpanRepeat, find_repeat
from analysis.roles import attention_maps
from refusal_testkit import one_error_line
from rundir.loading import load_run
from run_testkit import build_run, chat_tokenizer

PROMPT = "ROMEO: But soft, what light"


KINDS = {"gqa": dict(n_kv_head=2), "mla": dict(n_kv_head=4, attention="mla", kv_latent_dim=16),
         "mla-rope": dict(n_kv_head=4, attention="mla", kv_latent_dim=16, positions="rope")}


@pytest.fixture(scope="module", params=list(KINDS))
def run_dir(request, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp(request.param) / "run", chat_tokenizer(), **KINDS[request.param])


def one_kind_by_default(kept: str) -> pytest.MarkDecorator:
    """``run_dir`` of ``kept`` in the default suite; the other kinds with the slow tests (drawing a
    figure takes seconds, and the kinds share the drawing code)."""
    return pytest.mark.parametrize("run_dir", [kind if kind == kept else pytest.param(kind, marks=pytest.mark.e2e)
                                               for kind in KINDS], indirect=True)


def is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@one_kind_by_default("mla-rope")
def test_the_grid_the_single_map_and_the_untrained_comparison_are_drawn(run_dir, tmp_path, capsys):
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--out", str(tmp_path / "grid.png")]) == 0
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--layer", "1", "--head", "3",
                 "--out", str(tmp_path / "one.png")]) == 0
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--compare-init", "--out", str(tmp_path / "init.png")]) == 0
    for name in ("grid.png", "one.png", "init.png"):
        assert is_png(tmp_path / name)
    assert "wrote" in capsys.readouterr().err


def test_json_holds_rows_that_sum_to_one_and_compare_scale_prints_both_entropies(run_dir, capsys, tmp_path):
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    T = len(report["token_ids"])
    assert len(report["tokens"]) == T and len(report["weights"]) == 2  # build_run has 2 layers
    for layer in report["weights"]:
        for head in layer:
            assert len(head) == T
            for i, row in enumerate(head):
                assert sum(row) == pytest.approx(1.0, abs=1e-5)
                assert all(w == 0.0 for w in row[i + 1:])
    # --compare-scale draws one head and prints both entropies.
    out = tmp_path / "scale.png"
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--layer", "1", "--head", "2", "--compare-scale",
                 "--out", str(out)]) == 0
    assert is_png(out)
    line = capsys.readouterr().out.strip()
    config = json.loads((run_dir / "model_config.json").read_text())
    # The d of 1/√d is the dot product's width: latent attention's rotary part (half a head) is in it.
    d = 16 + (8 if config.get("positions") == "rope" else 0)
    assert line.startswith(f"layer 1 head 2 (d = {d}): mean attention entropy ")
    with_scale, without = (float(part.split(" bits")[0].split()[-1]) for part in line.split(","))
    assert without <= with_scale


def test_roles_print_one_row_per_layer_and_head(run_dir, tmp_path, capsys):
    text = tmp_path / "held_out.txt"
    text.write_text("JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father. " * 40, encoding="utf-8")
    assert main(["--run", str(run_dir), "--roles", "--text-file", str(text), "--windows", "2"]) == 0
    out = capsys.readouterr().out
    rows = head_rows(out)
    assert len(rows) == 2 * 4
    for row in rows:
        scores = [float(cell) for cell in row[2:]]
        assert all(0.0 <= s for s in scores) and scores[0] <= 1 and scores[1] <= 1 and scores[3] <= 1
    # Each layer's sum is the sum of its heads' induction scores (as printed, to rounding).
    layers = [row for row in table_rows(out) if len(row) == 2]
    assert [int(row[0]) for row in layers] == [0, 1]
    for layer, total in layers:
        heads = [float(row[5]) for row in rows if row[0] == layer]
        assert float(total) == pytest.approx(sum(heads), abs=2e-3)
    assert f"distinct ids (each seen 10+ times) from --text-file {text}, at periods 8" in out


def table_rows(out):
    """The cells of every numeric row of the markdown tables in ``out``."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]


def head_rows(out):
    """The rows of the per-head table (layer, head and four scores)."""
    return [row for row in table_rows(out) if len(row) == 6]


def test_roles_default_to_the_runs_own_validation_text_read_from_its_config(run_dir, tmp_path, capsys):
    import yaml

    run = shutil.copytree(run_dir, tmp_path / "run")
    assert main(["--run", str(run), "--roles", "--windows", "1"]) == 2
    assert "has no config.yaml to find its validation text" in capsys.readouterr().err
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"play{i}.txt").write_text(f"ROMEO {i}: But soft, what light through yonder window breaks? " * 30)
    data = {"source": "files", "files": {"paths": [str(corpus / "*.txt")]}, "val_fraction": 0.5,
            "cache_dir": str(tmp_path / "cache"), "vocab_size": 320}
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {**data, "format": "chat"}}))
    assert main(["--run", str(run), "--roles", "--windows", "1"]) == 2
    assert "was trained on chat data" in capsys.readouterr().err
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data, "train": {"init_from": str(tmp_path / "gone")}}))
    assert main(["--run", str(run), "--roles", "--windows", "1"]) == 0
    assert len(head_rows(capsys.readouterr().out)) == 2 * 4


@pytest.fixture(scope="module")
def variant_runs(tmp_path_factory):
    """A GQA, an MQA and an MLA run sharing one tokenizer, and a run whose tokenizer differs."""
    root = tmp_path_factory.mktemp("variants")
    tokenizer = chat_tokenizer()
    return {
        "gqa": build_run(root / "gqa", tokenizer, n_kv_head=2),
        "mqa": build_run(root / "mqa", tokenizer, n_kv_head=1, seed=1),
        "mla": build_run(root / "mla", tokenizer, n_kv_head=4, attention="mla", kv_latent_dim=16),
        "other-tokenizer": build_run(root / "other", chat_tokenizer(vocab_size=270), n_kv_head=2),
    }


@pytest.mark.parametrize("head", [[], ["--head", "3"]])
def test_runs_of_every_kind_draw_side_by_side(variant_runs, tmp_path, head, capsys):
    out = tmp_path / "variants.png"
    runs = [str(variant_runs[kind]) for kind in ("gqa", "mqa", "mla")]
    assert main(["--runs", *runs, "--prompt", PROMPT, "--layer", "1", *head, "--out", str(out)]) == 0
    assert is_png(out) and "wrote" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--layer", "1"], "split the prompt into different tokens"),
    ([], "the following arguments are required: --layer; see python attention.py runs --help"),
    (["--layer", "2"], "--layer 2 is out of range"),
    (["--layer", "0", "--head", "4"], "--head 4 is out of range"),
    (["--layer", "0", "--json"], "attention.py runs does not take --json; see python attention.py runs --help"),
    (["--layer", "0", "--run", "runs/x"], "attention.py runs does not take --run runs/x"),
    (["--layer", "0", "--roles"], "attention.py roles does not take --runs "),
])
def test_bad_runs_input_is_one_line_and_exit_2(variant_runs, args, message, capsys):
    runs = [str(variant_runs["gqa"]), str(variant_runs["other-tokenizer"])]
    one_error_line(main(["--runs", *runs, "--prompt", PROMPT, *args]), *capsys.readouterr(), message)


# Each mode takes only its own flags (argparse's subcommands): the rest are one line and exit 2, before
# anything is written.
@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "argument --prompt: is empty; give the text, e.g. --prompt"),
    # What Python makes of the argument bytes b"ROMEO \xff" on a UTF-8 system.
    (["--prompt", b"ROMEO \xff".decode("utf-8", errors="surrogateescape"), "--json"], "--prompt is not valid UTF-8"),
    (["--run", "nope", "--prompt", PROMPT], "run directory nope does not exist"),
    (["--prompt", PROMPT, "--out", "."], "--out . is a directory"),
    (["--prompt", PROMPT, "--layer", "2", "--head", "0"], "--layer 2 is out of range"),
    (["--prompt", PROMPT, "--layer", "0", "--head", "4"], "--head 4 is out of range"),
    (["--prompt", PROMPT, "--layer", "0"], "the following arguments are required: --head"),
    (["--prompt", PROMPT, "--head", "0"], "the following arguments are required: --layer"),
    (["--prompt", PROMPT, "--out", "/nonexistent-dir/x.png"], "does not exist"),
    (["--prompt", PROMPT, "--out", "fig.jpeg2000"], "the suffix names the figure's format"),
    (["--prompt", PROMPT, "--out", "attention"], "end the name with .png, .pdf, .svg"),
    (["--prompt", PROMPT, "--windows", "2"], "attention.py draw does not take --windows 2"),
    (["--prompt", PROMPT, "--compare-scale"], "the following arguments are required: --layer, --head"),
    (["--prompt", PROMPT, "--compare-scale", "--layer", "0", "--head", "0", "--json"], "scale does not take --json"),
    (["--prompt", PROMPT, "--compare-scale", "--compare-init", "--layer", "0", "--head", "0"],
     "scale does not take --compare-init"),
    (["--prompt", PROMPT, "--json", "--out", "weights.png"], "attention.py json does not take --out weights.png"),
    (["--prompt", PROMPT, "--json", "--compare-init"], "json does not take --compare-init"),
    (["--prompt", PROMPT, "--json", "--layer", "0", "--head", "0"], "json does not take --layer 0 --head 0"),
    (["--prompt", PROMPT, "--roles"], "attention.py roles does not take --prompt"),
    (["--roles", "--windows", "0"], "argument --windows: must be from 1 to 1024, got '0'"),
    (["--roles", "--windows", "1025"], "argument --windows: must be from 1 to 1024, got '1025'"),
    (["--roles", "--text-file", "same.txt"], "the induction probe repeats at least 8 distinct ones"),
    # /dev/zero never ends: reading it whole would exhaust memory rather than finish. A bounded read
    # of it holds one distinct token, too few for the induction probe.
    (["--roles", "--text-file", "/dev/zero", "--windows", "2"], "--text-file /dev/zero holds 1 distinct tokens"),
    (["--prompt", PROMPT, "--copy", ""], "argument --copy: is empty; give the text, e.g. --copy 281764"),
    (["--prompt", PROMPT, "--copy", "408", "--layer", "0", "--head", "0"], "copy does not take --layer 0 --head 0"),
    (["--roles", "--copy", "408"], "attention.py roles does not take --copy 408"),
    (["--prompt", PROMPT, "--copy", "409"], "--copy '409' (3 tokens) does not occur twice"),
    (["--copy", "408"], "the following arguments are required: --prompt; see python attention.py copy --help"),
    (["--history", "--induction-threshold", "0"], "argument --induction-threshold: is a weight in (0, 1], got '0'"),
    (["--history", "--induction-threshold", "1.01"], "argument --induction-threshold: is a weight in (0, 1]"),
    (["--history", "--induction-threshold", "nan"], "argument --induction-threshold: is a weight in (0, 1]"),
    (["--history", "--prompt", "ROMEO:"], "attention.py history does not take --prompt ROMEO:"),
    (["--history", "--layer", "0", "--head", "0"], "history does not take --layer 0 --head 0"),
    (["--history", "--roles"], "attention.py roles does not take --history"),
    (["--history", "--out", "/nonexistent-dir/h.png"], "does not exist"),
    (["--prompt", "ROMEO:", "--induction-threshold", "0.3"], "draw does not take --induction-threshold 0.3"),
    (["--history"], "has no metrics.jsonl"),  # read_attention_history's refusals (test_history.py)
])
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(run_dir, args, message, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "same.txt").write_text("a" * 4000, encoding="utf-8")
    one_error_line(main(["--run", str(run_dir), *args]), *capsys.readouterr(), message)
    assert [p.name for p in tmp_path.iterdir()] == ["same.txt"]


CONVERSATION = ('<|user|>What is 12*34?<|end|><|assistant|><|call|>calculator{"expression":"12*34"}<|end|>'
                "<|tool|>408<|end|><|assistant|>408<|end|>")


@pytest.fixture(scope="module")
def copy_run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("copy") / "run", chat_tokenizer(), block_size=64)


def test_copy_scores_are_each_heads_weights_at_the_answers_positions_and_the_copier_is_drawn(copy_run_dir, tmp_path,
                                                                                             capsys):
    figure = tmp_path / "copy.png"  # the copier beside the head that copies least
    assert main(["--run", str(copy_run_dir), "--prompt", CONVERSATION, "--copy", "408", "--out", str(figure)]) == 0
    assert is_png(figure) and f"wrote {figure}" in capsys.readouterr().err
    assert main(["--run", str(copy_run_dir), "--prompt", CONVERSATION, "--copy", "408"]) == 0
    out = capsys.readouterr().out
    rows = [[float(x) for x in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| layer")]
    run = load_run(copy_run_dir, torch.device("cpu"))
    ids = run.tokenizer.encode(CONVERSATION).ids
    span = run.tokenizer.encode("408").ids
    # The result's tokens follow <|tool|>, the answer's the last <|assistant|>: found here by the special ids.
    result = ids.index(run.tokenizer.token_to_id("<|tool|>")) + 1
    answer = len(ids) - 1 - ids[::-1].index(run.tokenizer.token_to_id("<|assistant|>")) + 1
    assert ids[result:result + len(span)] == ids[answer:answer + len(span)] == span
    maps = attention_maps(run.model, torch.tensor([ids]))
    assert len(rows) == len(maps) * maps[0].shape[1]
    for layer, head, copy, induction in rows:
        probs = maps[int(layer)][0, int(head)]
        want_copy = sum(probs[answer + j - 1, result + j] for j in range(len(span))) / len(span)
        want_induction = sum(probs[answer + j, result + j + 1] for j in range(len(span))) / len(span)
        assert (copy, induction) == (pytest.approx(float(want_copy), abs=6e-4),
                                     pytest.approx(float(want_induction), abs=6e-4))
    assert f"tokens {result}-{result + len(span) - 1} written again at {answer}-{answer + len(span) - 1}" in out
    # A repeat is found by its tokens, never overlapping.
    assert find_repeat([5, 1, 2, 7, 1, 2, 9], [1, 2]) == SpanRepeat(offset=1, period=3, length=2)
    assert find_repeat([1, 1, 1], [1, 1]) is None  # the two would share a token
    assert find_repeat([1, 1, 1, 1], [1, 1]) == SpanRepeat(0, 2, 2)
    assert find_repeat([3, 4, 5], [4]) is None


FORMATS = [(".pdf", b"%PDF"), (".svg", b"<?xml"), (".PNG", b"\x89PNG")]


# Each format once on a kind of its own by default (every kind's grid drawn), the rest with the slow tests.
@pytest.mark.parametrize("run_dir, suffix, magic", [
    (kind, suffix, magic) if k == f else pytest.param(kind, suffix, magic, marks=pytest.mark.e2e)
    for k, kind in enumerate(KINDS) for f, (suffix, magic) in enumerate(FORMATS)], indirect=["run_dir"])
def test_the_figure_is_written_in_the_format_its_name_asks_for(run_dir, tmp_path, suffix, magic):
    out = tmp_path / f"grid{suffix}"
    assert main(["--run", str(run_dir), "--prompt", PROMPT, "--out", str(out)]) == 0
    assert out.read_bytes().startswith(magic)


def test_the_figures_the_docs_draw_in_the_checkout_are_git_ignored():
    """Following README.md or docs/*.md leaves no figure for `git status` to list."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    names = sorted({m for t in texts for m in re.findall(r"--out ([\w.-]+\.png)\b", t.read_text(encoding="utf-8"))})
    assert "attention.png" in names and "history.png" in names  # the search finds the docs' commands
    done = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=root, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == names
