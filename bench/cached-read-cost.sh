#!/usr/bin/env bash
# bench/cached-read-cost.sh: what a cached 1 MiB sequential NBD read costs the
# server, in load-independent figures (decision 0070). A benchmark, not a test.
#
#   bash bench/cached-read-cost.sh BIN [LABEL] [ROUNDS]
#   (interleave binaries: for b in A B A B; do bash bench/cached-read-cost.sh $b; done)
#
# A daemon with `[engine] cache_max_bytes` 512 MiB, a 256 MiB volume
# (compression off, volblocksize 16K) filled and read once (warm ARC), then
# ROUNDS x RT seconds of fio (nbd engine, 1 MiB reads, iodepth 8) under
# `perf stat -p DAEMON`; then nbdkit's file plugin on a 256 MiB file (page
# cache) with the same job. One line each: MB/s (moves with the load), the
# server's CPU seconds, context switches, syscalls (all; writev, sendmsg,
# futex, epoll_wait, recvfrom+read) and page faults per GiB read, fio's own
# CPU per GiB, and the server's peak/current RSS.
# A second line gives the client's (fio's) context switches, syscalls,
# recvfrom and poll calls per GiB: how often it woke for data.
# Environment: RT=10 (seconds per round), NBDKIT=1 (0: skip nbdkit),
# RW=read BS=1M QD=8 (the fio job: --rw, --bs, --iodepth),
# PERF_RECORD=FILE (also `perf record` one more round; PERF_G, PERF_E: its
# call-graph and event options). Needs root (perf), fio, nbdkit, python3.
# On a shared machine, `chrt -f 5 bash bench/cached-read-cost.sh ...` runs
# server and client as on a quiet one (decision 0074: under load the
# per-GiB figures fall, since client and server rarely run at once).
set -euo pipefail
BIN=$1; LABEL=${2:-$(basename "$(dirname "$(dirname "$(dirname "$BIN")")")")}; ROUNDS=${3:-1}
RT=${RT:-10}
NBDKIT=${NBDKIT:-1}
W=$(mktemp -d /tmp/cc-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.5; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitp() { for ((i = 0; i < 600; i++)); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
EV=task-clock,context-switches,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read
# measure PID NAME URI: one timed fio under perf stat; prints a line
measure() {
    local pid=$1 name=$2 uri=$3
    perf stat -x, -o "$W/$name.perf" -e "$EV" -p "$pid" &
    local pp=$!
    sleep 0.2
    perf stat -x, -o "$W/$name.fioperf" -e task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll \
        fio --name="$name" --ioengine=nbd "--uri=$uri" --rw="${RW:-read}" --bs="${BS:-1M}" --iodepth="${QD:-8}" --size=256M \
        --time_based --runtime="$RT" --output-format=json --output="$W/$name.json" >/dev/null 2>&1
    kill -INT $pp; wait $pp || true
    python3 - "$W/$name.json" "$W/$name.perf" "$LABEL" "$name" "$(cut -d' ' -f1 /proc/loadavg)" "$pid" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
r = j["read"]; gib = r["io_bytes"] / (1 << 30)
ev = {}
for l in open(sys.argv[2]):
    f = l.strip().split(",")
    if len(f) > 2 and f[0] and not l.startswith("#"):
        try: ev[f[2]] = float(f[0])
        except ValueError: pass
rss = {}
for l in open(f"/proc/{sys.argv[6]}/status"):
    k = l.split(":")[0]
    if k in ("VmHWM", "VmRSS"): rss[k] = int(l.split()[1]) // 1024
g = lambda k: ev.get(k, 0) / gib
fiocpu = 0
for l in open(sys.argv[1].replace(".json", ".fioperf")):
    f = l.strip().split(",")
    if len(f) > 2 and f[2] == "task-clock": fiocpu = float(f[0]) / 1000 / gib
    elif len(f) > 2:
        try: ev["fio:" + f[2]] = float(f[0])
        except ValueError: pass
print(f"{sys.argv[3]:<10} {sys.argv[4]:<8} load {sys.argv[5]:>5}  {r['bw_bytes']/1e6:7.0f} MB/s  cpu {g('task-clock')/1000:.3f} s/GiB  "
      f"cs {g('context-switches'):6.0f}  sys {g('raw_syscalls:sys_enter'):6.0f}  writev {g('syscalls:sys_enter_writev'):5.0f}  "
      f"sendmsg {g('syscalls:sys_enter_sendmsg'):4.0f}  futex {g('syscalls:sys_enter_futex'):5.0f}  epoll {g('syscalls:sys_enter_epoll_wait'):5.0f}  "
      f"recv {g('syscalls:sys_enter_recvfrom')+g('syscalls:sys_enter_read'):5.0f}  pf {g('page-faults'):5.0f} /GiB  fio-cpu {fiocpu:.3f} s/GiB  rss {rss.get('VmHWM')}/{rss.get('VmRSS')} MiB")
print(f"{'':<10} fio      cs {g('fio:context-switches'):6.0f}  sys {g('fio:raw_syscalls:sys_enter'):6.0f}  recv {g('fio:syscalls:sys_enter_recvfrom'):6.0f}  "
      f"poll {g('fio:syscalls:sys_enter_poll') + g('fio:syscalls:sys_enter_ppoll'):6.0f} /GiB (the client's wake-ups)")
EOF
}
mkdir -p "$W/disks"
printf '[engine]\ncache_max_bytes = %s\n' $((512 << 20)) >"$W/cistern.toml"
np=$(port); ap=$(port)
export CISTERN_API="http://127.0.0.1:$ap"
"$BIN" serve --config "$W/cistern.toml" --state-dir "$W/state" --nbd "127.0.0.1:$np" --api "127.0.0.1:$ap" >"$W/daemon.log" 2>&1 &
PID=$!; PIDS+=($PID)
waitp "$ap"; waitp "$np"
for _ in $(seq 100); do "$BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
"$BIN" pool create -s 2G bench "$W/disks/d0" >/dev/null
"$BIN" create -V 256M -o compression=off -o volblocksize=16K bench/fit >/dev/null
uri="nbd://127.0.0.1:$np/bench/fit"
fio --name=fill --ioengine=nbd "--uri=$uri" --rw=write --bs=1M --iodepth=8 --size=256M \
    --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --end_fsync=1 >/dev/null 2>&1
fio --name=warm --ioengine=nbd "--uri=$uri" --rw=read --bs=1M --iodepth=8 --size=256M >/dev/null 2>&1
for ((r = 1; r <= ROUNDS; r++)); do measure "$PID" "cistern" "$uri"; done
if [[ -n "${PERF_RECORD:-}" ]]; then
    perf record ${PERF_G:--g} ${PERF_E:-} -o "$PERF_RECORD" -p "$PID" -- sleep "$RT" >/dev/null 2>&1 &
    rp=$!
    fio --name=rec --ioengine=nbd "--uri=$uri" --rw=read --bs=1M --iodepth=8 --size=256M \
        --time_based --runtime="$RT" >/dev/null 2>&1
    wait $rp || true
fi
kill "$PID"; wait "$PID" 2>/dev/null || true
if [[ "$NBDKIT" == 1 ]]; then
    truncate -s 256M "$W/disk.img"
    kp=$(port)
    nbdkit -f -i 127.0.0.1 -p "$kp" file "$W/disk.img" >"$W/nbdkit.log" 2>&1 &
    KP=$!; PIDS+=($KP)
    waitp "$kp"
    fio --name=fill --ioengine=nbd "--uri=nbd://127.0.0.1:$kp/" --rw=write --bs=1M --iodepth=8 --size=256M \
        --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers --end_fsync=1 >/dev/null 2>&1
    fio --name=warm --ioengine=nbd "--uri=nbd://127.0.0.1:$kp/" --rw=read --bs=1M --iodepth=8 --size=256M >/dev/null 2>&1
    measure "$KP" "nbdkit" "nbd://127.0.0.1:$kp/"
fi
