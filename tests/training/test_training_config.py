"""Config loading: YAML dialect, overrides, validation errors, and the saved round trip."""

from pathlib import Path

import pytest

from training.config import Config, ConfigError, config_to_dict, load_run_config, save_config

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
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_kv_head, cfg.model.n_embd, cfg.model.block_size) == (
        4, 4, 2, 128, 128)
    assert cfg.model.vocab_size == cfg.data.vocab_size == 2048  # defaulted from the data section
    assert (cfg.train.batch_size, cfg.train.compile, cfg.train.sampling, cfg.train.optimizer, cfg.train.min_lr) == (
        16, "auto", "epoch", "muon", 0.0)
    assert cfg.train.max_minutes == pytest.approx(9.2)
    assert cfg.train.lr == pytest.approx(4e-3) and isinstance(cfg.train.lr, float)
    assert cfg.eval.sample_prompt is None  # derived from the data: "ROMEO:" for the plays


def test_exponent_floats_without_a_dot_are_numbers_and_out_dir_defaults_to_the_config_name(tmp_path):
    # PyYAML alone reads `3e-3` as a string; config files must not.
    cfg = load_run_config(write(tmp_path, MINIMAL, "my_experiment.yaml"), ["train.min_lr=1e-4"])
    assert (cfg.train.lr, cfg.train.min_lr) == (pytest.approx(3e-3), pytest.approx(1e-4))
    assert cfg.run.out_dir == "runs/my_experiment"


def test_overrides_reach_nested_keys_and_parse_as_yaml(tmp_path):
    cfg = load_run_config(write(tmp_path, MINIMAL), [
        "train.max_steps=7", "run.out_dir=somewhere/else", "logging.wandb.mode=offline", "logging.wandb.tags=[a, b]",
        "data.hub.name=roneneldan/TinyStories", "train.compile=true", "eval.sample_top_k=null",
        "train.lr=1"])  # an int is accepted where a float is expected
    assert (cfg.train.max_steps, cfg.run.out_dir, cfg.logging.wandb.mode, cfg.logging.wandb.tags) == (
        7, "somewhere/else", "offline", ["a", "b"])
    assert cfg.data.hub.name == "roneneldan/TinyStories" and cfg.train.compile is True and cfg.eval.sample_top_k is None
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


# Each section's refusals: an override, and the part of the one-line message it must give. A bound
# is refused one step past it (test_optimizer_numbers_at_the_edges_of_their_ranges_load: at it).
TRAIN_REFUSALS = [
    ("train.max_step=5", "unknown config key 'train.max_step'; did you mean 'train.max_steps'?"),
    ("train.batch_size='32'", "train.batch_size must be a valid integer, got '32'"),  # a string is not an int
    ("train.max_steps=true", "train.max_steps must be a valid integer, got true"),  # nor is a bool
    ("train.max_steps=2.5", "train.max_steps must be a valid integer, got 2.5"),  # nor a float
    ("train.lr=fast", "train.lr must be a valid number, got 'fast'"),
    ("train.lr=null", "train.lr must be a valid number, got null"),
    ("train.max_steps=null", "no budget set: give train.max_steps, train.max_minutes or train.max_tokens"),
    ("train.max_steps=0", "train.max_steps must be greater than or equal to 1, got 0"),
    ("train.max_minutes=0", "train.max_minutes must be greater than 0, got 0"),
    ("train.max_minutes=.inf", "train.max_minutes must be a finite number, got inf"),
    ("train.max_tokens=0", "train.max_tokens must be greater than or equal to 1, got 0"),
    ("train.batch_size=0", "train.batch_size must be greater than or equal to 1, got 0"),
    ("train.grad_accum_steps=0", "train.grad_accum_steps must be greater than or equal to 1, got 0"),
    ("train.sampling=shuffled", "train.sampling must be 'random' or 'epoch', got 'shuffled'"),
    ("train.optimizer=sgd", "train.optimizer must be 'adamw' or 'muon', got 'sgd'"),
    ("train.lr=-1", "train.lr must be greater than 0, got -1"),
    ("train.lr=10.5", "train.lr must be less than or equal to 10, got 10.5"),
    ("train.lr=.nan", "train.lr must be less than or equal to 10, got nan"),
    ("train.min_lr=0.0031", "train.min_lr must be at most train.lr (0.003), got 0.0031"),
    ("train.min_lr=-1e-9", "train.min_lr must be greater than or equal to 0"),
    ("train.lr_schedule=step", "train.lr_schedule must be 'cosine' or 'wsd', got 'step'"),
    ("train.lr_decay_fraction=0", "train.lr_decay_fraction must be greater than 0, got 0"),
    ("train.lr_decay_fraction=1.01", "train.lr_decay_fraction must be less than or equal to 1"),
    ("train.muon_lr=0", "train.muon_lr must be greater than 0, got 0"),
    ("train.value_embedding_lr=0", "train.value_embedding_lr must be greater than 0, got 0"),
    ("train.value_embedding_lr=11", "train.value_embedding_lr must be less than or equal to 10"),
    ("train.muon_momentum=1.0", "train.muon_momentum must be less than 1, got 1.0"),
    ("train.warmup_steps=-1", "train.warmup_steps must be greater than or equal to 0, got -1"),
    ("train.weight_decay=10.5", "train.weight_decay must be less than or equal to 10"),
    ("train.weight_decay=-1", "train.weight_decay must be greater than or equal to 0"),
    ("train.beta1=1", "train.beta1 must be less than 1, got 1"),
    ("train.beta2=-.inf", "train.beta2 must be greater than or equal to 0, got -inf"),
    ("train.eps=0", "train.eps must be greater than 0, got 0"),
    ("train.eps=1.5", "train.eps must be less than or equal to 1"),
    ("train.grad_clip=1e300", "train.grad_clip must be less than or equal to 1000000"),
    ("train.grad_clip=-1", "train.grad_clip must be greater than or equal to 0"),
    ("train.device=gpu", "train.device must be auto, cpu, cuda, cuda:N or mps (got 'gpu')"),
    ("train.threads=0", "train.threads must be 'auto' or greater than 0, got 0"),
    ("train.threads=many", "train.threads must be 'auto' or a valid integer, got 'many'"),
    ("train.precision=fp16", "train.precision must be 'auto', 'bf16' or 'fp32', got 'fp16'"),
    ("train.compile=sometimes", "train.compile must be a valid boolean or 'auto', got 'sometimes'"),
    ("train.peak_flops=0", "train.peak_flops must be 'auto' or greater than 0, got 0"),
    ("train.peak_flops=.inf", "train.peak_flops must be 'auto' or a finite number, got inf"),
    ("train.parallel=zero", "train.parallel must be 'ddp' or 'fsdp', got 'zero'"),
    ("train.lr.x=1", "--set train.lr.x: 'train.lr' is a value, not a section"),
    # Keys that left, at any value but the one that changed nothing: where each went.
    ("train.short_window=64", "train.short_window (short windows first) was taken out: it tied by the records "
                              "protocol (docs/records.md); delete the key"),
    ("train.short_window_share=0.5", "train.short_window_share went with train.short_window, which tied by the "
                                     "records protocol (docs/records.md); delete the key"),
    ("train.dpo_beta=0.2", "train.dpo_beta is now dpo.beta, in a dpo: section beside train:"),
    ("train.bigram_lr=0.4", "train.bigram_lr was removed: it lost by the records protocol (docs/records.md"),
    ("train.muon_iteration=polar_express", "train.muon_iteration was removed: it lost by the records protocol"),
    ("train.normuon=true", "train.normuon was removed: NorMuon tied by the records protocol"),
    ("train.cautious_weight_decay=true", "train.cautious_weight_decay was removed: it lost by the records"),
    ("train.muon_momentum_warmup=300", "train.muon_momentum_warmup was removed: it lost by the records protocol"),
]
EVAL_REFUSALS = [
    ("eval.intervals=5", "unknown config key 'eval.intervals'; did you mean 'eval.interval'?"),
    ("eval.interval=-1", "eval.interval must be greater than or equal to 0, got -1"),
    ("eval.max_batches=0", "eval.max_batches must be greater than or equal to 1, got 0"),
    ("eval.batch_size=0", "eval.batch_size must be greater than or equal to 1, got 0"),
    ("eval.final_max_batches=0", "eval.final_max_batches must be greater than or equal to 1, got 0"),
    ("eval.sample_prompt=3", "eval.sample_prompt must be a valid string, got 3"),
    ("eval.sample_tokens=-1", "eval.sample_tokens must be greater than or equal to 0, got -1"),
    ("eval.sample_temperature=-0.5", "eval.sample_temperature must be greater than or equal to 0, got -0.5"),
    ("eval.sample_temperature=.nan", "eval.sample_temperature must be a finite number, got nan"),
    ("eval.sample_temperature=.inf", "eval.sample_temperature must be a finite number, got inf"),
    ("eval.sample_top_k=0", "eval.sample_top_k must be greater than or equal to 1, got 0"),
    ("eval.attention_stats=1", "eval.attention_stats must be a valid boolean, got 1"),
    ("eval.attention_image_interval=-1", "eval.attention_image_interval must be greater than or equal to 0"),
]
RUN_AND_LOGGING_REFUSALS = [
    ("run.overwrite=1", "run.overwrite must be a valid boolean, got 1"),  # an int is not a bool
    ("run.out_dir=' '", "run.out_dir must match pattern"),
    ("run.checkpoint_interval=-1", "run.checkpoint_interval must be greater than or equal to 0, got -1"),
    ("logging.interval=0", "logging.interval must be greater than or equal to 1, got 0"),
    ("logging.wandb.mode=loud", "logging.wandb.mode must be 'auto', 'online', 'offline' or 'disabled', got 'loud'"),
    ("logging.wandb.moed=offline", "unknown config key 'logging.wandb.moed'; did you mean 'logging.wandb.mode'?"),
    ("logging.wandb.tags=[1]", "logging.wandb.tags.0 must be a valid string, got 1"),
    ("logging.wandb.tags=a", "logging.wandb.tags must be a valid list, got 'a'"),
    ("logging.wandb=3", "logging.wandb must be a valid dictionary or instance of WandbConfig, got 3"),
]
# Across sections: the config's top level, and what a section asks of another.
CONFIG_REFUSALS = [
    ("trian.lr=1.0", "unknown config section 'trian'; did you mean 'train'?"),
    ("model.vocab_size=100", "model.vocab_size (100) is smaller than data.vocab_size (2048); remove model.vocab_size"),
    ("model.n_layer=0", "model.n_layer must be greater than or equal to 1, got 0"),
    ("model.n_kv_head=3", "model: n_head (4) must be divisible by n_kv_head (3)"),
    ("data.source=nowhere", "data.source must be 'shakespeare', 'hub', 'files', 'synthetic', 'quotes' or 'calculator'"),
    ("dpo.beta=0.2", "the dpo section is for data.format: preference (this run's is text)"),
    ("rl.group_size=4", "the rl section is for data.format: rl (this run's is text)"),
    ("data.format=rl", "data.format: rl needs an rl section (rl: {} takes every default)"),
    ("train.lora.rank=4", "train.lora adapts a trained run's weights: set train.init_from to its directory"),
]


@pytest.mark.parametrize("override, expected",
                         TRAIN_REFUSALS + EVAL_REFUSALS + RUN_AND_LOGGING_REFUSALS + CONFIG_REFUSALS)
def test_refusals(tmp_path, override, expected):
    """One table per section; each row is one override and the part of the one-line error it expects."""
    assert expected in error_of(write(tmp_path, MINIMAL), [override])


def test_optimizer_numbers_at_the_edges_of_their_ranges_load(tmp_path):
    edges = ["train.lr=10", "train.min_lr=0", "train.muon_lr=10", "train.value_embedding_lr=10",
             "train.muon_momentum=0", "train.lr_decay_fraction=1", "train.weight_decay=0", "train.beta1=0",
             "train.beta2=0.999", "train.eps=1", "train.grad_clip=0", "train.weight_decay=10", "train.grad_clip=1e6"]
    config = load_run_config(write(tmp_path, MINIMAL), edges)
    assert (config.train.lr, config.train.eps, config.train.grad_clip, config.train.weight_decay) == (10.0, 1.0, 1e6, 10)


def test_a_saved_config_from_before_a_key_retired_still_loads(tmp_path):
    """A run directory's config.yaml lists every key its version knew: at the values that changed
    nothing, the retired ones are dropped, so the run can be resumed from its own config."""
    retired = ("  short_window: null\n  short_window_share: 0.3\n  dpo_beta: 0.1\n  dpo_rpo_alpha: 0.0\n"
               "  bigram_lr: null\n  muon_iteration: newton_schulz\n  normuon: false\n  cautious_weight_decay: false\n"
               "  muon_momentum_warmup: 0\n")
    old = load_run_config(write(tmp_path, MINIMAL + retired))
    assert old == load_run_config(write(tmp_path, MINIMAL))


def test_missing_model_key_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL.replace("  n_layer: 2\n", "")))
    assert message == "missing required config key 'model.n_layer'"


@pytest.mark.parametrize("text, overrides, fragments", [
    (None, [], ("nope.yaml", "not found")),
    ("model:\n  n_layer: 2\n  n_head: 4: 5\n", [], ("cfg.yaml", "line 3")),  # the file and line of a YAML error
    *[(MINIMAL, [bad], ("--set",)) for bad in ["train.max_steps", "=3", "max_steps=3", "train..lr=1", "eval=3"]],
])
def test_a_missing_file_bad_yaml_or_a_malformed_override_is_named(tmp_path, text, overrides, fragments):
    message = error_of(write(tmp_path, text) if text is not None else tmp_path / "nope.yaml", overrides)
    assert all(fragment in message for fragment in fragments), message


def test_saved_config_loads_back_identical(tmp_path):
    cfg = load_run_config(TINY, ["logging.wandb.tags=[x]", "train.min_lr=1e-5"])
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    again = load_run_config(path)
    assert again == cfg and config_to_dict(again)["train"]["min_lr"] == pytest.approx(1e-5)


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
