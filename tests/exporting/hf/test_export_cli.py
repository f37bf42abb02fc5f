"""python export.py: what it writes, and the refusals that need a real export."""

import ast
import pytest

from export_testkit import BLOCK_SIZE, FINAL_BPB, ROOT, assert_one_line_error, read_json, run_export_cli


def test_folder_holds_what_transformers_and_the_hub_need(make_export):
    _, folder = make_export()
    names = {path.name for path in folder.iterdir()}
    assert names == {"config.json", "configuration_minigpt.py", "modeling_minigpt.py", "model.safetensors",
                     "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"}
    from exporting.folder import EXPORT_FILES

    assert names <= EXPORT_FILES  # what --overwrite may delete covers what the export writes
    config = read_json(folder / "config.json")
    assert config["model_type"] == "minigpt" and config["architectures"] == ["MiniGPTForCausalLM"]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_minigpt.MiniGPTForCausalLM"
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == BLOCK_SIZE
    generation = read_json(folder / "generation_config.json")
    assert generation["eos_token_id"] == [0, 4]  # <|endoftext|>, <|end|>
    # <|system|>, <|user|>, <|assistant|>, <|tool|>: never sampled (<|call|> is, for a caller offering tools)
    assert generation["suppress_tokens"] == [1, 2, 3, 5]
    # A call that names no length stays in the window; one that names max_new_tokens replaces it.
    assert generation["max_new_tokens"] == BLOCK_SIZE // 2 and "max_length" not in generation
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    assert tokenizer_config["eos_token"] == tokenizer_config["pad_token"] == "<|endoftext|>"
    from data.chat import CHAT_TEMPLATE

    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"{FINAL_BPB:.4f} bits/byte" in card and "Shakespeare" in card and "llama.cpp" in card


def test_shipped_code_imports_nothing_from_this_repository():
    for path in (ROOT / "exporting" / "hf" / "shipped").glob("*ing_minigpt.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {"." if node.level else node.module.split(".")[0]}
            else:
                continue
            assert roots <= {"torch", "transformers", "."}, (path.name, roots)


@pytest.mark.parametrize("data_format, template", [("text", False), ("chat", True), ("preference", True),
                                                    ("rl", True)])
def test_only_a_run_tuned_on_conversations_carries_the_chat_template(copy_run, tmp_path, data_format, template):
    # Every tokenizer reserves the chat tokens; a base (text) run's export must not look like a chat
    # model to the runtimes that pick chat mode when they find a template.
    import yaml

    from exporting.hf import export_run

    saved = yaml.safe_load((copy_run / "config.yaml").read_text())
    saved["data"]["format"] = data_format
    (copy_run / "config.yaml").write_text(yaml.safe_dump(saved))
    result = export_run(copy_run, tmp_path / "out")
    assert result.chat_template is template
    assert ("chat_template" in read_json(tmp_path / "out" / "tokenizer_config.json")) is template
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert ("## Chat" in card) is template and ("A base model" in card) is not template
    assert f"\n# {copy_run.name}\n" in card  # the run's name, not the export folder's
    # The chat rule for output holds either way: the tokenizer has the tokens.
    assert read_json(tmp_path / "out" / "generation_config.json")["eos_token_id"] == [0, 4]


def test_a_tokenizer_without_chat_tokens_exports_without_a_template(copy_run, tmp_path):
    from export_testkit import train_test_tokenizer
    from exporting.hf import export_run

    train_test_tokenizer(chat=False).save(str(copy_run / "tokenizer.json"))
    result = export_run(copy_run, tmp_path / "plain")
    assert not result.chat_template
    assert "chat_template" not in read_json(tmp_path / "plain" / "tokenizer_config.json")
    generation = read_json(tmp_path / "plain" / "generation_config.json")
    assert generation["eos_token_id"] == [0] and "suppress_tokens" not in generation


def test_corrupt_weights_are_refused_like_generate_py_refuses_them(copy_run, tmp_path):
    weights = copy_run / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # a flipped byte inside the tensor data
    weights.write_bytes(bytes(data))
    assert_one_line_error(run_export_cli("--run", str(copy_run), "--out", str(tmp_path / "out")), "corrupt")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_existing_output_is_refused_then_replaced_with_overwrite(make_export, tmp_path, capsys):
    from exporting.cli import main

    run_dir, _ = make_export()
    out = tmp_path / "out"
    assert main(["--run", str(run_dir), "--out", str(out)]) == 0
    (out / "model.safetensors").write_bytes(b"an earlier export's weights")
    assert main(["--run", str(run_dir), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == b"an earlier export's weights"
    assert main(["--run", str(run_dir), "--out", str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != b"an earlier export's weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, backup or lock left behind
