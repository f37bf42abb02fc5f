"""Windows of a few tokens, every kind of positions, through generate.py and its chat."""

import json

import pytest
import torch
from tokenizers import Tokenizer

from inference.cli import main
from inference.engine import decode
from inference.sampling import SamplingSettings
from rundir.loading import load_run
from run_testkit import build_run

WINDOWS = (2, 3, 4)
POSITIONS = ("learned", "rope", "none")
PROMPT = "ROMEO: But soft, what light through yonder window breaks?"
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
def test_generate_py_continues_a_long_prompt_in_any_small_window(block, positions, runs, capsys):
    run_dir = runs[block, positions]
    code = main(["--run", str(run_dir), "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--temperature", "0",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    run = load_run(run_dir, torch.device("cpu"))
    ids = run.tokenizer.encode(PROMPT).ids
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
def test_a_chat_in_any_small_window_replies_or_says_in_one_line_why_not(block, positions, runs, capsys):
    code = main(["--run", str(runs[block, positions]), "--chat", "--prompt", "Who's there?",
                 "--max-new-tokens", str(NEW), "--temperature", "0"])
    out, err = capsys.readouterr()
    if positions == "learned":  # a turn's own tokens outgrow the window: nothing to roll, so refused
        assert (code, out) == (2, "") and err.count("\n") == 1
        assert err.startswith("error: the last message is ") and err.endswith("shorten it\n")
    else:
        assert code == 0 and "Traceback" not in err
        assert out.endswith("\n") and len(out) > 1
