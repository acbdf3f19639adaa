#!/usr/bin/env bash
# bench/s3.sh: `cistern bench` (the same Rust load generator, SigV4 over
# keep-alive HTTP/1.1) against Cistern's S3 endpoint and against MinIO, one
# run, same disk. A benchmark, not a test: it prints figures.
#
#   bash bench/s3.sh                                   # everything, 15 s per timed test
#   RUNTIME=5 LIST_OBJECTS=10000 TARGETS="minio cistern" bash bench/s3.sh
#
# Tests (each target a fresh server with its data under BENCH_DIR):
#   put-4k    CLIENTS clients PUT new 4 KiB objects for RUNTIME s (keys 0, 1, 2, ...)
#   get-4k    CLIENTS clients GET random ones of the first OBJECTS_4K keys (put first if missing)
#   put-1m    the same with 1 MiB objects
#   get-1m    (random ones of the first OBJECTS_1M keys)
#   head      HEAD round trips on one connection (bench latency)
#   list      full ListObjectsV2 listings (1000 keys a page) of a bucket of
#             LIST_OBJECTS objects of LIST_OBJECT_SIZE, put first by CLIENTS clients
# Prints ops/s, MB/s, p99 latency, the ratio Cistern/MinIO (ops/s; objects
# listed per second for list) and each daemon's peak and final RSS.
# Targets of issue 11: >= 1.5x on 4 KiB PUT and GET, >= 1.0x on 1 MiB and LIST.
#
# Environment:
#   RUNTIME=15            seconds per timed test
#   CLIENTS=16            concurrent clients (connections) of put/get and of populating
#   OBJECTS_4K=20000      keys the 4 KiB GETs pick from
#   OBJECTS_1M=500        keys the 1 MiB GETs pick from
#   LIST_OBJECTS=100000   objects of the listed bucket
#   LIST_OBJECT_SIZE=1K   their size
#   LIST_REPEAT=3         measured listings (after one unmeasured)
#   TESTS="put-4k get-4k put-1m get-1m head list"
#   TARGETS="minio cistern"
#   BENCH_DIR=bench/out/s3-<time>   data, logs and JSON results (the disk measured)
#   CISTERN_BIN=target/release/cistern  (built with cargo if missing)
#   POOL_SIZE=32G         size of Cistern's file-backed pool device (sparse)
#   COMPRESSION=off       compression of Cistern's buckets
#   MINIO_BIN=/work/cache/minio/bin/minio  (built with `go install` into its
#                         directory's parent if missing: ~15 min, once)
#   KEEP_FILES=0          1: keep the servers' data after the run
#   PERF=0                1: `perf record -g` each daemon during the timed tests
#                         (perf.data next to its logs)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNTIME="${RUNTIME:-15}"
CLIENTS="${CLIENTS:-16}"
OBJECTS_4K="${OBJECTS_4K:-20000}"
OBJECTS_1M="${OBJECTS_1M:-500}"
LIST_OBJECTS="${LIST_OBJECTS:-100000}"
LIST_OBJECT_SIZE="${LIST_OBJECT_SIZE:-1K}"
LIST_REPEAT="${LIST_REPEAT:-3}"
TESTS="${TESTS:-put-4k get-4k put-1m get-1m head list}"
TARGETS="${TARGETS:-minio cistern}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/s3-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
POOL_SIZE="${POOL_SIZE:-32G}"
COMPRESSION="${COMPRESSION:-off}"
MINIO_BIN="${MINIO_BIN:-/work/cache/minio/bin/minio}"
KEEP_FILES="${KEEP_FILES:-0}"
PERF="${PERF:-0}"

command -v python3 >/dev/null || { echo "bench/s3.sh: python3 is not installed" >&2; exit 1; }
if [[ ! -x "$CISTERN_BIN" ]]; then
    echo "==> building $CISTERN_BIN" >&2
    (cd "$ROOT" && cargo build --release -p cistern)
fi
if [[ " $TARGETS " == *" minio "* && ! -x "$MINIO_BIN" ]]; then
    # Outside the repository, once: the Go toolchain's caches go beside it.
    cache="$(dirname "$(dirname "$MINIO_BIN")")"
    command -v go >/dev/null || { echo "bench/s3.sh: no $MINIO_BIN and no go to build it (set MINIO_BIN)" >&2; exit 1; }
    echo "==> building MinIO into $cache (go install github.com/minio/minio@latest, ~15 min, log: $cache/install.log)" >&2
    mkdir -p "$cache"
    GOBIN="$(dirname "$MINIO_BIN")" GOPATH="$cache/gopath" GOFLAGS=-modcacherw \
        go install github.com/minio/minio@latest >"$cache/install.log" 2>&1 ||
        { tail -20 "$cache/install.log" >&2; exit 1; }
fi
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

# ---------------------------------------------------------------- processes
PIDS=() # stopped at exit by lib.sh's stop_pids
trap stop_pids EXIT
trap 'exit 130' INT TERM


PERF_PID=""
perf_start() { # daemon pid, output file
    [[ "$PERF" == 1 ]] || return 0
    perf record -g -o "$2" -p "$1" >/dev/null 2>&1 &
    PERF_PID=$!
}
perf_stop() {
    [[ -n "$PERF_PID" ]] || return 0
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    PERF_PID=""
}

# ---------------------------------------------------------------- the load
bench() { "$CISTERN_BIN" bench "$@"; }

# run_tests TARGET DIR PID: every test in $TESTS against the endpoint in AWS_*;
# the data bucket is s3://$BUCKET, the listed one s3://$LIST_BUCKET.
run_tests() {
    local target="$1" dir="$2" pid="$3" t out
    for t in $TESTS; do
        echo "   $target $t" >&2
        out="$dir/$t"
        mkdir -p "$out"
        case "$t" in
        put-4k | get-4k | put-1m | get-1m)
            local rw=randwrite bs=4K n="$OBJECTS_4K"
            [[ "$t" == get-* ]] && rw=randread
            [[ "$t" == *-1m ]] && bs=1M n="$OBJECTS_1M"
            perf_start "$pid" "$dir/perf-$t.data"
            bench iops "s3://$BUCKET/${t#*-}" --rw "$rw" -b "$bs" --objects "$n" -w "$CLIENTS" \
                -d "${RUNTIME}s" --name "$target-$t" -o "$out" --no-progress >"$out/log" 2>&1 ||
                { perf_stop; echo "$t on $target failed:" >&2; cat "$out/log" >&2; return 1; }
            perf_stop
            python3 - "$t" "$target" "$out" >>"$RESULTS" <<'EOF'
import glob, json, sys
test, target, out = sys.argv[1:]
r = json.load(open(glob.glob(out + "/*.json")[0]))
ops = r["total_ops"] / r["duration_s"]
print(f"{test}\t{target}\t{ops:.0f}\t{r['mb_per_s']:.1f}\t{r['latency']['p99_ns'] / 1e6:.2f}\t{r['latency']['p50_ns'] / 1e6:.2f}")
EOF
            ;;
        head)
            bench latency "s3://$BUCKET/head" -n 5000 --json >"$out/latency.json" 2>"$out/log" ||
                { echo "$t on $target failed:" >&2; cat "$out/log" >&2; return 1; }
            python3 - "$t" "$target" "$out/latency.json" >>"$RESULTS" <<'EOF'
import json, sys
test, target, path = sys.argv[1:]
r = json.load(open(path))
print(f"{test}\t{target}\t{r['requests_per_s']:.0f}\t-\t{r['latency']['p99_ns'] / 1e6:.2f}\t{r['latency']['p50_ns'] / 1e6:.2f}")
EOF
            ;;
        list)
            perf_start "$pid" "$dir/perf-$t.data"
            bench list "s3://$LIST_BUCKET" -n "$LIST_OBJECTS" --object-size "$LIST_OBJECT_SIZE" \
                -w "$CLIENTS" -r "$LIST_REPEAT" --json >"$out/list.json" 2>"$out/log" ||
                { perf_stop; echo "$t on $target failed:" >&2; cat "$out/log" >&2; return 1; }
            perf_stop
            python3 - "$t" "$target" "$out/list.json" >>"$RESULTS" <<'EOF'
import json, sys
test, target, path = sys.argv[1:]
r = json.load(open(path))
# ops/s = objects listed per second; p99/p50 of one page; then populate PUT/s
put = r["populated"] / r["populate_s"] if r["populated"] else 0
print(f"{test}\t{target}\t{r['objects_per_s']:.0f}\t-\t{r['page_latency']['p99_ns'] / 1e6:.2f}\t{r['page_latency']['p50_ns'] / 1e6:.2f}\t{r['listing']['mean']:.3f}\t{put:.0f}")
EOF
            ;;
        *) echo "unknown test $t" >&2; return 2 ;;
        esac
        printf 'rss-after\t%s\t%s\t%s\n' "$target" "$t" "$(rss "$pid")" >>"$RESULTS"
    done
}

# ---------------------------------------------------------------- targets
bench_minio() {
    local dir="$BENCH_DIR/minio" port console pid
    mkdir -p "$dir/data"
    port=$(free_port)
    console=$(free_port)
    while [[ "$console" == "$port" ]]; do console=$(free_port); done
    MINIO_ROOT_USER=benchadmin MINIO_ROOT_PASSWORD=benchadmin-secret \
        "$MINIO_BIN" server --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
        "$dir/data" >"$dir/minio.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" 60
    export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=benchadmin \
        AWS_SECRET_ACCESS_KEY=benchadmin-secret AWS_REGION=us-east-1
    BUCKET=bench LIST_BUCKET=benchlist
    # MinIO answers before it has loaded its state: retry the first request.
    # (bench latency -n 1 --create-bucket: creates the bucket, leaves no object.)
    local i
    for i in $(seq 50); do
        bench latency "s3://$BUCKET" --create-bucket -n 1 --warmup 0 >/dev/null 2>&1 && break
        sleep 0.2
    done
    bench latency "s3://$LIST_BUCKET" --create-bucket -n 1 --warmup 0 >/dev/null
    "$MINIO_BIN" --version | head -1 >"$dir/version"
    run_tests minio "$dir" "$pid"
    printf 'rss\tminio\t%s\n' "$(rss "$pid")" >>"$RESULTS"
    du -sh "$dir/data" >"$dir/du.txt" 2>&1 || true
    unset AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/data"
}

bench_cistern() {
    local dir="$BENCH_DIR/cistern" s3_port api_port nbd_port pid
    mkdir -p "$dir/disks"
    s3_port=$(free_port)
    api_port=$(free_port)
    nbd_port=$(free_port)
    while [[ "$api_port" == "$s3_port" ]]; do api_port=$(free_port); done
    while [[ "$nbd_port" == "$s3_port" || "$nbd_port" == "$api_port" ]]; do nbd_port=$(free_port); done
    # S3 bucket NAME is the dataset bench/NAME.
    printf '[s3]\nparent = "bench"\n' >"$dir/cistern.toml"
    "$CISTERN_BIN" serve --config "$dir/cistern.toml" --state-dir "$dir/state" --api "127.0.0.1:$api_port" \
        --nbd "127.0.0.1:$nbd_port" --s3 "127.0.0.1:$s3_port" >"$dir/daemon.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$api_port" 60
    wait_port "$s3_port" 60
    export CISTERN_API="http://127.0.0.1:$api_port"
    "$CISTERN_BIN" pool create -s "$POOL_SIZE" bench "$dir/disks/d0" >/dev/null
    BUCKET=bench LIST_BUCKET=benchlist
    local b
    for b in "$BUCKET" "$LIST_BUCKET"; do
        "$CISTERN_BIN" create -t bucket -o "compression=$COMPRESSION" "bench/$b" >/dev/null
    done
    # A user with a key and read-write grants on both buckets.
    read -r _ AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY < <("$CISTERN_BIN" user add -H \
        -g "$BUCKET=rw" -g "$LIST_BUCKET=rw" bench)
    export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    export AWS_ENDPOINT_URL="http://127.0.0.1:$s3_port" AWS_REGION=us-east-1
    run_tests cistern "$dir" "$pid"
    printf 'rss\tcistern\t%s\n' "$(rss "$pid")" >>"$RESULTS"
    "$CISTERN_BIN" list -o name,used,logicalused,compressratio >"$dir/datasets.txt" 2>&1 || true
    unset CISTERN_API AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/disks" "$dir/state"
    if grep -q "panicked at" "$dir/daemon.log"; then
        echo "warning: the daemon panicked, see $dir/daemon.log" >&2
    fi
}

echo "==> bench/s3.sh: RUNTIME=${RUNTIME}s CLIENTS=$CLIENTS OBJECTS_4K=$OBJECTS_4K OBJECTS_1M=$OBJECTS_1M LIST_OBJECTS=$LIST_OBJECTS" >&2
echo "    files on $(df -h --output=source,fstype "$BENCH_DIR" | tail -1 | tr -s ' ') in $BENCH_DIR" >&2
for t in $TARGETS; do
    case "$t" in
    minio) bench_minio ;;
    cistern) bench_cistern ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
done

# ---------------------------------------------------------------- report
python3 - "$RESULTS" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import sys
rows, rss, after = [], {}, {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "rss":
        rss[f[1]] = f[2]
    elif f[0] == "rss-after":
        after.setdefault(f[1], []).append(f"{f[2]} {f[3].split()[0]}")
    else:
        rows.append(f)
base = {r[0]: r for r in rows if r[1] == "minio"}
target = {"put-4k": 1.5, "get-4k": 1.5, "put-1m": 1.0, "get-1m": 1.0, "list": 1.0}
print(f"{'test':<8} {'target':<16} {'ops/s':>9} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'vs MinIO':>9} {'goal':>5}")
for test in ("put-4k", "get-4k", "put-1m", "get-1m", "head", "list"):
    for r in (r for r in rows if r[0] == test):
        ops, mbs, p99, p50 = r[2], r[3], r[4], r[5]
        ratio = ""
        if test in base and r[1] != "minio" and float(base[test][2]) > 0:
            ratio = f"{float(ops) / float(base[test][2]):.2f}x"
        goal = f"{target[test]:.1f}x" if test in target and ratio else ""
        print(f"{test:<8} {r[1]:<16} {ops:>9} {mbs:>8} {p50:>8} {p99:>8} {ratio:>9} {goal:>5}")
lists = [r for r in rows if r[0] == "list"]
if lists:
    print()
    print("list: ops/s = objects listed per second; p50/p99 of one 1000-key page; one full listing, populating:")
    for r in lists:
        print(f"  {r[1]:<9} {float(r[6]):.3f} s a listing; populated at {r[7]} PUT/s")
print()
print("peak RSS (VmHWM) / RSS at the end, MiB:")
for t, v in rss.items():
    h, r = v.split()
    print(f"  {t:<9} {h:>6} / {r}   peak after each test: {', '.join(after.get(t, []))}")
print()
print("ops/s: PUT/GET per second (head: HEAD round trips on one connection); ratio = Cistern / MinIO")
EOF
echo "(JSON results, logs: $BENCH_DIR)" >&2
