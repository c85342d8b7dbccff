#!/usr/bin/env bash
# A cold `cargo test` (the README's test command) at one commit, timed:
#   docs/perf/coldrun.sh REV NAME
# clones this repository at REV into /tmp/NAME (an empty target directory), runs
# `cargo test` under /usr/bin/time and writes /tmp/NAME.time (start, load, CPU and wall
# time, cargo's `Finished` line and every `test result`) and /tmp/NAME.log.
set -u
rev=$1
name=$2
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "/tmp/$name"
git clone -q "$repo" "/tmp/$name" && cd "/tmp/$name" && git checkout -q "$rev" || exit 2
echo "rev $(git rev-parse --short HEAD) start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >"/tmp/$name.time"
/usr/bin/time -f "cpu user %U sys %S wall %e" -a -o "/tmp/$name.time" cargo test >"/tmp/$name.log" 2>&1
echo "exit $? end $(date -u +%H:%M:%S)" >>"/tmp/$name.time"
grep -E "Finished|test result" "/tmp/$name.log" >>"/tmp/$name.time"
