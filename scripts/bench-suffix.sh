#!/usr/bin/env bash
# Suffix decoding on the dev prompts (2 per category), then on a workload that repeats itself: the
# same 12 prompts twice in one process, the second pass named "<category> again". Each run is
# measured against plain decoding in the same process (docs/drafts.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
P=assets/prompts/specbench_dev.jsonl
B="--max-new-tokens 128 --draft suffix --k 4"
$PY -m decoding bench --prompts $P --limit 2 $B --out benchmarks/cpu-suffix-f32
REPEATED=$(mktemp --suffix=.jsonl)
trap 'rm -f "$REPEATED"' EXIT
$PY -c '
import json, sys
from decoding.tools.prompts import read_prompts
rows = read_prompts(__import__("pathlib").Path(sys.argv[1]), 2)
again = [r | {"category": r["category"] + " again"} for r in rows]
print("\n".join(json.dumps(r) for r in rows + again))
' $P > "$REPEATED"
$PY -m decoding bench --prompts "$REPEATED" $B --out benchmarks/cpu-suffix-repeated-f32
