#!/usr/bin/env bash
# The CPU suite on a busy machine: two busy loops beside it (as other work on a shared 2-core machine),
# RUNS runs in a row (default 3); reports each run's result and duration, and exits 0 only if every run
# passed. Extra arguments go to pytest (e.g. a test file or -k).
#   bash .ci/busy_suite.sh [pytest args...]        RUNS=1 bash .ci/busy_suite.sh tests/test_timing.py
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
python=${PYTHON:-python}
. .ci/busy_loops.sh
log=$(mktemp -d "${TMPDIR:-/tmp}/busy-suite.XXXXXX")
failed=0
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    "$python" -m pytest -q -p no:cacheprovider "$@" > "$log/run$i.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(tail -n 1 "$log/run$i.log")
    if [ "$rc" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit $rc)"; failed=1; fi
    echo "run $i of $runs: $verdict in ${secs} s: $summary"
    [ "$rc" -eq 0 ] || grep -E "^(FAILED|ERROR) " "$log/run$i.log" | sed 's/^/    /'
done
echo "logs: $log"
exit "$failed"
