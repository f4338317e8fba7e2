#!/usr/bin/env bash
# The README's first command on a busy machine: two busy loops beside it (other work on a shared 2-core
# machine), RUNS runs in a row (default 5). Prints each run's answer line, its ties and the cautions it gave,
# then whether every run gave the same pick or a tie that holds it, and whether any run claimed a margin
# (a backend told apart from the pick) that another run's samples contradicted.
#   bash benchmarks/busy_compare.sh [compare args...]    (default: the default preset on this device)
set -uo pipefail
runs=${RUNS:-5}
python=${PYTHON:-python}
. "$(dirname "$0")/../.ci/busy_loops.sh"
dir=$(mktemp -d "${TMPDIR:-/tmp}/busy-compare.XXXXXX")
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    "$python" -m attnswitch compare "$@" --out "$dir/run$i" > "$dir/run$i.txt" 2> "$dir/run$i.err"
    rc=$?
    echo "run $i of $runs: exit $rc in $(( $(date +%s) - start )) s: $(grep -m1 '^Recommendation' "$dir/run$i.txt")"
done
"$python" - "$dir" "$runs" <<'EOF'
import json, sys
from pathlib import Path

d, runs = Path(sys.argv[1]), int(sys.argv[2])
reports = [json.loads((d / f"run{i}" / "report.json").read_text()) for i in range(1, runs + 1)
           if (d / f"run{i}" / "report.json").exists()]
picks = [r["ties"][0] if r["ties"] else None for r in reports]
ties = [set(r["ties"]) for r in reports]
# a backend told apart from (slower than) the pick in one run, yet the pick of, or tied with the pick in, another
beaten = [{n for n in r["ranking"] if n not in r["ties"] and not n.startswith("eager")} for r in reports]
contradicted = sorted({(i + 1, j + 1, n) for i, bs in enumerate(beaten) for n in bs
                       for j, r in enumerate(reports) if j != i and picks[j] == n})
common = set.intersection(*ties) if ties else set()
print(f"{len(reports)} reports; picks {picks}; ties {[sorted(t) for t in ties]}")
print(f"a backend in every run's tied set: {sorted(common) or 'none'}")
print(f"a run's pick that another run told apart as slower: {contradicted or 'none'}")
cautions = sum(any(c.startswith("The machine was busy") for c in r.get("cautions", ())) for r in reports)
print(f"runs that said the machine was busy: {cautions} of {len(reports)}")
EOF
echo "reports: $dir"
