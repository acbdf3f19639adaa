#!/usr/bin/env bash
# bench/scrub.sh: how fast a scrub verifies a pool, against reading the same
# device files raw; and NBD sequential reads of a DEGRADED raidz against the
# same pool healthy. A benchmark, not a test: it prints figures.
#
#   bash bench/scrub.sh
#   SIZE=512M DEVICES=4 LAYOUT=raidz2 bash bench/scrub.sh
#
# Steps (one run, files on one disk):
#   1. pool `bench` of DEVICES files (LAYOUT, default raidz1 of 3), a SIZE
#      volume (compression off) filled by fio with 1 MiB sequential writes;
#   2. drop caches; `cistern pool scrub -w`: bytes verified / wall seconds
#      (verified = every copy or column read: data plus parity/copies);
#   3. drop caches; fio reads the same bytes of every device file raw
#      (O_DIRECT, 1 MiB, one job per file, all at once): the ceiling;
#   4. drop caches; fio nbd 1 MiB sequential read of the volume (healthy);
#   5. export, move one device file away, import: DEGRADED; drop caches; the
#      same read again.
# Prints scrub/raw (target >= 0.8x) and degraded/healthy.
#
# Environment:
#   SIZE=1G             volume size
#   DEVICES=3 LAYOUT=raidz1   (mirror, raidz1, raidz2, raidz3)
#   DEV_SIZE=            device file size (default: enough for SIZE)
#   RUNTIME=15          seconds cap of each fio read
#   BENCH_DIR=bench/out/scrub-<time>   files, logs, fio JSON (same disk)
#   CISTERN_BIN=target/release/cistern (built with cargo if missing)
#   DROP_CACHES=1       echo 3 > /proc/sys/vm/drop_caches before each read (needs root)
#   KEEP_FILES=0        1: keep the device files
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE="${SIZE:-1G}"
DEVICES="${DEVICES:-3}"
LAYOUT="${LAYOUT:-raidz1}"
RUNTIME="${RUNTIME:-15}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/scrub-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
DROP_CACHES="${DROP_CACHES:-1}"
KEEP_FILES="${KEEP_FILES:-0}"

for tool in fio python3; do
    command -v "$tool" >/dev/null || { echo "bench/scrub.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ ! -x "$CISTERN_BIN" ]]; then
    echo "==> building $CISTERN_BIN" >&2
    (cd "$ROOT" && cargo build --release -p cistern)
fi
mkdir -p "$BENCH_DIR/disks" "$BENCH_DIR/away"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
bytes() { python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30,'T':1<<40}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))" "$1"; }
SIZE_B=$(bytes "$SIZE")
case "$LAYOUT" in
mirror) PARITY=$((DEVICES - 1)); DATA_COLS=1 ;;
raidz1) PARITY=1; DATA_COLS=$((DEVICES - 1)) ;;
raidz2) PARITY=2; DATA_COLS=$((DEVICES - 2)) ;;
raidz3) PARITY=3; DATA_COLS=$((DEVICES - 3)) ;;
*) echo "unknown LAYOUT $LAYOUT" >&2; exit 2 ;;
esac
# Data per device plus metadata and log regions (1/16 + 1/32 of the device) and slack.
DEV_SIZE="${DEV_SIZE:-$(((SIZE_B / DATA_COLS) * 3 / 2 + (256 << 20)))}"

# ---------------------------------------------------------------- processes
PID=""
cleanup() {
    if [[ -n "$PID" ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$PID" 2>/dev/null || true
    fi
    [[ -n "$PID" ]] && wait "$PID" 2>/dev/null || true
    PID=""
    if [[ "$KEEP_FILES" != 1 ]]; then rm -rf "$BENCH_DIR/disks" "$BENCH_DIR/away" "$BENCH_DIR/state"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { python3 -c 'import time; print(f"{time.monotonic():.3f}")'; }
status_json() { "$CISTERN_BIN" pool status --json bench | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)[\"pools\"][\"bench\"]))"; }
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

NBD_PORT=$(free_port)
API_PORT=$(free_port)
while [[ "$API_PORT" == "$NBD_PORT" ]]; do API_PORT=$(free_port); done
export CISTERN_API="http://127.0.0.1:$API_PORT"
printf '[engine]\ntxg_timeout_secs = 1.0\n' >"$BENCH_DIR/cistern.toml"
start_daemon() {
    "$CISTERN_BIN" serve --state-dir "$BENCH_DIR/state" --nbd "127.0.0.1:$NBD_PORT" --api "127.0.0.1:$API_PORT" \
        --config "$BENCH_DIR/cistern.toml" >>"$BENCH_DIR/daemon.log" 2>&1 &
    PID=$!
    wait_port "$API_PORT" 60
    wait_port "$NBD_PORT" 60
}
stop_daemon() {
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
}

echo "==> bench/scrub.sh: $LAYOUT of $DEVICES x $DEV_SIZE bytes, volume $SIZE" >&2
echo "    files on $(df -h --output=source,fstype "$BENCH_DIR" | tail -1 | tr -s ' ') in $BENCH_DIR" >&2
start_daemon
DEVS=()
for i in $(seq 0 $((DEVICES - 1))); do DEVS+=("$BENCH_DIR/disks/d$i"); done
spec=("${DEVS[@]}")
[[ "$DEVICES" -gt 1 ]] && spec=("$LAYOUT" "${DEVS[@]}")
"$CISTERN_BIN" pool create -s "$DEV_SIZE" bench "${spec[@]}" >/dev/null
"$CISTERN_BIN" create -V "$SIZE" -o compression=off -o volblocksize=128K bench/vol >/dev/null
URI="nbd://127.0.0.1:$NBD_PORT/bench/vol"
echo "   filling the volume" >&2
fio --name=fill --ioengine=nbd "--uri=$URI" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
    --refill_buffers --end_fsync=1 --output-format=json --output="$BENCH_DIR/fill.json" >/dev/null
# Let the txg holding the last writes commit.
sleep 3

# ---------------------------------------------------------------- scrub
drop_caches
echo "   scrub" >&2
t0=$(now)
"$CISTERN_BIN" pool scrub -w bench
t1=$(now)
status_json >"$BENCH_DIR/scrub-status.json"
EXAMINED=$(jget 'd["scan"]["examined"]' <"$BENCH_DIR/scrub-status.json")
SCAN_SECS=$(jget 'd["scan"]["elapsed_secs"]' <"$BENCH_DIR/scrub-status.json")
ERRORS=$(jget 'd["scan"]["errors"]' <"$BENCH_DIR/scrub-status.json")
ALLOC=$(jget 'd["summary"]["allocated"]' <"$BENCH_DIR/scrub-status.json")
# Per device: the data region holding the volume (fresh pool, written once).
DATA_OFFSET=$(python3 - "${DEVS[0]}" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "rb"); h = f.read(48)
print(json.loads(f.read(struct.unpack("<I", h[12:16])[0]))["regions"]["data_offset"])
EOF
)
if [[ "$LAYOUT" == mirror ]]; then PER_DEV=$ALLOC; else PER_DEV=$((ALLOC / DATA_COLS)); fi
PER_DEV=$(((PER_DEV + (1 << 20) - 1) >> 20 << 20))
PHYS=$((PER_DEV * DEVICES))

# ---------------------------------------------------------------- raw
drop_caches
echo "   raw O_DIRECT read of the same device ranges" >&2
jobs=()
for dev in "${DEVS[@]}"; do
    jobs+=(--name="raw-$(basename "$dev")" "--filename=$dev" "--offset=$DATA_OFFSET" "--size=$PER_DEV")
done
fio --rw=read --bs=1M --direct=1 --ioengine=psync --group_reporting --output-format=json \
    --output="$BENCH_DIR/raw.json" "${jobs[@]}" >/dev/null
RAW_BPS=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]['read']; print(j['io_bytes']/(j['runtime']/1000))" "$BENCH_DIR/raw.json")

# ---------------------------------------------------------------- NBD reads
nbd_read() { # label
    drop_caches
    fio --name="$1" --ioengine=nbd "--uri=$URI" --rw=read --bs=1M --iodepth=8 --size="$SIZE" \
        --runtime="$RUNTIME" --output-format=json --output="$BENCH_DIR/$1.json" >/dev/null
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['jobs'][0]['read']['bw_bytes'])" "$BENCH_DIR/$1.json"
}
echo "   NBD sequential read, healthy" >&2
HEALTHY=$(nbd_read seqread-healthy)
echo "   NBD sequential read, DEGRADED (${DEVS[1]} removed, pool re-imported)" >&2
"$CISTERN_BIN" pool export bench
mv "${DEVS[1]}" "$BENCH_DIR/away/"
"$CISTERN_BIN" pool import -d "$BENCH_DIR/disks" bench >/dev/null
HEALTH=$(status_json | jget 'd["summary"]["health"]')
DEGRADED=$(nbd_read seqread-degraded)
stop_daemon
if grep -q "panicked at" "$BENCH_DIR/daemon.log"; then echo "warning: the daemon panicked, see $BENCH_DIR/daemon.log" >&2; fi

# ---------------------------------------------------------------- report
python3 - "$EXAMINED" "$PHYS" "$SCAN_SECS" "$t0" "$t1" "$RAW_BPS" "$HEALTHY" "$DEGRADED" "$ERRORS" "$HEALTH" "$LAYOUT" "$DEVICES" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import sys
examined, phys = int(sys.argv[1]), int(sys.argv[2])
secs, t0, t1, raw = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
healthy, degraded, errors, health = float(sys.argv[7]), float(sys.argv[8]), sys.argv[9], sys.argv[10]
M = 1e6
print(f"layout {sys.argv[11]} x{sys.argv[12]}: scrub examined {examined / M:.0f} MB (logical) = {phys / M:.0f} MB read from the devices")
print(f"  in {secs:.2f} s by the daemon's status ({t1 - t0:.2f} s wall for `pool scrub -w`), {errors} errors")
print(f"  scrub        {phys / secs / M:8.1f} MB/s device bytes ({examined / secs / M:.1f} MB/s logical)")
print(f"  raw O_DIRECT {raw / M:8.1f} MB/s (same ranges of the same files, all devices at once)")
print(f"  ratio scrub/raw      {phys / secs / raw:.2f}x   (target >= 0.8x)")
print(f"  NBD seq read healthy {healthy / M:8.1f} MB/s")
print(f"  NBD seq read {health:<8} {degraded / M:8.1f} MB/s (one device file removed)")
print(f"  ratio degraded/healthy {degraded / healthy:.2f}x")
EOF
echo "(fio JSON, status, daemon log: $BENCH_DIR)" >&2
