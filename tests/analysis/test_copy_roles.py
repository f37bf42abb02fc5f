"""attention.py --copy: each head's copy and induction scores where a prompt writes a span twice."""

import pytest
import torch

from analysis.cli import main
from analysis.maps import SpanRepeat, find_repeat
from analysis.roles import attention_maps
from rundir.loading import load_run
from refusal_testkit import one_error_line
from run_testkit import build_run, chat_tokenizer

CONVERSATION = ('<|user|>What is 12*34?<|end|><|assistant|><|call|>calculator{"expression":"12*34"}<|end|>'
                "<|tool|>408<|end|><|assistant|>408<|end|>")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("copy") / "run", chat_tokenizer(), block_size=64)


def test_each_heads_scores_are_its_weights_at_the_answers_positions_and_the_copier_is_drawn(run_dir, tmp_path,
                                                                                              capsys):
    figure = tmp_path / "copy.png"  # the copier beside the head that copies least
    assert main(["--run", str(run_dir), "--prompt", CONVERSATION, "--copy", "408", "--out", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {figure}" in capsys.readouterr().err
    assert main(["--run", str(run_dir), "--prompt", CONVERSATION, "--copy", "408"]) == 0
    out = capsys.readouterr().out
    rows = [[float(x) for x in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| layer")]
    run = load_run(run_dir, torch.device("cpu"))
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


def test_a_repeat_is_found_never_overlapping_and_a_span_written_once_is_refused(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # attention.py's other refusals are rows of test_attention_cli.py's table
    one_error_line(main(["--run", str(run_dir), "--prompt", CONVERSATION, "--copy", "409"]), *capsys.readouterr(),
                   "--copy '409' (3 tokens) does not occur twice")
    assert list(tmp_path.iterdir()) == []
    # A repeat is found by its tokens, never overlapping.
    assert find_repeat([5, 1, 2, 7, 1, 2, 9], [1, 2]) == SpanRepeat(offset=1, period=3, length=2)
    assert find_repeat([1, 1, 1], [1, 1]) is None  # the two would share a token
    assert find_repeat([1, 1, 1, 1], [1, 1]) == SpanRepeat(0, 2, 2)
    assert find_repeat([3, 4, 5], [4]) is None
