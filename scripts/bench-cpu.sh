#!/usr/bin/env bash
# The CPU benchmark runs the README quotes; then the README table is regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
P=assets/prompts/specbench_dev.jsonl
PY=$PY scripts/bench-draft-choice.sh  # n-gram, the head (chain and tree), the hybrids
$PY -m decoding bench --prompts $P --draft ngram --k 4 --tree-nodes 16 --branch 3 --limit 2 --max-new-tokens 128 --out benchmarks/cpu-ngram-tree16-f32
$PY -m decoding bench --prompts $P --target gemma3-270m --draft smollm2-135m --k 2 --limit 2 --max-new-tokens 128 --out benchmarks/cpu-gemma-smollm2-cross-f32
$PY -m decoding bench --prompts $P --draft layers:20 --k 2 --limit 2 --max-new-tokens 128 --out benchmarks/cpu-layers20-f32
$PY -m decoding bench --prompts $P --draft ngram --k 4 --limit 2 --max-new-tokens 128 --compile --out benchmarks/cpu-ngram-f32-compiled
$PY -m decoding bench --prompts $P --draft ngram --k 4 --limit 2 --max-new-tokens 128 --dtype bfloat16 --compile --out benchmarks/cpu-ngram-bf16-compiled
$PY -m scripts.readme_bench
