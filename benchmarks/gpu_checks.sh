#!/usr/bin/env bash
# The checks a CUDA GPU machine runs, in one go (CI has no GPU): configs/small.yaml trained in bf16
# with torch.compile, the compiled decode step (CUDA graphs) timed against eager on that run, and
# the tests that need CUDA. Each stage has its own time limit, so one that overruns leaves the
# others their turn; logs go to $LOGS (default runs/gpu_checks).
#
#   bash benchmarks/gpu_checks.sh [extra train.py --set overrides...]
#
# Without the hub, the data is Shakespeare at small.yaml's vocabulary (data.source=shakespeare):
# it measures speed, not what TinyStories would teach. The step count is cut to fit a short loan.
set -u -o pipefail
export PYTHONUNBUFFERED=1
LOGS=${LOGS:-runs/gpu_checks}
mkdir -p "$LOGS"
python=${PYTHON:-python3}

stage() {  # stage NAME SECONDS COMMAND...: run one stage under its limit, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout -k 15 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    echo "== stage $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$LOGS/stages.txt"
}

$python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$LOGS/stages.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv | tee -a "$LOGS/stages.txt"

stage train "${TRAIN_S:-200}" $python train.py --config configs/small.yaml --set data.source=shakespeare \
    --set train.max_steps=300 --set train.warmup_steps=50 --set eval.interval=100 \
    --set logging.wandb.mode=disabled --set run.out_dir=runs/small --set run.overwrite=true "$@"
stage decode "${DECODE_S:-150}" $python -m benchmarks.cuda_decode --run runs/small --new-tokens 256
stage tests "${TESTS_S:-150}" $python -m pytest -q -p no:cacheprovider -m "e2e or not e2e" \
    tests/inference/test_compiled_step.py tests/data/test_data_batches.py -k "cuda"
stage decode_bf16 "${DECODE_BF16_S:-100}" $python -m benchmarks.cuda_decode --run runs/small --new-tokens 256 --dtype bf16
cat "$LOGS/stages.txt"
