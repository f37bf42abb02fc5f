"""The names of the files in a run directory: written by training, read by generation."""

CONFIG_FILE = "config.yaml"  # the resolved run configuration
TOKENIZER_FILE = "tokenizer.json"
METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.pt"  # everything --resume needs
MODEL_CONFIG_FILE = "model_config.json"  # with WEIGHTS_FILE: what save_pretrained writes
WEIGHTS_FILE = "model.safetensors"
PARENT_FILE = "parent.json"  # the run a fine-tuning run started from (train.init_from)
RUN_FILES = (CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE, STATE_FILE, MODEL_CONFIG_FILE, WEIGHTS_FILE, PARENT_FILE)
LOCK_FILE = ".run.lock"  # held by the training that writes the directory (training/run_lock.py)
LOCK_OWNER_FILE = ".run.lock.owner"  # that training's pid and host
LOCK_FILES = (LOCK_FILE, LOCK_OWNER_FILE)
EVAL_DIR = "eval"  # what evaluate.py writes: its task files (tasks/) and lm-eval's results (results.json)
