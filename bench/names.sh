#!/usr/bin/env bash
# bench/names.sh: sealed names (decision 0035) against plain ones, one run,
# one disk. A benchmark, not a test: prints both figures and the ratio for
# linking N names, a full listing in pages of 1000, a prefix page, a
# delimiter walk and a lookup of every name.
#
#   bash bench/names.sh            # N=10000
#   N=100000 bash bench/names.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${BENCH_DIR:-$ROOT/bench/out/names-$(date +%Y%m%d-%H%M%S)}"
cd "$ROOT"
cargo run --release -q -p dataset --example names -- "$DIR" "${N:-10000}"
rm -rf "$DIR"
