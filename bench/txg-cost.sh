#!/bin/bash
# txg-cost.sh BIN [COMP] [RUNTIME]: the 4K random write + FLUSH job of
# /work/helpers/tools/ff-cost.sh (8 fio jobs over NBD, volblocksize 16K),
# with the txg's share: daemon CPU us per write+FLUSH pair in total and by
# thread name (/proc/PID/task/*/stat; threads that exited during the run,
# e.g. the txg's encoder threads, are in "gone"), txg commits and the mean
# commit time, minor page faults per pair. Load-independent figures; the
# load average is printed with them. Only 127.0.0.1.
set -u
BIN="$1"; COMP="${2:-off}"; RT="${3:-10}"
D=$(mktemp -d /tmp/txgc.XXXX)
mkdir -p "$D/disks"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
NP=$(port); AP=$(port)
"$BIN" serve --state-dir "$D/state" --nbd "127.0.0.1:$NP" --api "127.0.0.1:$AP" >"$D/daemon.log" 2>&1 &
PID=$!
export CISTERN_API="http://127.0.0.1:$AP"
for _ in $(seq 300); do "$BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
export CISTERN_TOKEN=$(cat "$D/state/api.token")
"$BIN" pool create -s 4G bench "$D/disks/d0" >/dev/null
"$BIN" create -V 1G -o compression=$COMP -o volblocksize=16K bench/vol >/dev/null
counters() { python3 - <<'PY'
import os, re, urllib.request
req = urllib.request.Request(os.environ["CISTERN_API"] + "/metrics", headers={"Authorization": "Bearer " + os.environ["CISTERN_TOKEN"]})
t = urllib.request.urlopen(req, timeout=30).read().decode()
get = lambda name: re.search(r'^' + name + r'\{pool="bench"\} (\S+)$', t, re.M).group(1)
print(get("cistern_pool_txg_commits_total"), get("cistern_pool_txg_commit_seconds_total"))
PY
}
snap() { # name=ticks per live thread, then total ticks and minor faults of the process
  for f in /proc/$PID/task/*/stat; do
    sed -E 's/^[0-9]+ \((.*)\) . (.*)$/\1 \2/' "$f" 2>/dev/null | awk '{gsub(/-.*/,"",$1); print $1, $13+$14}'
  done | awk '{s[$1]+=$2} END{for (k in s) printf "%s=%d ", k, s[k]}'
  awk '{printf "total=%d minflt=%d\n", $14+$15, $10}' /proc/$PID/stat
}
fio --name=w --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --time_based --runtime=2 --group_reporting >/dev/null 2>&1
# Per-thread figures are taken inside the run (the NBD connection threads
# exit when fio disconnects): from 2 s in to 1 s before the end; pairs in
# that window = fio's mean IOPS x its length.
fio --name=m --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --time_based --runtime=$RT --group_reporting --output-format=json --output="$D/fio.json" >/dev/null 2>&1 &
FIO=$!
sleep 2
read c0 s0 < <(counters)
T0=$(date +%s.%N); S0=$(snap)
sleep $((RT - 3))
read c1 s1 < <(counters)
T1=$(date +%s.%N); S1=$(snap)
wait $FIO
LOAD=$(cut -d' ' -f1 /proc/loadavg)
python3 - "$D/fio.json" "$S0" "$S1" "$c0" "$c1" "$s0" "$s1" "$LOAD" "$BIN" "$COMP" "$T0" "$T1" <<'PY'
import json, sys, os
d = json.load(open(sys.argv[1]))["jobs"][0]["write"]
iops = d["iops"]; ops = iops * (float(sys.argv[12]) - float(sys.argv[11]))
def parse(s): return {k: int(v) for k, v in (x.split("=") for x in s.split())}
a, b = parse(sys.argv[2]), parse(sys.argv[3])
hz = os.sysconf("SC_CLK_TCK")
us = lambda t: t / hz * 1e6 / ops
total = b["total"] - a["total"]
names = sorted(k for k in b if k not in ("total", "minflt"))
per = {k: b[k] - a.get(k, 0) for k in names}
gone = total - sum(per.values())
c0, c1 = int(sys.argv[4]), int(sys.argv[5])
commits = c1 - c0
ms = (float(sys.argv[7]) - float(sys.argv[6])) * 1e3 / max(1, commits)
by = " ".join(f"{k}={us(v):.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v > 0)
print(f"{sys.argv[9]} {sys.argv[10]} iops={iops:.0f} cpu_us/pair={us(total):.1f} [{by} gone={us(gone):.1f}] "
      f"minflt/pair={(b['minflt']-a['minflt'])/ops:.2f} txgs={commits} ms/txg={ms:.0f} load={sys.argv[8]}")
PY
kill $PID; wait $PID 2>/dev/null
grep -q "panicked at" "$D/daemon.log" && echo "PANIC: $D/daemon.log"
rm -rf "$D"
