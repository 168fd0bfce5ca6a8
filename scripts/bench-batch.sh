#!/usr/bin/env bash
# Batched decoding on this machine (docs/batching.md): n-gram lookup and the shipped head at k = 2 and
# 4, plain and speculative decoding of the dev prompts (3 per category) at batch sizes 1 to 16, side by
# side at each, REPEATS times (2), TOKENS new tokens (32), against the cost model's prediction from the
# same runs.
#   [REPEATS=1 TOKENS=64] scripts/bench-batch.sh   ->   benchmarks/cpu-batch-{ngram,head}-k{2,4}/
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
B="--prompts assets/prompts/specbench_dev.jsonl --limit 3 --max-new-tokens ${TOKENS:-32} --batch 1,2,4,8,16 --repeats ${REPEATS:-2}"
for draft in ngram head; do
  for k in 2 4; do
    $PY -m decoding bench $B --draft "$draft" --k "$k" --out "benchmarks/cpu-batch-$draft-k$k"
  done
done
