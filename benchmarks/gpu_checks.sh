#!/usr/bin/env bash
# The checks a CUDA GPU machine runs, in one go (CI has no GPU): configs/small.yaml trained in bf16
# with torch.compile, the compiled decode step (CUDA graphs) timed against eager on that run, and
# the tests that need CUDA. Each stage has its own time limit, so one that overruns leaves the
# others their turn; logs go to $LOGS (default runs/gpu_checks). A server's throughput with the
# compiled step against the eager one is measured on the same run, and its tests run over HTTP when
# the server's packages (fastapi, uvicorn, openai) are installed.
#
#   bash benchmarks/gpu_checks.sh [extra train.py --set overrides...]
#   STAGES="train serve tests" STEPS=40 bash benchmarks/gpu_checks.sh   # a shorter loan
#
# Without the hub, the data is Shakespeare at small.yaml's vocabulary (data.source=shakespeare):
# it measures speed, not what TinyStories would teach. The step count is cut to fit a short loan.
set -u -o pipefail
export PYTHONUNBUFFERED=1
LOGS=${LOGS:-runs/gpu_checks}
mkdir -p "$LOGS"
python=${PYTHON:-python3}
STAGES=${STAGES:-"train decode tests decode_bf16 serve"}

stage() {  # stage NAME SECONDS COMMAND...: run one stage under its limit, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    [[ " $STAGES " == *" $name "* ]] || return 0
    local start=$SECONDS
    timeout -k 15 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    echo "== stage $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$LOGS/stages.txt"
}

$python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$LOGS/stages.txt"
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv | tee -a "$LOGS/stages.txt"

stage train "${TRAIN_S:-200}" $python train.py --config configs/small.yaml --set data.source=shakespeare \
    --set train.max_steps="${STEPS:-300}" --set train.warmup_steps=$(( ${STEPS:-300} < 150 ? ${STEPS:-300} / 3 : 50 )) --set eval.interval=100 \
    --set logging.wandb.mode=disabled --set run.out_dir=runs/small --set run.overwrite=true "$@"
stage decode "${DECODE_S:-150}" $python -m benchmarks.generate_speed --device cuda --run runs/small --new-tokens 256
stage tests "${TESTS_S:-240}" $python -m pytest -q -p no:cacheprovider -m "e2e or not e2e" -rs \
    tests/inference/test_compiled_step.py tests/serving/test_compiled_server.py tests/data/test_data_batches.py -k "cuda"
stage decode_bf16 "${DECODE_BF16_S:-100}" $python -m benchmarks.generate_speed --device cuda --run runs/small --new-tokens 256 --dtype bf16
stage serve "${SERVE_S:-200}" $python -m benchmarks.serve_throughput --run runs/small --device cuda \
    --compile both --only engine --clients 1 8 32 --requests 32 --max-tokens 128 --max-batch 32
cat "$LOGS/stages.txt"
