#!/usr/bin/env bash
# The checks for a machine with a CUDA GPU, in one go: the CUDA tests, then `probe` and `bench`
# in bfloat16 on random-weight models of real configurations (scripts/device_models.py), built
# there: such a machine cannot fetch weights, and the offline model's are too large to carry.
#
#   OUT=folder bash scripts/device-check.sh   # results in $OUT (default artifacts/device)
#
# Expects the repository root as the working folder, torch with CUDA, transformers (the pinned
# version if a wheel folder .whl/ is there), pandas, psutil and prometheus-client; .device-inputs/
# holds SmolLM2's tokenizer files (copied from the model cache by the caller).
set -uo pipefail
OUT=${OUT:-artifacts/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 SPECLENS_CACHE=${SPECLENS_CACHE:-/tmp/speclens-cache}
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
    | tee "$OUT/machine.txt"

python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_models.py::test_cuda_greedy_is_lossless \
    2>&1 | tee "$OUT/cuda-tests.txt"

python3 scripts/device_models.py /tmp/device-models .device-inputs
T=/tmp/device-models/smollm2-1.7b-random
D=/tmp/device-models/smollm2-135m-random
for model in "$D" "$T"; do
    python3 -m decoding probe --target "$model" --dtype bfloat16 > "$OUT/probe-$(basename "$model").json" \
        || echo "probe failed: $model"
done
P=assets/prompts/specbench_dev.jsonl
COMMON=(--prompts "$P" --target "$T" --dtype bfloat16 --limit 1 --max-new-tokens 64 --no-chat)
python3 -m decoding bench "${COMMON[@]}" --draft ngram --k 4 --out "$OUT/bench-ngram" | tail -12
python3 -m decoding bench "${COMMON[@]}" --draft "$D" --k 4 --out "$OUT/bench-model" | tail -12
python3 -m decoding bench "${COMMON[@]}" --draft ngram --k 4 --tree-nodes 16 --branch 3 --out "$OUT/bench-ngram-tree16" | tail -12
