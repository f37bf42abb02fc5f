"""Config loading: YAML dialect, overrides, validation errors, and the saved round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import (
    Config,
    ConfigError,
    config_to_dict,
    load_run_config,
    save_config,
)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"

MINIMAL = """\
model:
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  n_embd: 64
  block_size: 32
train:
  max_steps: 10
  lr: 3e-3
"""


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path, overrides: list[str] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load_run_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message  # one line, for the CLI
    return message


def test_tiny_yaml_loads_with_the_documented_shape():
    cfg = load_run_config(TINY)
    assert isinstance(cfg, Config)
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_kv_head, cfg.model.n_embd) == (4, 4, 2, 128)
    assert cfg.model.block_size == 128
    assert cfg.data.vocab_size == 2048
    assert cfg.model.vocab_size == cfg.data.vocab_size  # defaulted from the data section
    assert cfg.train.batch_size == 16
    assert cfg.train.compile == "auto" and cfg.train.max_minutes == pytest.approx(9.2)
    assert cfg.train.sampling == "epoch"
    assert cfg.train.optimizer == "muon" and cfg.train.min_lr == 0.0
    assert cfg.train.lr == pytest.approx(4e-3) and isinstance(cfg.train.lr, float)
    assert cfg.eval.sample_prompt is None  # derived from the data: "ROMEO:" for the plays


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    # PyYAML alone reads `3e-3` as a string; config files must not.
    cfg = load_run_config(write(tmp_path, MINIMAL), ["train.min_lr=1e-4"])
    assert cfg.train.lr == pytest.approx(3e-3)
    assert cfg.train.min_lr == pytest.approx(1e-4)


def test_overrides_reach_nested_keys_and_parse_as_yaml(tmp_path):
    cfg = load_run_config(
        write(tmp_path, MINIMAL),
        [
            "train.max_steps=7",
            "run.out_dir=somewhere/else",
            "logging.wandb.mode=offline",
            "logging.wandb.tags=[a, b]",
            "data.hub.name=roneneldan/TinyStories",
            "train.compile=true",
            "eval.sample_top_k=null",
            "train.lr=1",  # an int is accepted where a float is expected
        ],
    )
    assert cfg.train.max_steps == 7
    assert cfg.run.out_dir == "somewhere/else"
    assert cfg.logging.wandb.mode == "offline"
    assert cfg.logging.wandb.tags == ["a", "b"]
    assert cfg.data.hub.name == "roneneldan/TinyStories"
    assert cfg.train.compile is True
    assert cfg.eval.sample_top_k is None
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


def test_out_dir_defaults_to_the_config_name(tmp_path):
    cfg = load_run_config(write(tmp_path, MINIMAL, "my_experiment.yaml"))
    assert cfg.run.out_dir == "runs/my_experiment"


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    message = error_of(write(tmp_path, MINIMAL + "  max_step: 5\n"))
    assert "'train.max_step'" in message and "'train.max_steps'" in message


def test_unknown_key_from_an_override_is_named_with_a_suggestion(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["logging.wandb.moed=offline"])
    assert "'logging.wandb.moed'" in message and "'logging.wandb.mode'" in message


def test_unknown_section_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL + "trian:\n  lr: 1.0\n"))
    assert "'trian'" in message and "'train'" in message


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.batch_size='32'", "train.batch_size"),  # a string is not an int
        ("train.max_steps=true", "train.max_steps"),  # a bool is not an int
        ("train.max_steps=2.5", "train.max_steps"),  # a float is not an int
        ("train.lr=fast", "train.lr"),
        ("run.overwrite=1", "run.overwrite"),  # an int is not a bool
        ("logging.wandb.tags=[1]", "logging.wandb.tags[0]"),
        ("logging.wandb.tags=a", "logging.wandb.tags"),
        ("train.lr=null", "train.lr"),
        ("eval=3", "eval"),
    ],
)
def test_wrong_types_name_the_key(tmp_path, override, key):
    message = error_of(write(tmp_path, MINIMAL), [override])
    assert key in message


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.lr=-1", "train.lr"),
        ("train.min_lr=1.0", "train.min_lr"),
        ("train.batch_size=0", "train.batch_size"),
        ("train.device=gpu", "train.device"),
        ("train.compile=sometimes", "train.compile"),
        ("train.optimizer=sgd", "train.optimizer"),
        ("train.muon_lr=0", "train.muon_lr"),
        ("train.value_embedding_lr=0", "train.value_embedding_lr"),
        ("train.muon_momentum=1.0", "train.muon_momentum"),
        ("train.lr_schedule=step", "train.lr_schedule"),
        ("train.lr_decay_fraction=0", "train.lr_decay_fraction"),
        ("train.threads=0", "train.threads"),
        ("train.threads=many", "train.threads"),
        ("logging.wandb.mode=loud", "logging.wandb.mode"),
        ("eval.sample_temperature=-0.5", "eval.sample_temperature"),
        ("eval.sample_temperature=.nan", "eval.sample_temperature"),
        ("eval.sample_temperature=.inf", "eval.sample_temperature"),
        ("eval.sample_top_k=0", "eval.sample_top_k"),
        ("model.n_layer=0", "n_layer"),
        ("data.source=nowhere", "data.source"),
        ("model.vocab_size=100", "model.vocab_size"),
    ],
)
def test_impossible_values_name_the_key(tmp_path, override, key):
    message = error_of(write(tmp_path, MINIMAL), [override])
    assert key in message


OPTIMIZER_KEYS = ("lr", "min_lr", "muon_lr", "value_embedding_lr", "muon_momentum", "lr_decay_fraction",
                  "weight_decay", "beta1", "beta2", "eps", "grad_clip")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e300", "-1"])
@pytest.mark.parametrize("key", OPTIMIZER_KEYS)
def test_every_optimizer_number_has_a_finite_range_checked_at_load(tmp_path, key, value):
    """The class of a step size that overflows mid-run: every such key, every kind of bad number,
    refused at load in one line naming the key and the value (--set goes through the same path)."""
    message = error_of(write(tmp_path, MINIMAL), [f"train.{key}={value}"])
    assert message.startswith(f"train.{key} must be in ") and "got " in message


def test_optimizer_numbers_at_the_edges_of_their_ranges_load(tmp_path):
    edges = ["train.lr=10", "train.min_lr=0", "train.muon_lr=10", "train.value_embedding_lr=10",
             "train.muon_momentum=0", "train.lr_decay_fraction=1", "train.weight_decay=0", "train.beta1=0",
             "train.beta2=0.999", "train.eps=1", "train.grad_clip=0"]
    config = load_run_config(write(tmp_path, MINIMAL), edges)
    assert (config.train.lr, config.train.eps, config.train.grad_clip) == (10.0, 1.0, 0.0)


@pytest.mark.parametrize("override, fix", [("train.short_window=64", "delete the key"),
                                           ("train.short_window_share=0.5", "delete the key")])
def test_a_retired_key_is_refused_in_one_line_saying_what_to_do(tmp_path, override, fix):
    message = error_of(write(tmp_path, MINIMAL), [override])
    assert message.startswith(override.split("=")[0]) and fix in message and "docs/records.md" in message


def test_a_saved_config_from_before_a_key_retired_still_loads(tmp_path):
    """A run directory's config.yaml lists every key its version knew: at the values that changed
    nothing, the retired ones are dropped, so the run can be resumed from its own config."""
    saved = write(tmp_path, MINIMAL + "  short_window: null\n  short_window_share: 0.3\n  dpo_beta: 0.1\n"
                            "  dpo_rpo_alpha: 0.0\n")
    assert load_run_config(saved).train.max_steps == 10


def test_heads_not_divisible_by_kv_heads(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["model.n_kv_head=3"])
    assert message.startswith("model:") and "n_kv_head" in message


def test_missing_model_key_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL.replace("  n_layer: 2\n", "")))
    assert "model.n_layer" in message


def test_a_budget_is_required(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["train.max_steps=null"])
    assert "train.max_steps" in message and "train.max_minutes" in message


def test_missing_file(tmp_path):
    message = error_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "not found" in message


def test_yaml_syntax_error_gives_the_file_and_line(tmp_path):
    text = "model:\n  n_layer: 2\n  n_head: 4: 5\n"
    message = error_of(write(tmp_path, text))
    assert "cfg.yaml" in message and "line 3" in message


@pytest.mark.parametrize("bad", ["train.max_steps", "=3", "max_steps=3", "train..lr=1"])
def test_malformed_override(tmp_path, bad):
    message = error_of(write(tmp_path, MINIMAL), [bad])
    assert "--set" in message


def test_override_through_a_value_is_refused(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["train.lr.x=1"])
    assert "train.lr" in message


def test_saved_config_loads_back_identical(tmp_path):
    cfg = load_run_config(TINY, ["logging.wandb.tags=[x]", "train.min_lr=1e-5"])
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    again = load_run_config(path)
    assert again == cfg
    assert config_to_dict(again)["train"]["min_lr"] == pytest.approx(1e-5)


@pytest.mark.parametrize("value", ["0", "-5", ".nan", "1e12", "5000000000", "'big'"])
def test_a_bad_data_vocab_size_is_named_as_written_not_as_the_model_key_it_fills(tmp_path, value):
    # model.vocab_size defaults to data.vocab_size; a bad one used to be reported as model.vocab_size,
    # a key the config never set.
    message = error_of(write(tmp_path, MINIMAL), [f"data.vocab_size={value}"])
    assert message.startswith("data.vocab_size ") and "model.vocab_size" not in message


def test_a_fine_tuning_config_without_its_parent_says_to_set_init_from(tmp_path):
    # configs/tiny-chat-lora.yaml has no model section: its parent run gives it. Without
    # train.init_from the message named only the missing model section.
    message = error_of(REPO / "configs" / "tiny-chat-lora.yaml", ["train.init_from=null"])
    assert message.startswith("missing required config key 'model'") and "set train.init_from" in message


# The options that lost by the records protocol and left the code, with the value that turned each off.
REMOVED = [("model.bigram_buckets", "null", "8192"), ("model.mtp_weight", "0.0", "0.3"), ("train.bigram_lr", "null", "0.4"),
           ("train.muon_iteration", "newton_schulz", "polar_express"), ("train.normuon", "false", "true"),
           ("train.cautious_weight_decay", "false", "true")]


@pytest.mark.parametrize("key, off, on", REMOVED)
def test_a_removed_option_loads_when_off_and_is_refused_in_one_line_otherwise(tmp_path, key, off, on):
    # A config.yaml saved before they left holds each of them at its off value: it still loads, as
    # the config without it.
    assert load_run_config(write(tmp_path, MINIMAL), [f"{key}={off}"]) == load_run_config(write(tmp_path, MINIMAL))
    message = error_of(write(tmp_path, MINIMAL), [f"{key}={on}"])
    assert message.startswith(f"{key} was removed") and "docs/records.md" in message
