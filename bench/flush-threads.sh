#!/bin/bash
# flush-threads.sh BIN [COMP] [RUNTIME] [PERF_ARGS]: the ff-cost job; per-thread-name CPU and switches per pair;
# (decision 0075) The job of /work/helpers/tools/ff-cost.sh (8 fio jobs, 4K random write + FLUSH,
# volblocksize 16K), split by daemon thread name. Example:
#   PERF_OUT=/tmp/sw.perf PERF_ARGS="-e sched:sched_switch -e sched:sched_wakeup -g" bash bench/flush-threads.sh BIN off 5
# with PERF_OUT set, perf record $PERF_ARGS of the daemon during the measured run.
set -u
BIN="$1"; COMP="${2:-off}"; RT="${3:-10}"
D=$(mktemp -d /tmp/fft.XXXX); mkdir -p "$D/disks"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
NP=$(port); AP=$(port)
"$BIN" serve --state-dir "$D/state" --nbd "127.0.0.1:$NP" --api "127.0.0.1:$AP" >"$D/daemon.log" 2>&1 &
PID=$!
export CISTERN_API="http://127.0.0.1:$AP"
for _ in $(seq 300); do "$BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
export CISTERN_TOKEN=$(cat "$D/state/api.token")
"$BIN" pool create -s 4G bench "$D/disks/d0" >/dev/null
"$BIN" create -V 1G -o compression=$COMP -o volblocksize=16K bench/vol >/dev/null
snap() { for t in /proc/$PID/task/*; do
  c=$(cat $t/comm 2>/dev/null); s=$(awk '{print $14+$15}' $t/stat 2>/dev/null)
  v=$(awk '/^voluntary_ctxt/{print $2}' $t/status 2>/dev/null); n=$(awk '/^nonvoluntary_ctxt/{print $2}' $t/status 2>/dev/null)
  [ -n "$n" ] && echo "${t##*/} $c $s $v $n"; done; }
fio --name=w --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --time_based --runtime=2 --group_reporting >/dev/null 2>&1
snap > "$D/s0"
if [ -n "${PERF_OUT:-}" ]; then perf record ${PERF_ARGS:--g} -p $PID -o "$PERF_OUT" >/dev/null 2>&1 & PP=$!; fi
fio --name=m --ioengine=nbd --uri="nbd://127.0.0.1:$NP/bench/vol" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8 --size=128M --offset_increment=128M --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --time_based --runtime=$RT --group_reporting --output-format=json --output="$D/fio.json" >/dev/null 2>&1
snap > "$D/s1"
if [ -n "${PERF_OUT:-}" ]; then kill -INT $PP; wait $PP; fi
python3 - "$D" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys, os, collections
d=sys.argv[1]; ops=json.load(open(d+"/fio.json"))["jobs"][0]["write"]["total_ios"]
iops=json.load(open(d+"/fio.json"))["jobs"][0]["write"]["iops"]
def rd(f):
    r={}
    for l in open(f):
        f=l.split()
        if len(f)==5: r[f[0]]=(f[1],int(f[2]),int(f[3]),int(f[4]))
    return r
a=rd(d+"/s0"); b=rd(d+"/s1"); hz=os.sysconf("SC_CLK_TCK")
agg=collections.defaultdict(lambda:[0,0,0,0])
for tid,(c,s,v,n) in b.items():
    s0,v0,n0=(a[tid][1:] if tid in a else (0,0,0))
    g=agg[c.rstrip('0123456789-') or c]; g[0]+=s-s0; g[1]+=v-v0; g[2]+=n-n0; g[3]+=1
print(f"iops={iops:.0f} pairs={ops} load={sys.argv[2]}")
for c,(s,v,n,k) in sorted(agg.items(), key=lambda x:-x[1][0]-x[1][1]):
    if s==0 and v==0 and n==0: continue
    print(f"  {c:20s} threads={k:3d} cpu_us/pair={s/hz*1e6/ops:6.1f} vol/pair={v/ops:.3f} invol/pair={n/ops:.3f}")
PY
kill $PID; wait $PID 2>/dev/null
grep -q "panicked at" "$D/daemon.log" && echo "PANIC: $D/daemon.log"
rm -rf "$D"
