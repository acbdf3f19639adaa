#!/usr/bin/env bash
# bench/snapshots.sh: snapshot costs, one run, one disk. A benchmark, not a
# test: it prints figures (and the ratios the snapshots issue asks for).
#
#   bash bench/snapshots.sh
#   RUNTIME=5 SNAPSHOTS=20 BIG=4G bash bench/snapshots.sh
#
# 1. Snapshot creation latency (`cistern snapshot`, median of REPS) on a full
#    1 GiB volume and on a full BIG (16 GiB) volume: should be the same.
# 2. 4 KiB random writes + FLUSH (fio nbd engine, 8 connections) on the
#    1 GiB volume with 0 snapshots, then with SNAPSHOTS (100) snapshots each
#    holding 4 MiB of overwritten data: ratio should be >= 0.9.
# 3. Destroy time of a snapshot against the data only it holds (64M..1G).
#
# Environment: RUNTIME=15 (fio seconds), REPS=10, SNAPSHOTS=100, BIG=16G,
# BENCH_DIR=bench/out/snapshots-<time>, CISTERN_BIN=target/release/cistern.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
export BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/snapshots-$(date +%Y%m%d-%H%M%S)}"
for tool in fio nbdcopy nbdkit python3; do
    command -v "$tool" >/dev/null || { echo "bench/snapshots.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ ! -x "$CISTERN_BIN" ]]; then
    echo "==> building $CISTERN_BIN" >&2
    (cd "$ROOT" && cargo build --release -p cistern)
fi
mkdir -p "$BENCH_DIR"
exec python3 "$ROOT/bench/snapshots.py"
