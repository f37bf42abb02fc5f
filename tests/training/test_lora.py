"""LoRA (train.lora): adapters on frozen weights, refused settings, the run's files, an exact resume,
and the adapter proven against PEFT on the parent's Hugging Face export."""

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import training.cli as train_cli
from chat_testkit import chat_file, pretrain
from common.config import ConfigError
from data.tokenizer import load_tokenizer
from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.checkpoint import CheckpointError, load_trainer_state, save_checkpoint
from training.config import LoraConfig, apply_overrides, config_from_dict, load_run_config, with_parent
from training.lora import LowRankDelta, adapters_disabled, add_adapters, merged_copy, parametrized
from training.recompute import checkpoint_blocks
from training.trainer import train

# Latent attention with a query latent: every attention layer name the other kind lacks.
MLA = {"attention": "mla", "n_kv_head": 2, "kv_latent_dim": 8, "q_latent_dim": 16}
GQA = {"value_embeddings": True}  # a value gate, which no adapter touches
KINDS = {"gqa": GQA, "mla": MLA}
# An untied LM head has rows of its own for the trained tokens (PEFT: one list per matrix).
PEFT_KINDS = {**KINDS, "untied": {"tie_embeddings": False}}


def _model(**options) -> GPT:
    torch.manual_seed(0)
    config = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    return GPT(GPTConfig(**{**config, **options})).eval()


def _adapted(model: GPT, lora: LoraConfig) -> GPT:
    """``model`` with adapters whose B is not zero, so that they change what it computes."""
    add_adapters(model, lora)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, _, delta in parametrized(model, LowRankDelta):
            delta.lora_B.copy_(0.05 * torch.randn(delta.lora_B.shape, generator=generator))
    return model


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_adapters_train_and_they_merge_into_the_same_model(kind):
    model = _model(**KINDS[kind])
    x = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(2))
    base = model(x)
    _adapted(model, LoraConfig(rank=4, alpha=8.0))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith(("lora_A", "lora_B")) for name in trainable)
    adapted = model(x)
    assert (adapted - base).abs().max() > 1e-3  # the adapters do change the model
    with adapters_disabled(model):
        torch.testing.assert_close(model(x), base, rtol=0, atol=0)  # the base, bit for bit
    torch.testing.assert_close(model(x), adapted, rtol=0, atol=0)  # and back on
    merged = merged_copy(model)
    assert not list(parametrized(merged, LowRankDelta)) and list(parametrized(model, LowRankDelta))
    torch.testing.assert_close(merged(x), adapted, rtol=1e-5, atol=1e-5)
    # Decoding with a cache sees them too, in latent attention's absorbed form as well (one token with a
    # cache multiplies by kv_up.weight directly, not through the layer).
    cache = model.init_cache(2)
    model(x[:, :-1], cache=cache)
    torch.testing.assert_close(model(x[:, -1:], cache=cache)[:, -1], adapted[:, -1], rtol=1e-5, atol=1e-5)


def test_adapter_dropout_drops_the_adapters_input_as_peft_does():
    model = _adapted(_model(), LoraConfig(rank=4, alpha=8.0, dropout=0.5, targets=["ffn.down"]))
    model.train()
    layer = model.blocks[0].ffn.down
    [(_, _, delta)] = [entry for entry in parametrized(model.blocks[0], LowRankDelta)]
    x = torch.randn(3, 5, layer.in_features)
    torch.manual_seed(7)
    out = layer(x)
    torch.manual_seed(7)
    dropped = F.dropout(x, 0.5, training=True)
    base = layer.parametrizations.weight.original
    expected = x @ base.T + 2.0 * (dropped @ delta.lora_A.T) @ delta.lora_B.T
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    model.eval()  # no dropout: the adapted weight alone
    torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-6)


def test_recomputed_blocks_give_the_adapters_the_same_gradients_dropout_included():
    x, y = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    grads = []
    for recompute in (False, True):
        model = _adapted(_model(**MLA), LoraConfig(rank=4, dropout=0.2)).train()
        if recompute:
            checkpoint_blocks(model)
        torch.manual_seed(5)
        model(x, y)[1].backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.requires_grad})
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-7)  # the same keys, each close


# Runs: a parent of each attention kind, chat fine-tuned with LoRA.


@pytest.fixture(scope="module")
def parents(base_raw, tmp_path_factory) -> dict[str, Path]:
    runs = {}
    for kind, options in PEFT_KINDS.items():
        raw = copy.deepcopy(base_raw)
        raw["model"].update(options)
        runs[kind] = pretrain(raw, tmp_path_factory.mktemp(f"parent-{kind}") / "run")
    return runs


def _raw(base_raw, parent: Path, out_dir: Path, **lora) -> dict:  # no model section: the parent's
    raw = copy.deepcopy(base_raw)
    del raw["model"]
    raw["train"].update(init_from=str(parent), optimizer="adamw", lora=lora)
    raw["run"]["out_dir"] = str(out_dir)
    return raw


@pytest.fixture
def lora_config(base_raw, parents, tmp_path):
    data_file = chat_file(tmp_path / "chats.jsonl")

    def make(out_dir: Path, kind: str = "gqa", lora: dict | None = None, **train):
        raw = _raw(base_raw, parents[kind], out_dir, **{"rank": 4, "alpha": 8.0, "dropout": 0.1, **(lora or {})})
        raw["data"].update(format="chat", files={"paths": [str(data_file)]})
        raw["train"].update({"max_steps": 6, "batch_size": 4, "grad_accum_steps": 2, "lr": 1e-2, **train})
        raw["eval"] = {"interval": 3, "max_batches": 2, "sample_tokens": 6, "final_max_batches": 3}
        raw["run"]["checkpoint_interval"] = 3
        return with_parent(config_from_dict(raw))

    return make


@pytest.mark.parametrize("kind, lora, train, message", [
    ("gqa", {"targets": []}, {}, r"train\.lora\.targets must have at least 1 item"),
    ("mla", {"targets": ["attn.qkv"]}, {}, r"'attn\.qkv' is not a layer of this model \(model\.attention: mla.*"
                                           r"choose from attention, feed_forward, attn\.down, attn\.q_up"),
    ("gqa", {"targets": ["ffn.up"]}, {}, r"'ffn\.up' is not a layer of this model \(model\.attention: gqa\)"),
    ("mla", {"rank": 9}, {}, r"train\.lora\.rank 9 is above the width of attn\.kv_up \(8\); use a rank of at most 8"),
    ("gqa", {"rank": 33}, {}, r"rank 33 is above the width of attn\.qkv \(32\)"),
    ("gqa", {}, {"optimizer": "muon"}, r"set train\.optimizer: adamw"),
    ("gqa", {}, {"parallel": "fsdp"}, r"train\.lora is not supported with train\.parallel: fsdp; use ddp"),
    ("gqa", {"rank": 0}, {}, r"train\.lora\.rank must be greater than or equal to 1, got 0"),
    ("gqa", {"dropout": 1.0}, {}, r"train\.lora\.dropout must be less than 1, got 1\.0"),
    ("gqa", {"alpha": 0}, {}, r"train\.lora\.alpha must be greater than 0, got 0"),
    ("gqa", {"alpha": float("inf")}, {}, r"train\.lora\.alpha must be a finite number, got inf"),
    ("gqa", {"trainable_tokens": ["<|end|>", "<|end|>"]}, {}, r"train\.lora\.trainable_tokens names a token twice"),
])
def test_a_lora_setting_that_cannot_work_is_refused_in_one_line(base_raw, parents, tmp_path, kind, lora, train,
                                                                  message):
    raw = _raw(base_raw, parents[kind], tmp_path / "run", **lora)
    raw["train"].update(train)
    with pytest.raises(ConfigError, match=message) as caught:
        with_parent(config_from_dict(raw))
    assert "\n" not in str(caught.value)
    # A rank that fits the narrowest layer is fine once it is left out.
    if kind == "mla" and lora.get("rank") == 9:
        raw["train"]["lora"]["targets"] = ["feed_forward"]
        config = with_parent(config_from_dict(raw))
        assert config.train.lora.layers(config.model) == ["ffn.gate_up", "ffn.down"]


@pytest.mark.parametrize("name", ["tiny-chat-lora", "tiny-dpo-lora"])
def test_the_lora_configs_read(parents, tmp_path, name):
    path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml"
    config = with_parent(load_run_config(path, [f"train.init_from={parents['gqa']}", f"run.out_dir={tmp_path / 'run'}"]))
    assert config.train.lora.layers(config.model) == ["attn.qkv", "attn.proj", "ffn.gate_up", "ffn.down"]


def test_lora_is_turned_on_by_one_override(base_raw, parents, tmp_path):
    # (Without a parent run it is refused: test_training_config.py's table.)
    raw = _raw(base_raw, parents["gqa"], tmp_path / "run")
    del raw["train"]["lora"]
    raw = apply_overrides(raw, ["train.lora.rank=2"])
    lora = with_parent(config_from_dict(raw)).train.lora
    assert lora == LoraConfig(rank=2) and lora.targets == ["attention", "feed_forward"]


def test_a_lora_chat_run_trains_only_the_adapters_writes_peft_files_and_resumes_exactly_with_its_own_setting(
        lora_config, parents, tmp_path, capsys):
    run = tmp_path / "run"
    result = train(lora_config(run), progress=True)
    said = capsys.readouterr().out.splitlines()
    parent = load_pretrained(parents["gqa"]).state_dict()
    state = load_trainer_state(run)
    # The frozen weights are the parent's, bit for bit; the optimizer holds state for the adapters alone.
    for name, tensor in state["model"].items():
        plain = name.replace(".parametrizations.weight.original", ".weight")
        if not name.endswith(("lora_A", "lora_B", ".rows", ".index")):
            assert torch.equal(tensor, parent[plain]), name
    adapters = [name for name in state["model"] if name.endswith(("lora_A", "lora_B"))]
    assert len(adapters) == 2 * 4 * 2  # A and B, four layers (qkv, proj, gate_up, down), two blocks
    # The chat tokens' rows of the embedding train too, one tensor read by the tied head as well.
    rows, index = (state["model"][f"tok_emb.parametrizations.weight.0.{key}"] for key in ("rows", "index"))
    tokenizer = load_tokenizer(run / "tokenizer.json")
    assert index.tolist() == [tokenizer.token_to_id(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")]
    assert torch.equal(state["model"]["lm_head.parametrizations.weight.0.rows"], rows)
    assert not torch.equal(rows, parent["tok_emb.weight"][index])  # they learned
    assert len(state["optimizer"]["state"]) == len(adapters) + 1
    trained = sum(state["model"][name].numel() for name in adapters) + rows.numel()
    size = (run / "adapter_model.safetensors").stat().st_size
    assert result.adapter.startswith(f"LoRA: {trained:,} of ") and f"({size / 1024:.1f} KiB)" in result.adapter
    assert result.adapter in train_cli.summary(result, None).splitlines()  # the summary says it
    # The run's first line counts what trains, and the LoRA line after it agrees.
    assert said[0].startswith(f"training {trained:,} of ") and "M parameters on " in said[0]
    assert any(line.startswith("LoRA rank 4") and f": {trained:,} of " in line for line in said[1:5])
    # The merged weights differ from the parent's, and are what generate.py and the exports load.
    merged = load_pretrained(run).state_dict()
    assert any(not torch.equal(merged[k], parent[k]) for k in parent)
    config = json.loads((run / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert config["trainable_token_indices"] == index.tolist()
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])

    # Stopped halfway and resumed: the run's weights exactly, and only with its own LoRA setting.
    train(lora_config(tmp_path / "resumed", max_steps=3), progress=False)
    with pytest.raises(CheckpointError, match=r"train\.lora is .*'rank': 2.* but the run was trained with .*'rank': 4"):
        train(lora_config(tmp_path / "resumed", lora={"rank": 2}), resume=True, progress=False)
    resumed = train(lora_config(tmp_path / "resumed"), resume=True, progress=False)
    assert resumed.step == result.step == 6
    torch.testing.assert_close(load_trainer_state(tmp_path / "resumed")["model"], state["model"], rtol=0, atol=1e-6)
    assert resumed.val_bpb == pytest.approx(result.val_bpb, abs=1e-6)
    assert (run / "adapter_config.json").read_text() == (tmp_path / "resumed" / "adapter_config.json").read_text()


def test_a_run_from_before_token_rows_trained_resumes_with_none(lora_config, tmp_path):
    run = tmp_path / "run"
    train(lora_config(run, lora={"trainable_tokens": []}, max_steps=3), progress=False)
    state = load_trainer_state(run)  # as such a run saved it: no trainable_tokens in its LoRA settings
    del state["fixed_settings"]["train.lora"]["trainable_tokens"]
    save_checkpoint(run, None, {k: v for k, v in state.items() if k != "format_version"})
    with pytest.raises(CheckpointError, match=r"but the run was trained with \{.*'trainable_tokens': \[\]\}"):
        train(lora_config(run), resume=True, progress=False)  # today's default trains the chat tokens' rows
    assert train(lora_config(run, lora={"trainable_tokens": []}), resume=True, progress=False).step == 6


# The proof against PEFT: the parent's export, with the run's adapter applied by PEFT, computes the run.


@pytest.mark.parametrize("kind", PEFT_KINDS)
def test_peft_applies_the_adapter_to_the_parents_export_and_computes_the_lora_run(lora_config, parents, tmp_path,
                                                                                  kind):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from exporting.hf import export_run

    run = tmp_path / "run"
    train(lora_config(run, kind=kind), progress=False)
    export_run(parents[kind], tmp_path / "parent-export")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "parent-export", trust_remote_code=True)
    with_adapter = peft.PeftModel.from_pretrained(base, run).eval()

    ours = load_pretrained(run)  # the run's merged weights, as generate.py and serve.py load them
    ids = torch.randint(0, ours.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    tokenizer = load_tokenizer(run / "tokenizer.json")
    chat_ids = [tokenizer.token_to_id(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")]
    ids[:, 3:7] = torch.tensor(chat_ids)  # the trained rows are read as input too (every logit reads the head's)
    with torch.no_grad():
        parent_rows = load_pretrained(parents[kind]).tok_emb.weight[chat_ids]
        assert (ours.tok_emb.weight[chat_ids] - parent_rows).abs().max() > 1e-3  # the rows did train
        expected = ours(ids)
        torch.testing.assert_close(with_adapter(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
        merged = with_adapter.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
        # The adapter did change the parent: the check is not trivial.
        assert (load_pretrained(parents[kind])(ids) - expected).abs().max() > 1e-3
