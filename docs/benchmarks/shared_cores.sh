#!/usr/bin/env bash
# Why a second worker on the same host must have cores of its own: one configuration timed on CPU 1
# alone, beside a second worker timing on CPU 0 (disjoint cores), and beside one timing on CPU 1 too
# (shared), each through `autotune bench` (fresh processes, autotune's measurement protocol).
# Prints one row per case: median samples/s of the measured worker, ratio to alone, noisy runs.
# Usage: bash docs/benchmarks/shared_cores.sh [MODEL] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-resnet18}
BATCH=${2:-8}
OUT=$(mktemp -d)
bench() { taskset -c "$1" .venv/bin/autotune bench --model "$MODEL" --batch-size "$BATCH" --only "eager fp32" \
            --repeats 5 --measure-seconds 5 --studies-dir "$OUT/studies-$2" > "$OUT/$2.log" 2>&1; }
bench 1 alone
bench 0 neighbour-disjoint & bench 1 disjoint; wait
bench 1 neighbour-shared & bench 1 shared; wait
.venv/bin/python - "$OUT" <<'PY'
import re, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for case in ("alone", "disjoint", "shared"):
    lines = [l for l in (out / f"{case}.log").read_text().splitlines() if re.match(r"repeat \d+/\d+ eager fp32", l)]
    values = [float(re.search(r"([\d.]+) samples/s", l).group(1)) for l in lines]
    rows[case] = (statistics.median(values), min(values), max(values), sum("noisy" in l for l in lines), len(lines))
alone = rows["alone"][0]
print(f"{'case':<10} {'median':>8} {'range':>15} {'vs alone':>9} {'noisy':>6}")
for case, (median, low, high, noisy, runs) in rows.items():
    print(f"{case:<10} {median:8.2f} {low:7.2f}-{high:<7.2f} {median / alone:8.2f}x {noisy:>3}/{runs}")
PY
rm -rf "$OUT"
