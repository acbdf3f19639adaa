#!/usr/bin/env bash
# bench/arc.sh: the read side of issue 15 (ARC, prefetch), one run, same disk.
# A benchmark, not a test: it prints figures and ratios against a reference
# measured in the same run. (bench/nbd.sh keeps the write-side figures.)
#
#   RUNTIME=5 bash bench/arc.sh
#   CACHE=512M WS=256M SCAN=1280M RUNTIME=5 bash bench/arc.sh     # a quick run
#
# Tests (Cistern at the default volblocksize, COMP compression):
#   seqread-cached    1 MiB sequential reads, iodepth 8, of a FIT-sized volume
#                     that fits the ARC (read once first), vs nbdkit's file
#                     plugin on a FIT-sized file (served from the page cache).
#                     Target >= 1.0x.
#   seqread-cold      one pass of 1 MiB sequential reads of a 2 x CACHE volume
#                     after a daemon restart (empty ARC) and dropped page
#                     cache, vs fio reading the pool's device file itself with
#                     O_DIRECT (libaio, 1 MiB, iodepth 8). Target >= 1.0x.
#   cache-reuse       a WS working set read in a loop (RUNTIME seconds) while a
#                     whole one-pass SCAN of other blocks runs at the same
#                     time (to the volume's end, so no read-ahead past the
#                     scan is counted against the working set); the working set's
#                     hit rate = 1 - (bytes read from the devices - scan bytes)
#                     / working-set bytes read. Target > 90%.
# Each figure is printed with the daemon's peak/current RSS (MiB), and the
# peak RSS is set against the sum of the memory bounds `pool status --json`
# reports (memory.bounds_total: ARC max, prefetch, redb, log buffer, 2 x dirty).
# The issue's cache-reuse shape is WS=2G SCAN=10G; a scaled run keeps its
# ratios (scan = 5 x working set, ARC = 2 x working set), e.g. the quick run
# above (CACHE=512M WS=256M SCAN=1280M).
#
# Environment:
#   RUNTIME=15       seconds of the timed tests (seqread-cached, cache-reuse)
#   REPEAT=3         rounds of each test (the summary gives every round and
#                    the ratio of the medians; cold rounds restart the daemon)
#   CACHE=4G         [engine] cache_max_bytes of the daemon (2 x WS)
#   FIT=1G           the volume that fits the cache (seqread-cached)
#   WS=2G SCAN=10G   cache-reuse sizes (issue 15); scale down for a quick run
#   COMP=off         compression of the volumes (off or lz4)
#   DROP_CACHES=0    1: echo 3 > /proc/sys/vm/drop_caches before cold reads (root)
#   BENCH_DIR=bench/out/arc-<time>    CISTERN_BIN=target/release/cistern
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNTIME="${RUNTIME:-15}"
REPEAT="${REPEAT:-3}"
CACHE="${CACHE:-4G}"
FIT="${FIT:-1G}"
WS="${WS:-2G}"
SCAN="${SCAN:-10G}"
COMP="${COMP:-off}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/arc-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"

for tool in fio nbdkit python3; do
    command -v "$tool" >/dev/null || { echo "bench/arc.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
[[ -x "$CISTERN_BIN" ]] || (cd "$ROOT" && cargo build --release -p cistern)
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

bytes() { python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30,'T':1<<40}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))" "$1"; }
CACHE_B=$(bytes "$CACHE")
BIG_B=$((2 * CACHE_B))
WS_B=$(bytes "$WS")
SCAN_B=$(bytes "$SCAN")
FIT_B=$(bytes "$FIT")

PIDS=() # stopped at exit by lib.sh's stop_pids
trap stop_pids EXIT
trap 'exit 130' INT TERM

# fio_json OUT -> "MB/s io_bytes" of the first job's reads (or of job N: fio_json OUT N)
fio_json() {
    python3 - "$1" "${2:-0}" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][int(sys.argv[2])]["read"]
print(f"{j['bw_bytes'] / 1e6:.1f} {j['io_bytes']}")
EOF
}

fill() { # URI SIZE: writes incompressible-ish data over the whole target
    fio --name=fill --ioengine=nbd "--uri=$1" --rw=write --bs=1M --iodepth=8 --size="$2" \
        --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --end_fsync=1 \
        >"$BENCH_DIR/fill.log" 2>&1
}

seqread() { # NAME URI SIZE [time_based]
    local out="$BENCH_DIR/$1.json" tb=()
    [[ "${4:-}" == timed ]] && tb=(--time_based "--runtime=$RUNTIME")
    fio --name="$1" --ioengine=nbd "--uri=$2" --rw=read --bs=1M --iodepth=8 --size="$3" "${tb[@]}" \
        --output-format=json "--output=$out" >"$out.log" 2>&1
    fio_json "$out"
}

# ------------------------------------------------------------------ nbdkit
echo "==> nbdkit file plugin, $FIT (page cache)" >&2
mkdir -p "$BENCH_DIR/nbdkit"
truncate -s "$FIT" "$BENCH_DIR/nbdkit/disk.img"
port=$(free_port)
nbdkit -f -i 127.0.0.1 -p "$port" file "$BENCH_DIR/nbdkit/disk.img" >"$BENCH_DIR/nbdkit/log" 2>&1 &
PIDS+=($!)
npid=$!
wait_port "$port" 30
fill "nbd://127.0.0.1:$port/" "$FIT"
seqread warm-nbdkit "nbd://127.0.0.1:$port/" "$FIT" >/dev/null
for ((round = 1; round <= REPEAT; round++)); do
    read -r mbs _ < <(seqread seqread-cached-nbdkit-$round "nbd://127.0.0.1:$port/" "$FIT" timed)
    printf 'seqread-cached\tnbdkit-file\t%s\t%s\n' "$mbs" "$(rss "$npid")" >>"$RESULTS"
done
stop_pids
rm -f "$BENCH_DIR/nbdkit/disk.img"

# ------------------------------------------------------------------ cistern
DIR="$BENCH_DIR/cistern"
mkdir -p "$DIR/disks"
printf '[engine]\ncache_max_bytes = %s\n' "$CACHE_B" >"$DIR/cistern.toml"
nbd_port=$(free_port)
api_port=$(free_port)
while [[ "$api_port" == "$nbd_port" ]]; do api_port=$(free_port); done
export CISTERN_API="http://127.0.0.1:$api_port"
start_daemon() {
    "$CISTERN_BIN" serve --config "$DIR/cistern.toml" --state-dir "$DIR/state" --nbd "127.0.0.1:$nbd_port" \
        --api "127.0.0.1:$api_port" >>"$DIR/daemon.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    wait_port "$api_port" 60
    wait_port "$nbd_port" 60
    for _ in $(seq 100); do "$CISTERN_BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
}
arc_json() { "$CISTERN_BIN" pool status --json bench; }
stat_of() { # python expression over m (the pool's memory section) and s (pool status)
    arc_json | python3 -c "
import json, sys
s = json.load(sys.stdin)
s = s[0] if isinstance(s, list) else s
s = s.get('pools', {}).get('bench', s)
m = s['memory']
print($1)"
}
read_bytes() {
    curl -s -H "Authorization: Bearer $(cat "$DIR/state/api.token")" "$CISTERN_API/metrics" | awk '/^cistern_pool_read_bytes_total\{pool="bench"\}/ {printf "%d", $2}'
}

start_daemon
pool_size=$(python3 -c "print(max(4 << 30, ($BIG_B + $WS_B + $SCAN_B + $FIT_B) * 12 // 10 + (1 << 30)))")
"$CISTERN_BIN" pool create -s "$pool_size" bench "$DIR/disks/d0" >/dev/null
"$CISTERN_BIN" create -V "$FIT" -o "compression=$COMP" bench/fit >/dev/null
"$CISTERN_BIN" create -V "$BIG_B" -o "compression=$COMP" bench/big >/dev/null
"$CISTERN_BIN" create -V "$((WS_B + SCAN_B))" -o "compression=$COMP" bench/reuse >/dev/null
echo "==> cistern: filling volumes (fit $FIT, big $BIG_B, reuse $((WS_B + SCAN_B)) bytes)" >&2
fill "nbd://127.0.0.1:$nbd_port/bench/fit" "$FIT"
fill "nbd://127.0.0.1:$nbd_port/bench/big" "$BIG_B"
fill "nbd://127.0.0.1:$nbd_port/bench/reuse" "$((WS_B + SCAN_B))"

echo "==> seqread-cached" >&2
seqread warm-cistern "nbd://127.0.0.1:$nbd_port/bench/fit" "$FIT" >/dev/null
for ((round = 1; round <= REPEAT; round++)); do
    read -r mbs _ < <(seqread seqread-cached-cistern-$round "nbd://127.0.0.1:$nbd_port/bench/fit" "$FIT" timed)
    printf 'seqread-cached\tcistern\t%s\t%s\n' "$mbs" "$(rss "$PID")" >>"$RESULTS"
done
stat_of "m['arc']" >"$DIR/arc-after-cached.txt"
stat_of "m['bounds_total']" >"$BENCH_DIR/bounds_total"

echo "==> seqread-cold: restart (empty ARC), drop caches, one pass of 2 x CACHE" >&2
for ((round = 1; round <= REPEAT; round++)); do
stop_pids
DROP_CACHES="${DROP_CACHES:-0}" drop_caches
start_daemon
read -r mbs _ < <(seqread seqread-cold-cistern-$round "nbd://127.0.0.1:$nbd_port/bench/big" "$BIG_B")
printf 'seqread-cold\tcistern\t%s\t%s\n' "$mbs" "$(rss "$PID")" >>"$RESULTS"
stat_of "m['arc']" >"$DIR/arc-after-cold.txt"
DROP_CACHES="${DROP_CACHES:-0}" drop_caches
out="$BENCH_DIR/seqread-cold-raw-$round.json"
# The longest allocated extent of the device file (holes would read as free zeros).
raw_off=$(python3 - "$DIR/disks/d0" <<'EOF'
import os, sys
fd, best, pos = os.open(sys.argv[1], os.O_RDONLY), (0, 0), 0
end = os.fstat(fd).st_size
while pos < end:
    try:
        d = os.lseek(fd, pos, os.SEEK_DATA)
    except OSError:
        break
    h = os.lseek(fd, d, os.SEEK_HOLE)
    best = max(best, (h - d, d))
    pos = h
print(best[1] // (1 << 20) * (1 << 20))
EOF
)
fio --name=raw --filename="$DIR/disks/d0" --ioengine=libaio --direct=1 --rw=read --bs=1M --iodepth=8 \
    --size="$BIG_B" --offset="$raw_off" --output-format=json "--output=$out" >"$out.log" 2>&1
read -r mbs _ < <(fio_json "$out")
printf 'seqread-cold\traw-odirect\t%s\t-\n' "$mbs" >>"$RESULTS"
done

echo "==> cache-reuse: $WS working set in a loop while a $SCAN scan runs" >&2
for ((round = 1; round <= REPEAT; round++)); do
stop_pids
start_daemon
uri="nbd://127.0.0.1:$nbd_port/bench/reuse"
# Warm the working set (twice: read twice is what makes a block hot).
seqread warm-ws "$uri" "$WS_B" >/dev/null
seqread warm-ws "$uri" "$WS_B" >/dev/null
before=$(read_bytes)
out="$BENCH_DIR/cache-reuse-$round.json"
fio --ioengine=nbd "--uri=$uri" --bs=1M --iodepth=4 --output-format=json "--output=$out" \
    --name=ws --rw=read --offset=0 --size="$WS_B" --time_based "--runtime=$RUNTIME" \
    --name=scan --rw=read --offset="$WS_B" --size="$SCAN_B" >"$out.log" 2>&1
after=$(read_bytes)
python3 - "$out" "$before" "$after" "$(rss "$PID")" >>"$RESULTS" <<'EOF'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
ws, scan = jobs[0]["read"]["io_bytes"], jobs[1]["read"]["io_bytes"]
disk = int(sys.argv[3]) - int(sys.argv[2])
ws_disk = max(0, disk - scan)
rate = 100.0 * (1 - ws_disk / ws) if ws else 0.0
print(f"cache-reuse\tcistern\t{rate:.1f}\t{sys.argv[4]}\t{ws}\t{scan}\t{disk}")
EOF
stat_of "m['arc']" >"$DIR/arc-after-reuse-$round.txt"
done
stop_pids
unset CISTERN_API
grep -q "panicked at" "$DIR/daemon.log" && echo "warning: the daemon panicked, see $DIR/daemon.log" >&2
[[ "${KEEP_FILES:-0}" == 1 ]] || rm -rf "$DIR/disks" "$DIR/state"

# ------------------------------------------------------------------ report
python3 - "$RESULTS" "$CACHE" "$(cat "$BENCH_DIR/bounds_total" 2>/dev/null || echo 0)" "$(load_note)" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
bounds = int(sys.argv[3])
print(f"ARC bound (cache_max_bytes) {sys.argv[2]}; sum of the memory bounds {bounds >> 20} MiB; {sys.argv[4]} at the end")
def figs(test, target):
    return [float(r[2]) for r in rows if r[0] == test and r[1] == target]
print(f"{'test':<16} {'target':<14} {'MB/s per round':<30} {'median':>8} {'ratio':>7}")
for test, ref in (("seqread-cached", "nbdkit-file"), ("seqread-cold", "raw-odirect")):
    for target in (ref, "cistern"):
        f = figs(test, target)
        if not f:
            continue
        a, b = figs(test, "cistern"), figs(test, ref)
        rt = f"{statistics.median(a) / statistics.median(b):.2f}x" if target == "cistern" and a and b else ""
        print(f"{test:<16} {target:<14} {' '.join(f'{x:.0f}' for x in f):<30} {statistics.median(f):>8.0f} {rt:>7}")
reuse = [r for r in rows if r[0] == "cache-reuse"]
for r in reuse:
    ws, scan, disk = r[4:7]
    print(f"cache-reuse      working-set hit rate {r[2]}% (ws {int(ws) >> 20} MiB read, scan {int(scan) >> 20} MiB, devices {int(disk) >> 20} MiB)")
if reuse:
    print(f"cache-reuse      median hit rate {statistics.median(float(r[2]) for r in reuse):.1f}%  target > 90%")
peaks = [int(r[3].split()[0]) for r in rows if r[1] == "cistern" and r[3] != "-"]
if peaks and bounds:
    print(f"daemon peak RSS {max(peaks)} MiB = {max(peaks) / (bounds >> 20):.2f}x the bounds' sum (limit 1.25x)")
print("ratios of the medians: seqread-cached vs nbdkit (target >= 1.0x), seqread-cold vs raw O_DIRECT (target >= 1.0x)")
EOF
echo "(fio JSON, logs, ARC counters: $BENCH_DIR)" >&2
