# Sourced by the busy-machine scripts: two busy loops (other work on a shared 2-core machine), stopped when
# the sourcing script exits.
busy=()
stop_busy() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_busy EXIT
for _ in 1 2; do
    yes > /dev/null &
    busy+=($!)
done
