#!/bin/sh
# Counts the instructions the server runs per gated call (issue 19), under callgrind.
#
#   docs/perf/instructions.sh <toolgate binary> [calls] [durability]
#   e.g. docs/perf/instructions.sh target/release/toolgate 1000 normal
#
# Starts `toolgate serve` on the demo policy under `valgrind --tool=callgrind`, opens a
# run, makes 50 warm-up calls of `case_lookup`, zeroes the counters, makes <calls> more
# (one client, one keep-alive connection, one call at a time), dumps the counters and
# prints the user-space instructions of the server (all threads) per call.
#
# Unlike CPU time on a shared virtual machine, the count is the same from run to run
# for the same binary and inputs (within 0.2% here), so two builds can be compared
# with a single run each. It does not count the kernel's work (system calls, network,
# file I/O), and valgrind hides some CPU features (SHA-NI: SHA-256 runs its portable
# code), so it complements `toolgate-bench`, it does not replace it.
set -eu
bin=$1 calls=${2:-1000} durability=${3:-normal}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" \
    "$bin" serve --listen "127.0.0.1:$port" --data-dir "$work/var" --durability "$durability" \
    >"$work/stdout" 2>"$work/stderr" &
vg=$!
i=0
until grep -q listening "$work/stdout" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 600 ] || { echo "the server did not start" >&2; kill $vg; exit 1; }
    sleep 0.2
done
python3 "$here/calls.py" "$port" 50 --open-run >/dev/null
callgrind_control -z $vg >/dev/null 2>&1
python3 "$here/calls.py" "$port" "$calls"
callgrind_control -d $vg >/dev/null 2>&1
kill -INT $vg
wait $vg || true
total=$(grep -h '^summary:' "$work"/out.*.1 | awk '{print $2}')
echo "instructions: $total for $calls calls, $((total / calls)) per call"
rm -rf "$work"
