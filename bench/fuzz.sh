#!/usr/bin/env bash
# bench/fuzz.sh: runs every cargo-fuzz target in fuzz/ for SECONDS each
# (libFuzzer -max_total_time) and prints, per target, the executions, the
# corpus size and whether it crashed. Decision 0027. A measurement, not a
# test: the normal suite only replays the committed corpus (crates/fuzzing).
#
#   bash bench/fuzz.sh            # 600 s a target (what issue 16 asks for)
#   bash bench/fuzz.sh 30         # a quick pass
#   TARGETS="nbd_handshake config" JOBS=2 bash bench/fuzz.sh 600
#
# Environment:
#   TARGETS="..."   targets to run (default: every [[bin]] of fuzz/Cargo.toml)
#   JOBS=1          targets run at once (each is one libFuzzer process)
#   NICE=10         nice level of the fuzzers
#   MERGE=0         1: minimize the inputs a run found into fuzz/corpus/<target>/
#                   (cargo fuzz cmin over the committed corpus plus the new inputs);
#                   keep the committed corpus small (under ~1 MB in total)
#   RSS_LIMIT_MB=2048, MAX_LEN=65536   libFuzzer -rss_limit_mb / -max_len
#   OUT=bench/out/fuzz-<time>          logs and the summary
#
# New inputs go to fuzz/work/<target>/ (not committed); crashes to
# fuzz/artifacts/<target>/. A crash becomes a regression test: fix the bug,
# then copy the input to fuzz/regressions/<target>/ (the replay test in
# crates/fuzzing/tests/corpus.rs runs every file there). cargo-fuzz is
# installed into /work/cache/cargo-tools (CISTERN_CARGO_TOOLS) when missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-600}"
JOBS="${JOBS:-1}"
NICE="${NICE:-10}"
MERGE="${MERGE:-0}"
RSS_LIMIT_MB="${RSS_LIMIT_MB:-2048}"
MAX_LEN="${MAX_LEN:-65536}"
OUT="${OUT:-$ROOT/bench/out/fuzz-$(date +%Y%m%d-%H%M%S)}"
TOOLS="${CISTERN_CARGO_TOOLS:-/work/cache/cargo-tools}"
export PATH="$TOOLS/bin:$PATH"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "bench/fuzz.sh: needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! command -v cargo-fuzz >/dev/null; then
    echo "==> cargo install cargo-fuzz into $TOOLS" >&2
    cargo install --locked --root "$TOOLS" cargo-fuzz >&2
fi
cd "$ROOT/fuzz"
if [[ -z "${TARGETS:-}" ]]; then
    TARGETS="$(cargo +nightly fuzz list)"
fi
mkdir -p "$OUT"

echo "==> building the fuzz targets (nightly, sanitizer coverage)" >&2
nice -n "$NICE" cargo +nightly fuzz build -O >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log" >&2; exit 1; }

run_one() {
    local t="$1" log="$OUT/$1.log"
    mkdir -p "work/$t" "corpus/$t" "artifacts/$t"
    local before
    before="$(find "artifacts/$t" -type f | wc -l)"
    # First corpus dir: where libFuzzer writes new inputs; the others are read.
    local dirs=("work/$t" "corpus/$t")
    [[ -d "regressions/$t" ]] && dirs+=("regressions/$t")
    set +e
    nice -n "$NICE" cargo +nightly fuzz run -O "$t" "${dirs[@]}" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_LIMIT_MB" -max_len="$MAX_LEN" \
        -print_final_stats=1 -close_fd_mask=1 >"$log" 2>&1
    local rc=$?
    set -e
    local runs after crash=no
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
    [[ -n "$runs" ]] || runs="$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' | tail -1)"
    after="$(find "artifacts/$t" -type f | wc -l)"
    if ((rc != 0)) || ((after > before)); then crash=yes; fi
    local cov corpus
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)"
    corpus="$(find "work/$t" "corpus/$t" -type f | wc -l)"
    if [[ "$MERGE" == 1 && "$crash" == no ]]; then
        nice -n "$NICE" cargo +nightly fuzz cmin -O "$t" "corpus/$t" "work/$t" >>"$log" 2>&1 || true
    fi
    printf '%-18s %6ss %12s %8s %8s  %s\n' "$t" "$SECONDS_EACH" "${runs:-?}" "${cov:-?}" "$corpus" \
        "$([[ $crash == yes ]] && echo "CRASH (rc $rc, see $log and fuzz/artifacts/$t/)" || echo "no crash")" \
        >>"$OUT/summary.txt"
}

: >"$OUT/summary.txt"
running=0
for t in $TARGETS; do
    run_one "$t" &
    running=$((running + 1))
    if ((running >= JOBS)); then
        wait -n || true
        running=$((running - 1))
    fi
done
wait || true

printf '%-18s %7s %12s %8s %8s  %s\n' target time executions cov corpus result
sort "$OUT/summary.txt"
echo "logs: $OUT"
! grep -q CRASH "$OUT/summary.txt"
