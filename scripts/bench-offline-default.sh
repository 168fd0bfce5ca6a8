#!/usr/bin/env bash
# The offline default draft's decision (docs/trained-head.md): n-gram lookup, suffix decoding and
# `ngram+head` (its defaults) on the dev prompts, k = 4, each run against plain decoding in the
# same process, RUNS times in turns so that a busy spell of the machine falls on all three alike.
#   scripts/bench-offline-default.sh [RUNS]   ->   benchmarks/cpu-default-r{1..RUNS}-{ngram,suffix,hybrid}/
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
PY=${PY:-.venv/bin/python}
B="--prompts assets/prompts/specbench_dev.jsonl --limit 2 --max-new-tokens 128 --k 4"
for r in $(seq 1 "$RUNS"); do
  $PY -m decoding bench $B --draft ngram --out "benchmarks/cpu-default-r$r-ngram"
  $PY -m decoding bench $B --draft suffix --out "benchmarks/cpu-default-r$r-suffix"
  $PY -m decoding bench $B --draft ngram+head --out "benchmarks/cpu-default-r$r-hybrid"
done
