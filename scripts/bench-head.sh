#!/usr/bin/env bash
# A trained head against the drafts it must beat, on the dev prompts (2 per category, 128 tokens),
# each run against plain decoding in the same process: the head alone at k = 3 beside the shipped
# head, `ngram+head` with it beside n-gram lookup and suffix decoding, and its 16-node tree.
#   scripts/bench-head.sh HEAD_FOLDER NAME   ->   benchmarks/cpu-NAME-*/
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD=${1:?the head folder to measure}
NAME=${2:?a name for its benchmark folders}
PY=${PY:-.venv/bin/python}
B="--prompts assets/prompts/specbench_dev.jsonl --limit 2 --max-new-tokens 128"
$PY -m decoding bench $B --draft "head:$HEAD" --k 3 --out "benchmarks/cpu-$NAME-head"
$PY -m decoding bench $B --draft head --k 3 --out "benchmarks/cpu-$NAME-shipped-head"
$PY -m decoding bench $B --draft "ngram+head:$HEAD" --k 4 --out "benchmarks/cpu-$NAME-hybrid"
$PY -m decoding bench $B --draft ngram --k 4 --out "benchmarks/cpu-$NAME-ngram"
$PY -m decoding bench $B --draft suffix --k 4 --out "benchmarks/cpu-$NAME-suffix"
$PY -m decoding bench $B --draft "head:$HEAD" --k 3 --tree-nodes 16 --branch 3 --out "benchmarks/cpu-$NAME-tree16"
