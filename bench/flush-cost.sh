#!/usr/bin/env bash
# bench/flush-cost.sh: what a 4 KiB random write + FLUSH costs the server, in
# load-independent figures (issue 15's sync-write target; decisions 0072,
# 0073, 0075). A benchmark, not a test.
#
#   bash bench/flush-cost.sh BIN [COMP] [RUNTIME]
#   (interleave binaries: for b in A B A B; do bash bench/flush-cost.sh $b off 10; done)
#
# A fresh daemon (defaults), a 4 GiB file pool, a 1 GiB volume (COMP: off or
# lz4, volblocksize 16K); 2 s of warm-up, then RUNTIME (10, at least 5)
# seconds of fio (nbd engine, 8 jobs, 4 KiB random writes at iodepth 1, FLUSH
# after each, half-compressible data). Figures are taken inside the run, from
# 2 s in to 1 s before its end (the NBD connection threads exit when fio
# disconnects); pairs in that window = fio's mean IOPS x its length.
# Two lines:
#   IOPS (moves with the load), the daemon's CPU µs, voluntary and involuntary
#   context switches and minor page faults per write+FLUSH pair (/proc/PID/stat,
#   task/*/status), log syncs per FLUSH (pool iostat), kworker CPU µs per pair
#   (all kworkers: the loop back and the disk's flushes), the daemon's peak
#   RSS, the load average;
#   fio's mean WRITE and FLUSH latency, the FLUSH's p99 and p99.9, and the
#   pair's wall time per job;
#   the daemon's CPU µs per pair by thread name ("gone": threads that exited
#   in the window, e.g. the txg's encoder threads), txg commits and the mean
#   commit time (metrics).
# PERF_OUT=FILE also runs `perf record ${PERF_ARGS:--g}` of the daemon over the
# measured window (e.g. PERF_ARGS="-e sched:sched_switch -e sched:sched_wakeup -g"
# to see who wakes whom).
# Needs fio (nbd engine), python3 (and perf for PERF_OUT). Only 127.0.0.1.
set -u
BIN="$1"; COMP="${2:-off}"; RT="${3:-10}"
((RT >= 5)) || { echo "flush-cost.sh: RUNTIME must be at least 5 seconds" >&2; exit 2; }
D=$(mktemp -d /tmp/ffc.XXXX)
mkdir -p "$D/disks"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
NP=$(port); AP=$(port)
"$BIN" serve --state-dir "$D/state" --nbd "127.0.0.1:$NP" --api "127.0.0.1:$AP" >"$D/daemon.log" 2>&1 &
PID=$!
export CISTERN_API="http://127.0.0.1:$AP"
for _ in $(seq 300); do "$BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
CISTERN_TOKEN=$(cat "$D/state/api.token")
export CISTERN_TOKEN
# PREALLOC=1: the pool file written full of zeros first (not sparse), so no
# write allocates ext4 extents and no log sync commits ext4 metadata (0079).
if [[ "${PREALLOC:-0}" == 1 ]]; then
  dd if=/dev/zero of="$D/disks/d0" bs=4M count=1024 oflag=direct status=none
fi
"$BIN" pool create -s 4G bench "$D/disks/d0" >/dev/null
"$BIN" create -V 1G -o "compression=$COMP" -o volblocksize=16K bench/vol >/dev/null
# log syncs, FLUSHes (pool iostat), txg commits and commit seconds (metrics)
counters() { python3 - <<'PY'
import json, os, re, urllib.request
def get(path):
    req = urllib.request.Request(os.environ["CISTERN_API"] + path, headers={"Authorization": "Bearer " + os.environ["CISTERN_TOKEN"]})
    return urllib.request.urlopen(req, timeout=30).read().decode()
s = json.loads(get("/v1/pools/bench/iostat"))
m = get("/metrics")
metric = lambda name: re.search(r'^' + name + r'\{pool="bench"\} (\S+)$', m, re.M).group(1)
print(s["log_syncs"], s["log_flushes"], metric("cistern_pool_txg_commits_total"), metric("cistern_pool_txg_commit_seconds_total"))
PY
}
# name=ticks per live thread name; then the daemon's ticks, minor faults,
# voluntary and involuntary switches over its threads, all kworkers' ticks
snap() {
  for f in /proc/$PID/task/*/stat; do
    sed -E 's/^[0-9]+ \((.*)\) . (.*)$/\1 \2/' "$f" 2>/dev/null | awk '{gsub(/-.*/,"",$1); print $1, $12+$13}'
  done | awk '{s[$1]+=$2} END{for (k in s) printf "%s=%d ", k, s[k]}'
  local v=0 n=0 a b
  for f in /proc/$PID/task/*/status; do
    read -r a b < <(awk '/^voluntary_ctxt/{v=$2} /^nonvoluntary_ctxt/{n=$2} END{print v, n}' "$f" 2>/dev/null)
    v=$((v+${a:-0})); n=$((n+${b:-0}))
  done
  local k; k=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$2 ~ /^\(kworker/ {s+=$14+$15} END{print s+0}')
  awk -v v="$v" -v n="$n" -v k="$k" '{printf "total=%d minflt=%d vol=%d invol=%d kworker=%d\n", $14+$15, $10, v, n, k}' /proc/$PID/stat
}
fio --name=w --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --time_based --runtime=2 --group_reporting >/dev/null 2>&1
fio --name=m --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --time_based --runtime="$RT" --group_reporting --output-format=json --output="$D/fio.json" >/dev/null 2>&1 &
FIO=$!
sleep 2
C0=$(counters); T0=$(date +%s.%N); S0=$(snap)
if [[ -n "${PERF_OUT:-}" ]]; then
    # shellcheck disable=SC2086 # PERF_ARGS is a list of options
    timeout $((RT + 5)) perf record ${PERF_ARGS:--g} -p "$PID" -o "$PERF_OUT" -- sleep $((RT - 3)) >/dev/null 2>&1 &
    PERF_PID=$!
fi
sleep $((RT - 3))
C1=$(counters); T1=$(date +%s.%N); S1=$(snap)
wait $FIO
[[ -n "${PERF_PID:-}" ]] && wait "$PERF_PID"
LOAD=$(cut -d' ' -f1 /proc/loadavg)
HWM=$(awk '/^VmHWM/{print int($2/1024)}' /proc/$PID/status)
python3 - "$D/fio.json" "$S0" "$S1" "$C0" "$C1" "$T0" "$T1" "$LOAD" "$BIN" "$COMP" "$HWM" <<'PY'
import json, sys, os
job = json.load(open(sys.argv[1]))["jobs"][0]
d = job["write"]
iops = d["iops"]
# fio's mean latency of a WRITE and of a FLUSH (µs, as the client sees them)
wlat = d["lat_ns"]["mean"] / 1e3
flat = job.get("sync", {}).get("lat_ns", {}).get("mean", 0) / 1e3
# and the FLUSH tail (µs): p99 and p99.9
fp = job.get("sync", {}).get("lat_ns", {}).get("percentile", {})
fp99, fp999 = (fp.get(k, 0) / 1e3 for k in ("99.000000", "99.900000"))
ops = iops * (float(sys.argv[7]) - float(sys.argv[6]))
def parse(s): return {k: int(v) for k, v in (x.split("=") for x in s.split())}
a, b = parse(sys.argv[2]), parse(sys.argv[3])
syncs0, flushes0, commits0, secs0 = map(float, sys.argv[4].split())
syncs1, flushes1, commits1, secs1 = map(float, sys.argv[5].split())
hz = os.sysconf("SC_CLK_TCK")
us = lambda t: t / hz * 1e6 / ops
delta = lambda k: b[k] - a[k]
process = ("total", "minflt", "vol", "invol", "kworker")
per = {k: b[k] - a.get(k, 0) for k in b if k not in process}
gone = delta("total") - sum(per.values())
commits = commits1 - commits0
label = sys.argv[9].split('/')[-4] if sys.argv[9].count('/') > 3 else sys.argv[9]
print(f"{label} {sys.argv[10]} iops={iops:.0f} cpu_us/pair={us(delta('total')):.1f} vol/pair={delta('vol')/ops:.2f} "
      f"invol/pair={delta('invol')/ops:.2f} minflt/pair={delta('minflt')/ops:.2f} "
      f"syncs/flush={(syncs1-syncs0)/max(1, flushes1-flushes0):.3f} kworker_us/pair={us(delta('kworker')):.0f} "
      f"peakRSS={sys.argv[11]}MiB load={sys.argv[8]}")
print(f"  client latency (µs): write={wlat:.0f} flush={flat:.0f} flush_p99={fp99:.0f} flush_p99.9={fp999:.0f} pair={8e6/iops:.0f} (8 jobs / IOPS)")
by = " ".join(f"{k}={us(v):.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v > 0)
print(f"  by thread (µs/pair): {by} gone={us(gone):.1f}; txgs={commits:.0f} ms/txg={(secs1-secs0)*1e3/max(1, commits):.0f}")
PY
kill $PID; wait $PID 2>/dev/null
grep -q "panicked at" "$D/daemon.log" && echo "PANIC: $D/daemon.log"
rm -rf "$D"
