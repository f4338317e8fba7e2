#!/usr/bin/env bash
# The CPU suite on a busy machine: two busy loops beside it (bursts of work and rest, as other people's jobs
# on a shared 2-core machine; see busy_loops.sh), RUNS runs in a row (default 3); reports each run's result,
# duration and the load average around it, and exits 0 only if every run passed. Arguments go to pytest
# (default: the README's `-n auto`, one worker per core); LOGS names a folder to keep the logs in.
#   bash .ci/busy_suite.sh                     RUNS=1 bash .ci/busy_suite.sh tests/test_timing.py
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
python=${PYTHON:-python}
[ "$#" -gt 0 ] || set -- -n auto
. .ci/busy_loops.sh
log=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/busy-suite.XXXXXX")}
mkdir -p "$log"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "pytest $*; busy loops: ${BUSY:-bursts}; $(nproc) CPUs"
failed=0
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    before=$(load)
    "$python" -m pytest -q -p no:cacheprovider "$@" > "$log/run$i.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(tail -n 1 "$log/run$i.log")
    if [ "$rc" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit $rc)"; failed=1; fi
    echo "run $i of $runs: $verdict in ${secs} s (load average $before before, $(load) after): $summary"
    [ "$rc" -eq 0 ] || grep -E "^(FAILED|ERROR) " "$log/run$i.log" | sed 's/^/    /'
done
echo "logs: $log"
exit "$failed"
