#!/usr/bin/env bash
# bench/send.sh: send/receive speed between two daemons on loopback. A
# benchmark, not a test: it prints figures and the ratios issue 14 asks for.
#
#   bash bench/send.sh              # SIZE=4G
#   SIZE=1G bash bench/send.sh
#
# 1. Full send of a SIZE volume of random data (`cistern send | cistern
#    receive` into a second daemon) against the same bytes copied with
#    nbdcopy from the source snapshot's export to a volume of the second
#    daemon: ratio nbdcopy time / send time, target >= 1.0.
# 2. Incremental sends after changing 1%, 10% and 50% of the blocks: each
#    time against the full send's; the 1% stream must take <= 5% of it.
# Prints both daemons' peak RSS (VmHWM).
#
# Sends are raw (`send -w`: blocks as stored; the source and the nbdcopy
# reference both have compression off, so neither side compresses), full
# send and nbdcopy REPEAT times alternately, medians compared.
#
# Environment: SIZE=4G, REPEAT=3, RAW=1 (0: logical streams), INCR=1 (0: full sends only),
# BENCH_DIR=bench/out/send-<time>, CISTERN_BIN=target/release/cistern.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
export BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/send-$(date +%Y%m%d-%H%M%S)}"
export SIZE="${SIZE:-4G}"
for tool in nbdcopy python3; do
    command -v "$tool" >/dev/null || { echo "bench/send.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ ! -x "$CISTERN_BIN" ]]; then
    echo "==> building $CISTERN_BIN" >&2
    (cd "$ROOT" && cargo build --release -p cistern)
fi
mkdir -p "$BENCH_DIR"
# The libnbd bindings are the system python's (python3-libnbd).
exec "${PYTHON:-/usr/bin/python3}" "$ROOT/bench/send.py"
