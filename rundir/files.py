"""The names of the files in a run directory: the one list that training writes by, and that
generation, serving, the exports, evaluation and analysis read by."""

# The saved model's two files are named by its own save format (model.io), which also serves
# directories that are not runs; a run directory holds one such saved model.
from model.io import MODEL_CONFIG_FILE, WEIGHTS_FILE

RUN_CONFIG_FILE = "config.yaml"  # the resolved run configuration
TOKENIZER_FILE = "tokenizer.json"
METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.pt"  # everything --resume needs
PARENT_FILE = "parent.json"  # the run a fine-tuning run started from (train.init_from)
LOSS_CURVE_FILE = "loss_curve.png"  # drawn from METRICS_FILE at the end of training
# A LoRA run's adapter (train.lora), in PEFT's two files and under PEFT's names for them.
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
RUN_FILES = (
    RUN_CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE, STATE_FILE, MODEL_CONFIG_FILE, WEIGHTS_FILE, PARENT_FILE, LOSS_CURVE_FILE,
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE,
)
# Folders written by torch.distributed.checkpoint under train.parallel=fsdp, one per saved step;
# the trainer state names the one to resume from.
SHARDED_PREFIX = "sharded-step"
LOCK_FILE = ".run.lock"  # held by the training that writes the directory (rundir.lock)
LOCK_OWNER_FILE = ".run.lock.owner"  # that training's pid and host
LOCK_FILES = (LOCK_FILE, LOCK_OWNER_FILE)
EVAL_DIR = "eval"  # what evaluate.py writes: its task files (tasks/) and lm-eval's results (results.json)
