#!/usr/bin/env bash
# bench/bucket.sh: a pool in a bucket (decision 0039) over versitygw on
# loopback, against the same pool on a local file (one daemon holds both) and
# against versitygw's own sequential conditional-PUT rate. A benchmark, not a
# test: it prints figures and ratios.
#
#   bash bench/bucket.sh
#   RUNTIME=5 REPEAT=1 bash bench/bucket.sh
#
# Per round (REPEAT rounds, load average printed with each):
#   randwrite-4k-flush  JOBS connections, 4 KiB random writes each followed by
#                       FLUSH (fio --fsync=1): bucket pool vs local pool
#   seqwrite-1m         1 MiB sequential writes of SIZE, iodepth 8 (+ final FLUSH)
#   seqread-1m          1 MiB sequential reads of what was written (from the cache)
#   put-rate            versitygw: sequential 4 KiB PUTs with If-None-Match: *
#                       from one client (what one log writer can do), boto3
# Then once: takeover time from kill -STOP of the owner to the new owner
# serving the volume: warm, by a standby daemon (`serve --standby`, tailing the
# log since the pool was made, decision 0048) that applies only what it had
# not yet; and cold, by a fresh daemon (`pool takeover tank LOCATION`)
# reading the log into a fresh cache bounded by default (decision 0063: no
# segment fetched at open; it takes the pool from the standby). Prints both
# and the ratio.
# Then reads, once each, on three pools holding the same SIZE of data: the
# local-file pool, the bucket pool with the default bound (the cold
# takeover's daemon, `cache_bytes` unset) and the bucket pool with a small
# bound (`[bucket] cache_bytes = CACHE_BYTES`, decision 0054; a fresh daemon
# takes the pool over, its open fetches only the log):
#   randread-4k-cold    4 KiB random reads over SIZE, iodepth 8, RUNTIME
#                       (bounded: every line absent; each miss fetches whole
#                       segments, decision 0054)
#   seqread-1m-cold     1 MiB sequential reads of SIZE (bounded: mostly absent)
#   seqread-1m-cached   1 MiB sequential reads of the first WORKING_SET, after
#                       one unmeasured pass (WORKING_SET < CACHE_BYTES)
#   randread-4k-cached  4 KiB random reads over WORKING_SET, iodepth 8, RUNTIME
# ("cached" reads are mostly served by the daemon's block cache above the
# device; the local and unbounded pools were read and written before, so
# their "cold" reads are not cold: the bounded pool's are) and the bounded cache's held/hits/misses/fetched figures from `pool status`
# after each.
#
# Environment: RUNTIME=10 SIZE=512M JOBS=8 REPEAT=3 BENCH_DIR=bench/out/bucket-<time>
#   CACHE_BYTES=128M WORKING_SET=64M
#   CISTERN_BIN=target/release/cistern VERSITYGW=/work/cache/go-bin/versitygw
#   PYTHON=.venv/bin/python (needs boto3)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-512M}
JOBS=${JOBS:-8}
REPEAT=${REPEAT:-3}
CACHE_BYTES=${CACHE_BYTES:-128M}
WORKING_SET=${WORKING_SET:-64M}
CISTERN_BIN=${CISTERN_BIN:-$PWD/target/release/cistern}
VERSITYGW=${VERSITYGW:-$(command -v versitygw || echo /work/cache/go-bin/versitygw)}
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
BENCH_DIR=${BENCH_DIR:-bench/out/bucket-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
RESULTS="$BENCH_DIR/results.txt"
: >"$RESULTS"
for tool in fio "$VERSITYGW" "$CISTERN_BIN" "$PYTHON"; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

PIDS=()
trap 'stop_pids' EXIT

gw_port=$(free_port)
mkdir -p "$BENCH_DIR/gw/bkt"
"$VERSITYGW" --access benchkey --secret benchsecret --port "127.0.0.1:$gw_port" posix "$BENCH_DIR/gw" \
    >"$BENCH_DIR/versitygw.log" 2>&1 &
PIDS+=($!)
wait_port "$gw_port" 20
CONFIG="[bucket]
endpoint = \"http://127.0.0.1:$gw_port\"
region = \"us-east-1\"
access_key_id = \"benchkey\"
secret_access_key = \"benchsecret\"
cache_size = $((8 << 30))"

POOL_SIZE=8G start_cistern "$BENCH_DIR/owner" "$CONFIG"
OWNER_PID=$CISTERN_PID
OWNER_API=$CISTERN_API
OWNER_TOKEN=$CISTERN_TOKEN
NBD_PORT=$(tr '\0' ' ' </proc/$OWNER_PID/cmdline | sed -n 's/.*--nbd 127.0.0.1:\([0-9]*\).*/\1/p')
"$CISTERN_BIN" pool create tank "s3://bkt/bench/tank" >/dev/null
"$CISTERN_BIN" create -V "$SIZE" bench/vol >/dev/null
"$CISTERN_BIN" create -V "$SIZE" tank/vol >/dev/null
# The warm standby tails the log through every round.
# (Set and cleared, not a prefix assignment: with one, bash scopes the
# function's `export CISTERN_API` to the call and later CLI calls go astray.)
CISTERN_SERVE_EXTRA="--standby tank s3://bkt/bench/tank"
start_cistern "$BENCH_DIR/standby" "$CONFIG"
CISTERN_SERVE_EXTRA=""
STANDBY_PID=$CISTERN_PID
STANDBY_API=$CISTERN_API
export CISTERN_API=$OWNER_API CISTERN_TOKEN=$OWNER_TOKEN

per_job=$("$PYTHON" -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30}; n=int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s); print(n//$JOBS//4096*4096)" "$SIZE")

fio_json() { # fio_json OUT ARGS... -> runs fio, prints "iops mbps"
    local out="$1"
    shift
    fio --output-format=json "--output=$out" "$@" >"$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
    "$PYTHON" - "$out" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print(f'{d["iops"]:.0f} {d["bw_bytes"]/1e6:.1f}')
EOF
}

put_rate() {
    "$PYTHON" - "$gw_port" "$RUNTIME" <<'EOF'
import sys, time, boto3, botocore.config
port, secs = int(sys.argv[1]), float(sys.argv[2])
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="benchkey",
                  aws_secret_access_key="benchsecret", region_name="us-east-1",
                  config=botocore.config.Config(retries={"max_attempts": 1}))
body = b"x" * 4096
n, t0 = 0, time.monotonic()
run = f"{time.time_ns()}"
while time.monotonic() - t0 < secs and n < 10_000_000:
    s3.put_object(Bucket="bkt", Key=f"putrate/{run}/{n:012d}", Body=body, IfNoneMatch="*")
    n += 1
print(f"{n / (time.monotonic() - t0):.0f}")
EOF
}

for round in $(seq "$REPEAT"); do
    echo "round $round: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RESULTS"
    for pool in bench tank; do
        uri="nbd://127.0.0.1:$NBD_PORT/$pool/vol"
        w4k=$(fio_json "$BENCH_DIR/$pool.r$round.4k.json" --name=w4k --ioengine=nbd "--uri=$uri" \
            --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs="$JOBS" --size="$per_job" \
            --offset_increment="$per_job" --time_based --runtime="$RUNTIME" --ramp_time=1 --group_reporting)
        sw=$(fio_json "$BENCH_DIR/$pool.r$round.sw.json" --name=sw --ioengine=nbd "--uri=$uri" \
            --rw=write --bs=1M --iodepth=8 --size="$SIZE" --end_fsync=1)
        sr=$(fio_json "$BENCH_DIR/$pool.r$round.sr.json" --name=sr --ioengine=nbd "--uri=$uri" \
            --rw=read --bs=1M --iodepth=8 --size="$SIZE")
        echo "$round $pool 4k-flush-iops ${w4k% *} seqwrite-MBps ${sw#* } seqread-MBps ${sr#* }" | tee -a "$RESULTS"
    done
    echo "$round versitygw put-rate $(put_rate)" | tee -a "$RESULTS"
done
echo "owner RSS (peak current MiB): $(rss "$OWNER_PID")" | tee -a "$RESULTS"

echo "standby RSS while tailing (peak current MiB): $(rss "$STANDBY_PID"); its cache file $(du -k "$BENCH_DIR"/standby/state/bucket/*.cache 2>/dev/null | cut -f1 | head -1) KiB held" | tee -a "$RESULTS"
log_objects=$(find "$BENCH_DIR/gw/bkt/bench/tank/log" -type f | wc -l)
log_bytes=$(du -sb "$BENCH_DIR/gw/bkt/bench/tank" | cut -f1)

# Warm takeover: the standby takes the pool from the stopped owner.
CISTERN_API_OWNER=$OWNER_API
kill -STOP "$OWNER_PID"
warm=$(elapsed env "CISTERN_API=$STANDBY_API" "CISTERN_TOKEN=$(cat "$BENCH_DIR/standby/state/api.token")" \
    "$CISTERN_BIN" pool takeover tank)
kill -CONT "$OWNER_PID"
echo "takeover-warm-seconds $warm (standby tailing; $log_objects log records, $log_bytes bytes in the bucket)" | tee -a "$RESULTS"
# Cold takeover: a fresh daemon replays the whole log (fencing the standby).
start_cistern "$BENCH_DIR/cold" "$CONFIG"
cold=$(elapsed env "CISTERN_API=$CISTERN_API" "CISTERN_TOKEN=$(cat "$BENCH_DIR/cold/state/api.token")" \
    "$CISTERN_BIN" pool takeover tank "s3://bkt/bench/tank")
echo "takeover-cold-seconds $cold (log read into a fresh cache bounded by default; SIZE=$SIZE written)" | tee -a "$RESULTS"
"$PYTHON" -c "import sys; print(f'takeover warm/cold {float(sys.argv[1]) / float(sys.argv[2]):.3f}x')" "$warm" "$cold" | tee -a "$RESULTS"

# Reads on the local pool, the default-bounded and the small-bounded bucket cache.
read_set() { # read_set LABEL URI [FIGURES_CMD] -> one "reads LABEL ..." line
    local label="$1" uri="$2" figures="${3:-true}" sc rc sw rw
    # Random first: on the fresh bounded daemon neither its cache nor its
    # block cache (ARC) holds anything yet.
    rc=$(fio_json "$BENCH_DIR/$label.rc.json" --name=rc --ioengine=nbd "--uri=$uri" \
        --rw=randread --bs=4k --iodepth=8 --size="$SIZE" --time_based --runtime="$RUNTIME")
    "$figures" "after randread-4k-cold (${rc% *} IOPS)"
    sc=$(fio_json "$BENCH_DIR/$label.sc.json" --name=sc --ioengine=nbd "--uri=$uri" \
        --rw=read --bs=1M --iodepth=8 --size="$SIZE")
    "$figures" "after seqread-1m-cold (${sc#* } MB/s)"
    fio_json "$BENCH_DIR/$label.warm.json" --name=warm --ioengine=nbd "--uri=$uri" \
        --rw=read --bs=1M --iodepth=8 --size="$WORKING_SET" >/dev/null
    sw=$(fio_json "$BENCH_DIR/$label.sw.json" --name=sw --ioengine=nbd "--uri=$uri" \
        --rw=read --bs=1M --iodepth=8 --size="$WORKING_SET")
    rw=$(fio_json "$BENCH_DIR/$label.rw.json" --name=rw --ioengine=nbd "--uri=$uri" \
        --rw=randread --bs=4k --iodepth=8 --size="$WORKING_SET" --time_based --runtime="$RUNTIME")
    echo "reads $label seqread-1m-cold-MBps ${sc#* } randread-4k-cold-iops ${rc% *}" \
        "seqread-1m-cached-MBps ${sw#* } randread-4k-cached-iops ${rw% *} (load $(cut -d' ' -f1-3 /proc/loadavg))"
}
echo "reads: SIZE=$SIZE CACHE_BYTES=$CACHE_BYTES WORKING_SET=$WORKING_SET" | tee -a "$RESULTS"
read_set local "nbd://127.0.0.1:$NBD_PORT/bench/vol" | tee -a "$RESULTS"
COLD_NBD=$(tr '\0' ' ' </proc/$CISTERN_PID/cmdline | sed -n 's/.*--nbd 127.0.0.1:\([0-9]*\).*/\1/p')
DEFAULT_PID=$CISTERN_PID
default_figures() { echo "default $1: $(env "CISTERN_API=$CISTERN_API" "CISTERN_TOKEN=$(cat "$BENCH_DIR/cold/state/api.token")" "$CISTERN_BIN" pool status tank | grep ' cache:' || echo '(no cache line)')" | tee -a "$RESULTS" >&2; }
read_set default "nbd://127.0.0.1:$COLD_NBD/tank/vol" default_figures | tee -a "$RESULTS"
echo "default daemon RSS (peak current MiB): $(rss "$DEFAULT_PID")" | tee -a "$RESULTS"
# The bounded cache: a fresh daemon takes the pool over cold (fencing the
# default one) and opens it bounded.
start_cistern "$BENCH_DIR/bounded" "$CONFIG
cache_bytes = \"$CACHE_BYTES\""
BOUNDED_PID=$CISTERN_PID
BOUNDED_TOKEN=$(cat "$BENCH_DIR/bounded/state/api.token")
bounded_cli() { env "CISTERN_API=$CISTERN_API" "CISTERN_TOKEN=$BOUNDED_TOKEN" "$CISTERN_BIN" "$@"; }
bounded_figures() { echo "bounded $1: $(bounded_cli pool status tank | grep ' cache:' || echo '(no cache line)')" | tee -a "$RESULTS" >&2; }
bounded_takeover=$(elapsed env "CISTERN_API=$CISTERN_API" "CISTERN_TOKEN=$BOUNDED_TOKEN" \
    "$CISTERN_BIN" pool takeover tank "s3://bkt/bench/tank")
echo "takeover-bounded-seconds $bounded_takeover (cold, cache_bytes=$CACHE_BYTES: only the log is read)" | tee -a "$RESULTS"
echo "bounded after open: $(bounded_cli pool status tank | grep ' cache:' || echo '(no cache line)')" | tee -a "$RESULTS"
BOUNDED_NBD=$(tr '\0' ' ' </proc/$BOUNDED_PID/cmdline | sed -n 's/.*--nbd 127.0.0.1:\([0-9]*\).*/\1/p')
read_set bounded "nbd://127.0.0.1:$BOUNDED_NBD/tank/vol" bounded_figures | tee -a "$RESULTS"
echo "bounded after reads: $(bounded_cli pool status tank | grep ' cache:' || echo '(no cache line)')" | tee -a "$RESULTS"
echo "bounded daemon RSS (peak current MiB): $(rss "$BOUNDED_PID"); cache file $(du -k --apparent-size "$BENCH_DIR"/bounded/state/bucket/*.cache 2>/dev/null | cut -f1 | head -1) KiB apparent," \
    "$(du -k "$BENCH_DIR"/bounded/state/bucket/*.cache 2>/dev/null | cut -f1 | head -1) KiB held" | tee -a "$RESULTS"
export CISTERN_API=$CISTERN_API_OWNER CISTERN_TOKEN=$OWNER_TOKEN

"$PYTHON" - "$RESULTS" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l[:1].isdigit()]
def med(pool, key):
    v = [float(r[r.index(key) + 1]) for r in rows if r[1] == pool and key in r]
    return statistics.median(v) if v else float("nan")
put = med("versitygw", "put-rate")
print("\nmedians over rounds:")
for key in ("4k-flush-iops", "seqwrite-MBps", "seqread-MBps"):
    b, l = med("tank", key), med("bench", key)
    print(f"  {key:15} bucket {b:9.1f}  local {l:9.1f}  bucket/local {b / l:.2f}x")
print(f"  versitygw sequential conditional PUTs/s {put:.0f}; bucket FLUSH rate / PUT rate "
      f"{med('tank', '4k-flush-iops') / put:.2f}x (goal >= 0.5x)")
EOF
echo "(fio JSON, logs: $BENCH_DIR)" >&2
