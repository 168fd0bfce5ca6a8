#!/usr/bin/env bash
# The measurements that choose the offline default draft (docs/trained-head.md): n-gram, the
# trained head and the hybrid at each threshold and with the head's rounds capped, on the dev
# prompts, each run against plain decoding in the same process. Then the README's table is
# regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
P=assets/prompts/specbench_dev.jsonl
B="--prompts $P --limit 2 --max-new-tokens 128"
$PY -m decoding bench $B --draft ngram --k 4 --out benchmarks/cpu-ngram-f32
$PY -m decoding bench $B --draft head --k 3 --out benchmarks/cpu-head-f32
for m in 1 2 3; do
  $PY -m decoding bench $B --draft ngram+head@$m/0 --k 4 --out benchmarks/cpu-hybrid$m-f32
done
for h in 1 2; do  # the head drafting at most h tokens in its rounds
  $PY -m decoding bench $B --draft ngram+head@1/$h --k 4 --out benchmarks/cpu-hybrid1-cap$h-f32
done
$PY -m decoding bench $B --draft head --k 3 --tree-nodes 16 --branch 3 --out benchmarks/cpu-head-tree16-f32
$PY -m scripts.readme_bench
