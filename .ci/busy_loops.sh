# Sourced by the busy-machine scripts: two busy loops (other work on a shared 2-core machine), stopped when
# the sourcing script exits. Each alternates bursts of work and of rest, of random lengths (BUSY_MAX_MS,
# default 3000, at most), so that the load changes while a measurement runs, as other people's jobs make it
# change; BUSY=steady keeps both busy all the time instead.
busy=()
stop_busy() {  # each loop held still, its burst or rest ended, then the loop itself
    for p in "${busy[@]}"; do
        kill -STOP "$p" 2>/dev/null
        pkill -TERM -P "$p" 2>/dev/null
        kill -TERM "$p" 2>/dev/null
        kill -CONT "$p" 2>/dev/null
    done
}
trap stop_busy EXIT
busy_loop() {  # $1: this loop's seed
    RANDOM=$1
    while :; do
        timeout "$(( RANDOM % ${BUSY_MAX_MS:-3000} + 1 ))e-3" sh -c 'while :; do :; done'
        sleep "$(( RANDOM % ${BUSY_MAX_MS:-3000} + 1 ))e-3"
    done
}
for seed in 1 2; do
    if [ "${BUSY:-bursts}" = steady ]; then
        yes > /dev/null &
    else
        busy_loop "$seed" > /dev/null 2>&1 &
    fi
    busy+=($!)
done
