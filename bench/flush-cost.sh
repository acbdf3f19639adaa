#!/usr/bin/env bash
# bench/flush-cost.sh: what a 4 KiB random write + FLUSH costs the server, in
# load-independent figures (issue 15's sync-write target; decision 0072).
# A benchmark, not a test.
#
#   bash bench/flush-cost.sh BIN [COMP] [RUNTIME]
#   (interleave binaries: for b in A B A B; do bash bench/flush-cost.sh $b off 10; done)
#
# A fresh daemon (defaults), a 4 GiB file pool, a 1 GiB volume (COMP: off or
# lz4, volblocksize 16K); 2 s of warm-up, then RUNTIME (10) seconds of fio
# (nbd engine, 8 jobs, 4 KiB random writes at iodepth 1, FLUSH after each,
# half-compressible data). One line: IOPS (moves with the load), the
# daemon's CPU µs, voluntary and involuntary context switches and minor page
# faults per write+FLUSH pair (from /proc/PID/stat and task/*/status), log
# syncs per FLUSH (pool iostat), kworker CPU µs per pair (all kworkers: the
# loop back and the disk's flushes), the daemon's peak RSS, the load average.
# Needs fio (nbd engine), python3.
set -u
BIN="$1"; COMP="${2:-off}"; RT="${3:-10}"
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
"$BIN" pool create -s 4G bench "$D/disks/d0" >/dev/null
"$BIN" create -V 1G -o "compression=$COMP" -o volblocksize=16K bench/vol >/dev/null
# log syncs and FLUSHes so far, from the pool's iostat
counters() { python3 - <<'PY'
import json, os, urllib.request
req = urllib.request.Request(os.environ["CISTERN_API"] + "/v1/pools/bench/iostat", headers={"Authorization": "Bearer " + os.environ["CISTERN_TOKEN"]})
s = json.load(urllib.request.urlopen(req, timeout=30))
print(s["log_syncs"], s["log_flushes"])
PY
}
# daemon utime+stime ticks, voluntary and involuntary switches over all its
# threads, all kworkers' ticks, daemon minor faults
snap() {
  local t; t=$(awk '{print $14+$15}' /proc/$PID/stat)
  local v=0 n=0
  for f in /proc/$PID/task/*/status; do
    read -r a b < <(awk '/^voluntary_ctxt/{v=$2} /^nonvoluntary_ctxt/{n=$2} END{print v, n}' "$f" 2>/dev/null)
    v=$((v+${a:-0})); n=$((n+${b:-0}))
  done
  local k; k=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$2 ~ /^\(kworker/ {s+=$14+$15} END{print s+0}')
  local m; m=$(awk '{print $10}' /proc/$PID/stat)
  echo "$t $v $n $k $m"
}
fio --name=w --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --time_based --runtime=2 --group_reporting >/dev/null 2>&1
read -r c0 f0 < <(counters)
read -r t0 v0 n0 k0 m0 < <(snap)
fio --name=m --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --time_based --runtime="$RT" --group_reporting --output-format=json --output="$D/fio.json" >/dev/null 2>&1
read -r t1 v1 n1 k1 m1 < <(snap)
read -r c1 f1 < <(counters)
LOAD=$(cut -d' ' -f1 /proc/loadavg)
HWM=$(awk '/^VmHWM/{print int($2/1024)}' /proc/$PID/status)
python3 - "$D/fio.json" "$t0" "$t1" "$v0" "$v1" "$n0" "$n1" "$c0" "$c1" "$f0" "$f1" "$LOAD" "$BIN" "$k0" "$k1" "$m0" "$m1" "$HWM" <<'PY'
import json, sys, os
d = json.load(open(sys.argv[1]))["jobs"][0]["write"]
ops = d["total_ios"]; iops = d["iops"]
t0,t1,v0,v1,n0,n1,c0,c1,f0,f1 = map(int, sys.argv[2:12])
m0, m1 = int(sys.argv[16]), int(sys.argv[17])
hz = os.sysconf("SC_CLK_TCK")
cpu = (t1-t0)/hz*1e6/ops
label = sys.argv[13].split('/')[-4] if sys.argv[13].count('/') > 3 else sys.argv[13]
print(f"{label} iops={iops:.0f} cpu_us/pair={cpu:.0f} vol/pair={(v1-v0)/ops:.2f} invol/pair={(n1-n0)/ops:.2f} "
      f"minflt/pair={(m1-m0)/ops:.2f} syncs/flush={(c1-c0)/max(1,f1-f0):.3f} "
      f"kworker_us/pair={(int(sys.argv[15])-int(sys.argv[14]))/hz*1e6/ops:.0f} peakRSS={sys.argv[18]}MiB load={sys.argv[12]}")
PY
kill $PID; wait $PID 2>/dev/null
grep -q "panicked at" "$D/daemon.log" && echo "PANIC: $D/daemon.log"
rm -rf "$D"
