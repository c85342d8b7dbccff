#!/bin/sh
# Profiles the server during one toolgate-bench measurement (issue 19).
#
#   docs/perf/profile.sh <clients> <durability> <tool> <out-prefix>
#   e.g. docs/perf/profile.sh 64 normal case /tmp/prof-64
#
# Runs target/release/toolgate-bench for that one configuration (12 s counted), waits
# until the server is being measured, records it with `perf record --call-graph dwarf`
# for 5 s (the release build keeps no frame pointers, so `-g` alone gives broken
# stacks), and writes <out-prefix>.txt (perf script), <out-prefix>.svg (flamegraph) and
# <out-prefix>.breakdown (the per-thread and per-step shares) with flamegraph.py.
set -eu
clients=$1 durability=$2 tool=$3 out=$4
here=$(dirname "$0")
bench=${BENCH:-target/release/toolgate-bench}
$bench --tools "$tool" --durability "$durability" --clients "$clients" \
    --seconds 12 --warmup 1 --out "$out.json" >"$out.bench" 2>"$out.bench-err" &
bench_pid=$!
server=""
i=0
while [ $i -lt 600 ]; do
    if grep -q "through the gateway" "$out.bench-err" 2>/dev/null; then
        server=$(pgrep -P $bench_pid -x toolgate | head -1 || true)
        [ -n "$server" ] && break
    fi
    sleep 0.1
    i=$((i + 1))
done
[ -n "$server" ] || { echo "no server found" >&2; kill $bench_pid; exit 1; }
sleep 3
perf record -q -F 400 --call-graph dwarf,16384 -p "$server" -o "$out.data" -- sleep 5 >/dev/null 2>&1
wait $bench_pid || true
perf script -i "$out.data" --no-inline 2>/dev/null >"$out.txt"
python3 "$here/flamegraph.py" "$out.txt" --svg "$out.svg" \
    --title "toolgate $tool, $durability, $clients clients (server, perf cpu-clock)" >"$out.breakdown"
rm -f "$out.data"
cat "$out.breakdown"
grep -E "^(case|echo|dryrun)" "$out.bench" || true
