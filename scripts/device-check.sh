#!/usr/bin/env bash
# The checks for a machine with a CUDA GPU, in one go, within 8 minutes: the CUDA tests, then `probe`
# and `bench` in bfloat16 on random-weight models of real configurations (scripts/device_models.py),
# built there: such a machine cannot fetch weights, and the offline model's are too large to carry.
# Each step with decode steps replayed from CUDA graphs (the default on a GPU) and without
# (--no-graphs); then scripts/device_report.py writes the README of the results (docs/gpu.md).
#
#   OUT=folder bash scripts/device-check.sh   # results in $OUT (default artifacts/device);
#                                             # it becomes benchmarks/gpu-<card>-graphs/ as it is
#
# Expects the repository root as the working folder, torch with CUDA, transformers (the pinned
# version if a wheel folder .whl/ is there), pandas, psutil and prometheus-client; .device-inputs/
# holds SmolLM2's tokenizer files (copied from the model cache by the caller).
#
# Kept within BUDGET_S (450 s) by construction: every step runs under `timeout` with what is left
# of the budget, the figures the issue asks for first, the older benchmarks last. A step cut
# short says so in $OUT/steps.txt and the rest still run.
set -uo pipefail
OUT=${OUT:-artifacts/device}
BUDGET_S=${BUDGET_S:-450}
mkdir -p "$OUT/no-graphs"
: > "$OUT/steps.txt"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 SPECLENS_CACHE=${SPECLENS_CACHE:-/tmp/speclens-cache}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi

# Run "$@" with what is left of the budget (at least 5 s); record how long it took and how it ended.
step() {
    local name=$1 left=$((BUDGET_S - SECONDS)) start=$SECONDS
    shift
    if ((left < 5)); then
        echo "$name: skipped, budget spent" | tee -a "$OUT/steps.txt"
        return
    fi
    timeout "$left" "$@"
    local rc=$?
    echo "$name: rc $rc, $((SECONDS - start)) s$( ((rc == 124)) && echo ', cut at the budget')" | tee -a "$OUT/steps.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
    | tee "$OUT/machine.txt"

step cuda-tests sh -c "python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    tests/test_models.py::test_cuda_greedy_is_lossless 2>&1 | tee '$OUT/cuda-tests.txt'"

step models python3 scripts/device_models.py /tmp/device-models .device-inputs
T=/tmp/device-models/smollm2-1.7b-random
D=/tmp/device-models/smollm2-135m-random

# Three short prompts (maths, QA, translation), 64 new tokens: the benchmarks stay within the budget.
P=/tmp/device-prompts.jsonl
for category in math_reasoning qa translation; do
    grep -m1 "\"$category\"" assets/prompts/specbench_dev.jsonl
done > "$P"
BENCH="python3 -m decoding bench --prompts $P --target $T --dtype bfloat16 --limit 1 --max-new-tokens 64 --no-chat"

# The issue's figures, with graphs and then without.
for mode in graphs no-graphs; do
    dir=$OUT flag=
    [ "$mode" = no-graphs ] && dir=$OUT/no-graphs flag=--no-graphs
    for model in "$D" "$T"; do
        step "probe-$(basename "$model")-$mode" sh -c \
            "python3 -m decoding probe --target $model --dtype bfloat16 $flag > $dir/probe-$(basename "$model").json"
    done
    step "bench-model-$mode" sh -c "$BENCH --draft $D --k 4 $flag --out $dir/bench-model | tail -6"
done
# Many sequences at once over static slots, one replayed graph a pass (18 prompts, 32 tokens).
step bench-batch sh -c "python3 -m decoding bench --prompts assets/prompts/specbench_dev.jsonl --limit 3 \
    --target $D --dtype bfloat16 --max-new-tokens 32 --no-chat --batch 1,4,16 --draft ngram --k 2 \
    --out $OUT/bench-batch | tail -4"
# What the check ran before: n-gram chains and trees, now with graphs.
step bench-ngram sh -c "$BENCH --draft ngram --k 4 --out $OUT/bench-ngram | tail -6"
step bench-ngram-tree16 sh -c "$BENCH --draft ngram --k 4 --tree-nodes 16 --branch 3 --out $OUT/bench-ngram-tree16 | tail -6"

python3 scripts/device_report.py "$OUT"
echo "total: $SECONDS s" | tee -a "$OUT/steps.txt"
