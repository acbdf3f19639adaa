#!/usr/bin/env bash
# bench/nbd.sh: fio's nbd engine against Cistern and against nbdkit's file
# plugin, one run, same disk. A benchmark, not a test: it prints figures.
#
#   bash bench/nbd.sh                       # all targets, 15 s per timed test
#   RUNTIME=5 TARGETS="nbdkit cistern:off:16K" bash bench/nbd.sh
#   RUNTIME=5 TARGETS="cistern:off:16K cistern-tls:off:16K" bash bench/nbd.sh   # TLS vs plaintext
#   RUNTIME=5 SIZE=512M TARGETS="tls-ref:off:16K" bash bench/nbd.sh   # TLS cost: Cistern and nbdkit
#
# cistern-tls:COMP:VBS is the same target with `[nbd] tls = "require"` and
# client certificates (made with openssl in the bench dir); fio's nbd engine
# (libnbd) connects with nbds:// and finds its certificates in
# $HOME/.pki/libnbd, so HOME points at the bench dir for those fio runs. The
# summary prints the TLS / plaintext ratio when both targets ran.
#
# Tests (each target gets a fresh 1 GiB volume / file):
#   randwrite-4k-flush  8 jobs (8 connections), 4 KiB random writes, each
#                       followed by a FLUSH (fio --fsync=1), iodepth 1
#   seqwrite-1m         1 MiB sequential writes over the whole volume, iodepth 8
#   seqread-1m          1 MiB sequential reads of what seqwrite-1m wrote
# Prints IOPS, MB/s, p99 latency, the ratio Cistern/nbdkit of each test's
# main figure (IOPS for 4K, MB/s for 1M), the 4K job's ratio to the raw file
# (the physical limit), the intent log's durable writes per FLUSH served
# (group commit: below 1 when concurrent FLUSHes share a log write), and
# the daemon's peak/current RSS.
#
# Targets:
#   raw                   the 4K job with fio's psync engine on a raw file
#                         (fdatasync after each write): the disk's own limit
#   nbdkit                nbdkit's file plugin
#   cistern:COMP:VBS      a volume with compression COMP and volblocksize VBS
#   cistern:COMP:VBS:slog the same with a log device (SLOG) on $SLOG_DIR
#                         (tmpfs stands in for a fast device); the 4K job only
#   cistern-enc:COMP:VBS  the volume encrypted (aes-256-gcm, a hex key in a file);
#                         the report adds its ratio to cistern:COMP:VBS
#   cistern-tls:COMP:VBS  NBD over TLS (see above); the report adds its ratio
#   cistern-cmp:COMP:VBS  the fair comparison of the three (decision 0037): ONE
#                         daemon (`[nbd] tls = "on"`, so plaintext and TLS clients
#                         both connect) and one pool with a plain and an encrypted
#                         volume; each test runs plain, encrypted, and plain over
#                         TLS back to back, REPEAT times, so each ratio compares
#                         runs seconds apart under the same machine load (the
#                         load average is printed with each round). The ARC is
#                         capped at CMP_CACHE_MAX so sequential reads come from
#                         the devices (and are decrypted) instead of the ARC,
#                         which holds plaintext.
#   tls-ref:COMP:VBS      TLS against the machine's own reference (decision 0047):
#                         one Cistern daemon (`tls = "on"`) and one nbdkit file
#                         plugin (`--tls=on --tls-verify-peer`, the same
#                         certificates); each round reads 1 MiB sequentially from
#                         Cistern plain, Cistern TLS, nbdkit plain, nbdkit TLS
#                         with the same fio (libnbd, GnuTLS), back to back, and
#                         prints both TLS/plain ratios and their quotient
#                         (1.00 = Cistern's TLS costs what nbdkit's does). The
#                         negotiated cipher suites are printed from both servers'
#                         logs. With CMP_PIN=1 (default) each round also reads
#                         all four with the server on CPU 0 and fio on CPU 1.
#
# Environment:
#   RUNTIME=15          seconds per timed test (randwrite, seqread)
#   SIZE=1G             volume / file size
#   JOBS=8              jobs (= connections) of randwrite-4k-flush
#   COMPRESS_PCT=50     fio --buffer_compress_percentage (how compressible the data is)
#   TARGETS="raw nbdkit cistern:off:16K cistern:lz4:16K cistern:off:16K:slog cistern:lz4:16K:slog cistern:off:4K cistern:lz4:4K"
#   SLOG_DIR=/dev/shm   where the log device file of :slog targets goes
#   REPEAT=3            rounds of cistern-cmp
#   CMP_CACHE_MAX=64M   the ARC of cistern-cmp ([engine] cache_max_bytes; "" = default)
#   CMP_PIN=1           cistern-cmp also reads plain and TLS with the daemon pinned
#                       to CPU 0 and fio to CPU 1 (pin-plain, pin-tls), so the
#                       client's TLS decryption does not eat the daemon's CPU
#   CMP_NBDCOPY=1       cistern-cmp also times `nbdcopy URI null:` plain and TLS
#   POOL_LAYOUT=single  or "mirror" (two files on the same disk)
#   BENCH_DIR=bench/out/nbd-<time>   where files, logs and fio JSON go (same disk)
#   CISTERN_BIN=target/release/cistern  (built with cargo if missing)
#   DROP_CACHES=0       1: echo 3 > /proc/sys/vm/drop_caches before each read test (root)
#   KEEP_FILES=0        1: keep the disk images and pool devices (deleted after each target)
#   PREALLOC=0          1: the raw file, nbdkit's files and Cistern's pool devices are
#                       written full of zeros first (storage written once, as after a
#                       while in use): no target's sync then commits ext4 block
#                       allocations (0 = sparse files, the first-use case)
#   TESTS="randwrite-4k-flush seqwrite-1m seqread-1m"   which tests nbdkit and cistern:* run
#                       (seqread-1m reads what seqwrite-1m wrote)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNTIME="${RUNTIME:-15}"
SIZE="${SIZE:-1G}"
JOBS="${JOBS:-8}"
COMPRESS_PCT="${COMPRESS_PCT:-50}"
TARGETS="${TARGETS:-raw nbdkit cistern:off:16K cistern:lz4:16K cistern:off:16K:slog cistern:lz4:16K:slog cistern:off:4K cistern:lz4:4K}"
SLOG_DIR="${SLOG_DIR:-/dev/shm}"
POOL_LAYOUT="${POOL_LAYOUT:-single}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/nbd-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
DROP_CACHES="${DROP_CACHES:-0}"
REPEAT="${REPEAT:-3}"
CMP_CACHE_MAX="${CMP_CACHE_MAX-64M}"
CMP_PIN="${CMP_PIN:-1}"
CMP_NBDCOPY="${CMP_NBDCOPY:-1}"
KEEP_FILES="${KEEP_FILES:-0}"
PREALLOC="${PREALLOC:-0}"
TESTS="${TESTS:-randwrite-4k-flush seqwrite-1m seqread-1m}"

for tool in fio nbdkit python3; do
    command -v "$tool" >/dev/null || { echo "bench/nbd.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ " $TARGETS" == *" cistern:"* && ! -x "$CISTERN_BIN" ]]; then
    echo "==> building $CISTERN_BIN" >&2
    (cd "$ROOT" && cargo build --release -p cistern)
fi
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

# ---------------------------------------------------------------- processes
PIDS=() # stopped at exit by lib.sh's stop_pids
trap stop_pids EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- fio
# fio_as ARGS: fio, or for a TLS target fio with HOME=$FIO_HOME so libnbd
# finds the client certificate in $HOME/.pki/libnbd. libnbd ignores HOME
# for root (it reads /etc/pki/libnbd), so root runs fio as nobody there.
# FIO_CPUS: run fio pinned to those CPUs (taskset -c).
fio_as() {
    local pin=()
    [[ -z "${FIO_CPUS:-}" ]] || pin=(taskset -c "$FIO_CPUS")
    client_as "${pin[@]}" fio "$@"
}

# client_as CMD ARGS: CMD as the libnbd client (see fio_as) when FIO_HOME is set.
client_as() {
    if [[ -z "${FIO_HOME:-}" ]]; then
        "$@"
    elif [[ "$(id -u)" == 0 ]]; then
        setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$FIO_HOME" "$@"
    else
        HOME="$FIO_HOME" "$@"
    fi
}

# nbdcopy_timed URI: seconds nbdcopy takes to read the whole export (to null:).
nbdcopy_timed() {
    local t0 t1
    t0=$(date +%s.%N)
    nbdcopy "$1" null: || return 1
    t1=$(date +%s.%N)
    python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.4f}')" "$t0" "$t1"
}
export -f nbdcopy_timed

# cpu_ticks PID: user+system CPU time of a process (all its threads) so far, in clock ticks.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}

# fio_cpu JSON TEST: "client_cpu_seconds<TAB>bytes" of a fio run (usr+sys of its job).
fio_cpu() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
d = job["read"] if sys.argv[2].startswith("seqread") else job["write"]
print(f"{(job['usr_cpu'] + job['sys_cpu']) / 100 * job['job_runtime'] / 1000:.3f}\t{d['io_bytes']}")
EOF
}

# run_fio TARGET TEST URI -> JSON in $BENCH_DIR/TARGET.TEST.json, a row in results.tsv
run_fio() {
    local target="$1" test="$2" uri="$3" out="$BENCH_DIR/${1//[:\/]/_}.$2.json"
    # fio may run as nobody (fio_as): the file it writes is made here.
    : >"$out" && chmod 666 "$out"
    local common=(--ioengine=nbd "--uri=$uri" --output-format=json "--output=$out"
        "--buffer_compress_percentage=$COMPRESS_PCT" --buffer_compress_chunk=4k --refill_buffers)
    case "$test" in
    randwrite-4k-flush-raw)
        # The same job on a file: fdatasync after each write, one file region per job.
        local per_job
        per_job=$(python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30,'T':1<<40}; n=int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s); print(n//$JOBS//4096*4096)" "$SIZE")
        fio --name="$test" --ioengine=psync "--filename=$uri" --output-format=json "--output=$out" \
            "--buffer_compress_percentage=$COMPRESS_PCT" --buffer_compress_chunk=4k --refill_buffers \
            --rw=randwrite --bs=4k --iodepth=1 --fdatasync=1 \
            --numjobs="$JOBS" --size="$per_job" --offset_increment="$per_job" \
            --time_based --runtime="$RUNTIME" --ramp_time=1 --group_reporting >"$out.log" 2>&1
        ;;
    randwrite-4k-flush)
        local per_job
        per_job=$(python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30,'T':1<<40}; n=int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s); print(n//$JOBS//4096*4096)" "$SIZE")
        fio_as --name="$test" "${common[@]}" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 \
            --numjobs="$JOBS" --size="$per_job" --offset_increment="$per_job" \
            --time_based --runtime="$RUNTIME" --ramp_time=1 --group_reporting >"$out.log" 2>&1
        ;;
    seqwrite-1m)
        fio_as --name="$test" "${common[@]}" --rw=write --bs=1M --iodepth=8 --numjobs=1 \
            --size="$SIZE" --runtime=$((RUNTIME * 4)) --end_fsync=1 >"$out.log" 2>&1
        ;;
    seqread-1m)
        drop_caches
        fio_as --name="$test" "${common[@]}" --rw=read --bs=1M --iodepth=8 --numjobs=1 \
            --size="$SIZE" --time_based --runtime="$RUNTIME" >"$out.log" 2>&1
        ;;
    esac || { echo "fio $test on $target failed:" >&2; cat "$out.log" >&2; return 1; }
    python3 - "$target" "$test" "$out" >>"$RESULTS" <<'EOF'
import json, sys
target, test, path = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
test = test.removesuffix("-raw")
d = job["read"] if test.startswith("seqread") else job["write"]
p99 = d["clat_ns"]["percentile"].get("99.000000", 0) / 1e6
sync = job.get("sync", {}).get("lat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1e6
print(f"{test}\t{target}\t{d['iops']:.0f}\t{d['bw_bytes'] / 1e6:.1f}\t{p99:.2f}\t{sync:.2f}")
EOF
}

# ---------------------------------------------------------------- targets
# make_file PATH SIZE: a sparse file, or with PREALLOC=1 one written full of zeros.
make_file() {
    if [[ "$PREALLOC" == 1 ]]; then
        local mib=$(( $(numfmt --from=iec "$2") >> 20 ))
        dd if=/dev/zero of="$1" bs=1M count="$mib" oflag=direct status=none
    else
        truncate -s "$2" "$1"
    fi
}

# pool_devs VAR DIR: VAR = the `pool create` devices of a bench pool under
# DIR/disks (one file, or two mirrored with POOL_LAYOUT=mirror), made by make_file.
pool_devs() {
    local -n devs_out="$1"
    devs_out=("$2/disks/d0")
    [[ "$POOL_LAYOUT" != mirror ]] || devs_out=(mirror "$2/disks/d0" "$2/disks/d1")
    local d
    for d in "${devs_out[@]}"; do
        [[ "$d" == mirror ]] || make_file "$d" 4G
    done
}

bench_nbdkit() {
    local dir="$BENCH_DIR/nbdkit" port pid
    mkdir -p "$dir"
    make_file "$dir/disk.img" "$SIZE"
    port=$(free_port)
    nbdkit -f -i 127.0.0.1 -p "$port" file "$dir/disk.img" >"$dir/nbdkit.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$port" 30
    local uri="nbd://127.0.0.1:$port/"
    for t in $TESTS; do
        echo "   nbdkit-file $t" >&2
        run_fio nbdkit-file "$t" "$uri"
    done
    printf 'rss\tnbdkit-file\t%s\n' "$(rss "$pid")" >>"$RESULTS"
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -f "$dir/disk.img"
}

bench_raw() {
    local dir="$BENCH_DIR/raw"
    mkdir -p "$dir"
    make_file "$dir/disk.img" "$SIZE"
    echo "   raw-file randwrite-4k-flush" >&2
    run_fio raw-file randwrite-4k-flush-raw "$dir/disk.img"
    [[ "$KEEP_FILES" == 1 ]] || rm -f "$dir/disk.img"
}

# log_counters -> "syncs flushes records overlapped" of pool bench (cumulative)
log_counters() {
    python3 - "$CISTERN_API" <<'EOF'
import json, sys, urllib.request
import os
req = urllib.request.Request(sys.argv[1] + "/v1/pools/bench/iostat",
                             headers={"Authorization": "Bearer " + os.environ.get("CISTERN_TOKEN", "")})
s = json.load(urllib.request.urlopen(req, timeout=30))
print(s["log_syncs"], s["log_flushes"], s["log_records"], s.get("log_overlapped", 0))
EOF
}

# make_pki DIR: a CA, a server certificate for 127.0.0.1 and a client
# certificate (CN bench) in DIR/home/.pki/libnbd, where libnbd looks.
make_pki() {
    local d="$1" c="$1/home/.pki/libnbd"
    mkdir -p "$c"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$d/ca-key.pem" -out "$c/ca-cert.pem" -days 2 -subj "/CN=bench CA" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req "${ec[@]}" -keyout "$d/server-key.pem" -out "$d/server.csr" -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$c/ca-cert.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
        -out "$d/server-cert.pem" -days 2 -extfile "$d/server.ext" 2>/dev/null
    openssl req "${ec[@]}" -keyout "$c/client-key.pem" -out "$d/client.csr" -subj "/CN=bench" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
    openssl x509 -req -in "$d/client.csr" -CA "$c/ca-cert.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
        -out "$c/client-cert.pem" -days 2 -extfile "$d/client.ext" 2>/dev/null
    printf '[nbd]\ntls = "require"\ntls_cert = "%s"\ntls_key = "%s"\ntls_ca = "%s"\n' \
        "$d/server-cert.pem" "$d/server-key.pem" "$c/ca-cert.pem" >"$d/cistern.toml"
}

bench_cistern() { # compression volblocksize [slog|enc|tls]
    local comp="$1" vbs="$2" slog="" enc="" tls="" name="cistern-$1-$2${3:+-$3}"
    case "${3:-}" in
    slog) slog=slog ;;
    enc) enc=enc name="cistern-enc-$1-$2" ;;
    tls) tls=tls name="cistern-tls-$1-$2" ;;
    esac
    local dir="$BENCH_DIR/$name" nbd_port api_port pid config=() scheme=nbd
    mkdir -p "$dir/disks"
    if [[ -n "$tls" ]]; then
        make_pki "$dir/pki"
        chmod -R a+rX "$dir/pki" && chmod a+x "$BENCH_DIR" "$dir"
        config=(--config "$dir/pki/cistern.toml")
        scheme=nbds
        export FIO_HOME="$dir/pki/home"
    fi
    nbd_port=$(free_port)
    api_port=$(free_port)
    while [[ "$api_port" == "$nbd_port" ]]; do api_port=$(free_port); done
    "$CISTERN_BIN" serve --state-dir "$dir/state" --nbd "127.0.0.1:$nbd_port" --api "127.0.0.1:$api_port" \
        "${config[@]}" >"$dir/daemon.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$api_port" 60
    wait_port "$nbd_port" 60
    export CISTERN_API="http://127.0.0.1:$api_port"
    # The API answers once the token is published: wait for a CLI call to pass.
    for _ in $(seq 300); do "$CISTERN_BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
    CISTERN_TOKEN=$(cat "$dir/state/api.token")
    export CISTERN_TOKEN
    local devs
    pool_devs devs "$dir"
    local tests slogfile=""
    read -ra tests <<<"$TESTS"
    if [[ "$slog" == slog ]]; then
        slogfile="$SLOG_DIR/cistern-bench-slog-$$"
        rm -f "$slogfile"
        devs+=(log "$slogfile")
        tests=(randwrite-4k-flush)
    fi
    "$CISTERN_BIN" pool create -s 4G bench "${devs[@]}" >/dev/null
    local crypt=()
    if [[ -n "$enc" ]]; then
        od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$dir/volume.key"
        crypt=(-o encryption=on -o keyformat=hex -o "keylocation=file://$dir/volume.key")
    fi
    "$CISTERN_BIN" create -V "$SIZE" -o "compression=$comp" -o "volblocksize=$vbs" "${crypt[@]}" bench/vol >/dev/null
    local uri="$scheme://127.0.0.1:$nbd_port/bench/vol"
    for t in "${tests[@]}"; do
        echo "   $name $t" >&2
        local before after
        before=$(log_counters)
        run_fio "$name" "$t" "$uri"
        after=$(log_counters)
        if [[ "$t" == randwrite-4k-flush ]]; then
            printf 'log\t%s\t%s\t%s\n' "$name" "$before" "$after" >>"$RESULTS"
        fi
    done
    "$CISTERN_BIN" pool iostat -v bench >"$dir/iostat.txt" 2>&1 || true
    printf 'rss\t%s\t%s\n' "$name" "$(rss "$pid")" >>"$RESULTS"
    "$CISTERN_BIN" get compressratio,used,logicalused bench/vol >"$dir/props.txt" 2>&1 ||
        "$CISTERN_BIN" get all bench/vol >"$dir/props.txt" 2>&1 || true
    unset CISTERN_API CISTERN_TOKEN FIO_HOME
    stop_pids
    [[ -z "$slogfile" ]] || rm -f "$slogfile"
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/disks" "$dir/state"
    if grep -q "panicked at" "$dir/daemon.log"; then
        echo "warning: the daemon panicked, see $dir/daemon.log" >&2
    fi
}

bench_compare() { # compression volblocksize: plain, encrypted, TLS in one daemon
    local comp="$1" vbs="$2" name="cistern-cmp-$1-$2"
    local dir="$BENCH_DIR/$name" nbd_port api_port pid
    mkdir -p "$dir/disks"
    make_pki "$dir/pki"
    chmod -R a+rX "$dir/pki" && chmod a+x "$BENCH_DIR" "$dir"
    # Selective TLS: nbd:// and nbds:// clients of the same daemon.
    sed -i 's/^tls = "require"/tls = "on"/' "$dir/pki/cistern.toml"
    if [[ -n "$CMP_CACHE_MAX" ]]; then
        printf '[engine]\ncache_max_bytes = "%s"\n' "$CMP_CACHE_MAX" >>"$dir/pki/cistern.toml"
    fi
    nbd_port=$(free_port)
    api_port=$(free_port)
    while [[ "$api_port" == "$nbd_port" ]]; do api_port=$(free_port); done
    "$CISTERN_BIN" serve --state-dir "$dir/state" --nbd "127.0.0.1:$nbd_port" --api "127.0.0.1:$api_port" \
        --config "$dir/pki/cistern.toml" >"$dir/daemon.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$api_port" 60
    wait_port "$nbd_port" 60
    export CISTERN_API="http://127.0.0.1:$api_port"
    for _ in $(seq 300); do "$CISTERN_BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
    CISTERN_TOKEN=$(cat "$dir/state/api.token")
    export CISTERN_TOKEN
    local devs
    pool_devs devs "$dir"
    "$CISTERN_BIN" pool create -s 4G bench "${devs[@]}" >/dev/null
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$dir/volume.key"
    "$CISTERN_BIN" create -V "$SIZE" -o "compression=$comp" -o "volblocksize=$vbs" bench/plain >/dev/null
    "$CISTERN_BIN" create -V "$SIZE" -o "compression=$comp" -o "volblocksize=$vbs" \
        -o encryption=on -o keyformat=hex -o "keylocation=file://$dir/volume.key" bench/enc >/dev/null
    local round t v uri ticks0 ticks1 all_cpus
    all_cpus="0-$(($(nproc) - 1))"
    for ((round = 1; round <= REPEAT; round++)); do
        for t in randwrite-4k-flush seqwrite-1m seqread-1m; do
            printf 'load\t%s\t%s\t%s\n' "$round" "$t" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS"
            # TLS goes last: the plain volume it reads was last written over TLS.
            # pin-*: sequential reads again with the daemon on CPU 0 and fio on
            # CPU 1, so the client's own TLS decryption does not take the
            # daemon's CPU (client and daemon share the machine's cores).
            local variants=(plain enc tls)
            [[ "$t" == seqread-1m && "$CMP_PIN" == 1 && $(nproc) -ge 2 ]] && variants+=(pin-plain pin-tls)
            for v in "${variants[@]}"; do
                echo "   $name round $round $t $v" >&2
                case "$v" in
                plain | pin-plain) uri="nbd://127.0.0.1:$nbd_port/bench/plain" ;;
                enc) uri="nbd://127.0.0.1:$nbd_port/bench/enc" ;;
                tls | pin-tls) uri="nbds://127.0.0.1:$nbd_port/bench/plain" && export FIO_HOME="$dir/pki/home" ;;
                esac
                FIO_CPUS=""
                if [[ "$v" == pin-* ]]; then
                    taskset -a -p -c 0 "$pid" >/dev/null
                    FIO_CPUS=1
                fi
                ticks0=$(cpu_ticks "$pid")
                run_fio "cmp-${v/pin-/pin}-r$round" "$t" "$uri"
                ticks1=$(cpu_ticks "$pid")
                printf 'cpu\t%s\tcmp-%s-r%s\t%s\t%s\n' "$t" "${v/pin-/pin}" "$round" "$((ticks1 - ticks0))" \
                    "$(fio_cpu "$BENCH_DIR/cmp-${v/pin-/pin}-r$round.$t.json" "$t")" >>"$RESULTS"
                [[ "$v" != pin-* ]] || taskset -a -p -c "$all_cpus" "$pid" >/dev/null
                unset FIO_HOME FIO_CPUS
            done
            # libnbd's own copy tool over the same volume, plaintext then TLS.
            if [[ "$t" == seqread-1m && "$CMP_NBDCOPY" == 1 ]] && command -v nbdcopy >/dev/null; then
                local s_plain s_tls
                s_plain=$(nbdcopy_timed "nbd://127.0.0.1:$nbd_port/bench/plain")
                s_tls=$(FIO_HOME="$dir/pki/home" client_as bash -c 'nbdcopy_timed "$1"' _ "nbds://127.0.0.1:$nbd_port/bench/plain")
                printf 'nbdcopy\t%s\t%s\t%s\t%s\n' "$round" "$SIZE" "$s_plain" "$s_tls" >>"$RESULTS"
            fi
        done
    done
    "$CISTERN_BIN" pool iostat -v bench >"$dir/iostat.txt" 2>&1 || true
    printf 'rss\t%s\t%s\n' "$name" "$(rss "$pid")" >>"$RESULTS"
    unset CISTERN_API CISTERN_TOKEN
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/disks" "$dir/state"
    if grep -q "panicked at" "$dir/daemon.log"; then
        echo "warning: the daemon panicked, see $dir/daemon.log" >&2
    fi
}

bench_tls_ref() { # compression volblocksize: Cistern and nbdkit, plain and TLS
    local comp="$1" vbs="$2" name="tls-ref-$1-$2"
    local dir="$BENCH_DIR/$name" nbd_port api_port kit_port pid kit
    mkdir -p "$dir/disks" "$dir/kit-certs"
    make_pki "$dir/pki"
    # nbdkit takes a directory holding ca-cert.pem, server-cert.pem, server-key.pem.
    cp "$dir/pki/home/.pki/libnbd/ca-cert.pem" "$dir/pki/server-cert.pem" "$dir/pki/server-key.pem" "$dir/kit-certs/"
    chmod -R a+rX "$dir/pki" && chmod a+x "$BENCH_DIR" "$dir"
    sed -i 's/^tls = "require"/tls = "on"/' "$dir/pki/cistern.toml"
    if [[ -n "$CMP_CACHE_MAX" ]]; then
        printf '[engine]\ncache_max_bytes = "%s"\n' "$CMP_CACHE_MAX" >>"$dir/pki/cistern.toml"
    fi
    nbd_port=$(free_port)
    api_port=$(free_port)
    while [[ "$api_port" == "$nbd_port" ]]; do api_port=$(free_port); done
    RUST_LOG="${RUST_LOG:-info,nbd=debug}" "$CISTERN_BIN" serve --state-dir "$dir/state" --nbd "127.0.0.1:$nbd_port" \
        --api "127.0.0.1:$api_port" --config "$dir/pki/cistern.toml" >"$dir/daemon.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$api_port" 60
    wait_port "$nbd_port" 60
    export CISTERN_API="http://127.0.0.1:$api_port"
    for _ in $(seq 300); do "$CISTERN_BIN" pool list >/dev/null 2>&1 && break; sleep 0.1; done
    CISTERN_TOKEN=$(cat "$dir/state/api.token")
    export CISTERN_TOKEN
    make_file "$dir/disks/d0" 4G
    "$CISTERN_BIN" pool create -s 4G bench "$dir/disks/d0" >/dev/null
    "$CISTERN_BIN" create -V "$SIZE" -o "compression=$comp" -o "volblocksize=$vbs" bench/plain >/dev/null
    make_file "$dir/disks/kit.img" "$SIZE"
    kit_port=$(free_port)
    while [[ "$kit_port" == "$nbd_port" || "$kit_port" == "$api_port" ]]; do kit_port=$(free_port); done
    nbdkit -f -i 127.0.0.1 -p "$kit_port" --tls=on --tls-certificates="$dir/kit-certs" --tls-verify-peer \
        file "$dir/disks/kit.img" >"$dir/nbdkit.log" 2>&1 &
    kit=$!
    PIDS+=("$kit")
    wait_port "$kit_port" 30
    local c_plain="nbd://127.0.0.1:$nbd_port/bench/plain" c_tls="nbds://127.0.0.1:$nbd_port/bench/plain"
    local k_plain="nbd://127.0.0.1:$kit_port/" k_tls="nbds://127.0.0.1:$kit_port/"
    # Both hold the same kind of data (fio's buffers, COMPRESS_PCT), written in plaintext.
    echo "   $name fill" >&2
    run_fio "ref-cfill-r0" seqwrite-1m "$c_plain"
    run_fio "ref-kfill-r0" seqwrite-1m "$k_plain"
    # The suite each server agrees on with libnbd: Cistern logs it; nbdkit's
    # is asked of a second, verbose nbdkit on the same certificates.
    local vport
    vport=$(free_port)
    nbdkit -f -v -D nbdkit.tls.session=1 -i 127.0.0.1 -p "$vport" --tls=require --tls-certificates="$dir/kit-certs" \
        --tls-verify-peer memory 1M >"$dir/nbdkit-verbose.log" 2>&1 &
    local vpid=$!
    wait_port "$vport" 30
    FIO_HOME="$dir/pki/home" client_as nbdinfo --size "nbds://127.0.0.1:$vport/" >/dev/null 2>&1 || true
    kill "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    local round v uri who ticks0 ticks1 p
    for ((round = 1; round <= REPEAT; round++)); do
        printf 'load\t%s\tref\t%s\n' "$round" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS"
        local variants=(cplain ctls kplain ktls)
        [[ "$CMP_PIN" == 1 && $(nproc) -ge 2 ]] && variants+=(pcplain pctls pkplain pktls)
        for v in "${variants[@]}"; do
            echo "   $name round $round seqread-1m $v" >&2
            case "$v" in
            *cplain) uri="$c_plain" p="$pid" ;;
            *ctls) uri="$c_tls" p="$pid" && export FIO_HOME="$dir/pki/home" ;;
            *kplain) uri="$k_plain" p="$kit" ;;
            *ktls) uri="$k_tls" p="$kit" && export FIO_HOME="$dir/pki/home" ;;
            esac
            # p*: the server on CPU 0, fio on CPU 1 (the client's decryption
            # does not take the server's core).
            FIO_CPUS=""
            if [[ "$v" == p* ]]; then
                taskset -a -p -c 0 "$p" >/dev/null
                FIO_CPUS=1
            fi
            ticks0=$(cpu_ticks "$p")
            run_fio "ref-$v-r$round" seqread-1m "$uri"
            ticks1=$(cpu_ticks "$p")
            [[ "$v" != p* ]] || taskset -a -p -c "0-$(($(nproc) - 1))" "$p" >/dev/null
            unset FIO_CPUS
            printf 'cpu\tseqread-1m\tref-%s-r%s\t%s\t%s\n' "$v" "$round" "$((ticks1 - ticks0))" \
                "$(fio_cpu "$BENCH_DIR/ref-$v-r$round.seqread-1m.json" seqread-1m)" >>"$RESULTS"
            unset FIO_HOME
        done
    done
    local suite_c suite_k # Cistern logs it at debug when the TLS rounds connect
    suite_c=$(grep -o 'suite=Some("[A-Z0-9_]*")' "$dir/daemon.log" | head -1 | sed 's/suite=Some("\(.*\)")/\1/' || true)
    suite_k=$(grep -o 'TLS session: .*' "$dir/nbdkit-verbose.log" | head -1 || true)
    printf 'suite\tcistern\t%s\nsuite\tnbdkit\t%s\n' "${suite_c:-?}" "${suite_k:-?}" >>"$RESULTS"
    printf 'rss\t%s\t%s\n' "$name-cistern" "$(rss "$pid")" >>"$RESULTS"
    printf 'rss\t%s\t%s\n' "$name-nbdkit" "$(rss "$kit")" >>"$RESULTS"
    unset CISTERN_API CISTERN_TOKEN
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/disks" "$dir/state"
    if grep -q "panicked at" "$dir/daemon.log"; then
        echo "warning: the daemon panicked, see $dir/daemon.log" >&2
    fi
}

echo "==> bench/nbd.sh: RUNTIME=${RUNTIME}s SIZE=$SIZE JOBS=$JOBS COMPRESS_PCT=$COMPRESS_PCT POOL_LAYOUT=$POOL_LAYOUT" >&2
echo "    files on $(df -h --output=source,fstype "$BENCH_DIR" | tail -1 | tr -s ' ') in $BENCH_DIR" >&2
for t in $TARGETS; do
    case "$t" in
    raw) bench_raw ;;
    nbdkit) bench_nbdkit ;;
    cistern:*:*)
        IFS=: read -r _ comp vbs slog <<<"$t"
        bench_cistern "$comp" "$vbs" "$slog"
        ;;
    cistern-enc:*:*)
        IFS=: read -r _ comp vbs <<<"$t"
        bench_cistern "$comp" "$vbs" enc
        ;;
    cistern-tls:*:*)
        IFS=: read -r _ comp vbs <<<"$t"
        bench_cistern "$comp" "$vbs" tls
        ;;
    cistern-cmp:*:*)
        IFS=: read -r _ comp vbs <<<"$t"
        bench_compare "$comp" "$vbs"
        ;;
    tls-ref:*:*)
        IFS=: read -r _ comp vbs <<<"$t"
        bench_tls_ref "$comp" "$vbs"
        ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
done

# ---------------------------------------------------------------- report
python3 - "$RESULTS" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import sys
import os
rows, rss, logs, loads, cpu, copies, suites = [], {}, {}, {}, {}, [], {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "load":
        loads[(f[2], f[1])] = f[3]
    elif f[0] == "cpu":
        # (test, target) -> (daemon CPU-s, client CPU-s, bytes)
        cpu[(f[1], f[2])] = (int(f[3]) / os.sysconf("SC_CLK_TCK"), float(f[4]), int(f[5]))
    elif f[0] == "suite":
        suites[f[1]] = f[2]
    elif f[0] == "nbdcopy":
        copies.append(f[1:])
    elif f[0] == "rss":
        rss[f[1]] = f[2]
    elif f[0] == "log":
        b, a = [list(map(int, x.split())) for x in f[2:4]]
        logs[f[1]] = [y - x for x, y in zip(b, a)]
    else:
        rows.append(f)
base = {r[0]: r for r in rows if r[1] == "nbdkit-file"}
raw = next((r for r in rows if r[1] == "raw-file"), None)
print(f"{'test':<20} {'target':<22} {'IOPS':>9} {'MB/s':>9} {'p99 ms':>8} {'flush p99':>9} {'vs nbdkit':>9} {'vs raw':>7}")
for test in ("randwrite-4k-flush", "seqwrite-1m", "seqread-1m"):
    for r in (r for r in rows if r[0] == test):
        _, target, iops, mbs, p99, sp99 = r
        key = 2 if test.startswith("randwrite") else 3
        ratio = ""
        if test in base and target != "nbdkit-file" and float(base[test][key]) > 0:
            ratio = f"{float(r[key]) / float(base[test][key]):.2f}x"
        sp = sp99 if float(sp99) > 0 else "-"
        vs_raw = ""
        if test.startswith("randwrite") and raw and target != "raw-file" and float(raw[2]) > 0:
            vs_raw = f"{float(iops) / float(raw[2]):.2f}x"
        print(f"{test:<20} {target:<22} {iops:>9} {mbs:>9} {p99:>8} {sp:>9} {ratio:>9} {vs_raw:>7}")
enc = [r for r in rows if r[1].startswith("cistern-enc-")]
if enc:
    print()
    print("encrypted vs plain (same compression and volblocksize), main figure:")
    for r in enc:
        test, target = r[0], r[1]
        plain = next((p for p in rows if p[0] == test and p[1] == target.replace("cistern-enc-", "cistern-")), None)
        key = 2 if test.startswith("randwrite") else 3
        if plain and float(plain[key]) > 0:
            ratio = float(r[key]) / float(plain[key])
            print(f"  {test:<20} {target:<20} {ratio:.2f}x  (cost {100 * (1 - ratio):+.0f}%)")
tls = [(r, p) for r in rows if r[1].startswith("cistern-tls-")
       for p in rows if p[0] == r[0] and p[1] == "cistern-" + r[1][len("cistern-tls-"):]]
if tls:
    print()
    print(f"{'TLS / plaintext':<20} {'target':<20} {'ratio':>9}")
    for r, p in tls:
        key = 2 if r[0].startswith("randwrite") else 3
        if float(p[key]) > 0:
            print(f"{r[0]:<20} {r[1]:<20} {float(r[key]) / float(p[key]):>8.2f}x")
cmp = {}
for r in rows:
    if r[1].startswith("cmp-"):
        _, kind, rnd = r[1].split("-")
        cmp[(r[0], rnd[1:], kind)] = r
if cmp:
    import statistics
    print()
    print("cistern-cmp: one daemon, plain / encrypted / TLS back to back (main figure, ratio to plain):")
    print(f"{'test':<20} {'round':>5} {'load':>6} {'plain':>9} {'enc':>9} {'tls':>9} {'enc/plain':>10} {'tls/plain':>10}")
    med = {}
    for test in ("randwrite-4k-flush", "seqwrite-1m", "seqread-1m"):
        key = 2 if test.startswith("randwrite") else 3
        for rnd in sorted({k[1] for k in cmp if k[0] == test}, key=int):
            p, e, t = (cmp.get((test, rnd, k)) for k in ("plain", "enc", "tls"))
            if not p or float(p[key]) <= 0:
                continue
            fig = lambda r: f"{float(r[key]):.0f}" if r else "-"
            ratio = lambda r: float(r[key]) / float(p[key]) if r else None
            re, rt = ratio(e), ratio(t)
            med.setdefault((test, "enc"), []).append(re)
            med.setdefault((test, "tls"), []).append(rt)
            show = lambda x: f"{x:.2f}x" if x is not None else "-"
            print(f"{test:<20} {rnd:>5} {loads.get((test, rnd), '-'):>6} {fig(p):>9} {fig(e):>9} {fig(t):>9} {show(re):>10} {show(rt):>10}")
    print("median:", ", ".join(f"{t} {k}/plain {statistics.median(x for x in v if x is not None):.2f}x"
                               for (t, k), v in med.items() if any(x is not None for x in v)))
    print("(figures: IOPS for randwrite-4k-flush, MB/s for the 1M tests; targets: enc >= 0.85x, tls >= 0.8x sequential)")
    # Where the CPU goes: client and daemon share the machine's cores, so
    # TLS costs twice (the daemon encrypts, fio's GnuTLS decrypts).
    if cpu:
        print()
        print("CPU-seconds per GB moved (daemon: all its threads; client: fio usr+sys):")
        print(f"{'test':<20} {'variant':<9} {'daemon':>8} {'client':>8} {'sum':>8}   (median of rounds)")
        for test in ("seqwrite-1m", "seqread-1m"):
            for kind in ("plain", "enc", "tls", "pinplain", "pintls"):
                per = [(d / (b / 1e9), c / (b / 1e9)) for (t, tg), (d, c, b) in cpu.items()
                       if t == test and tg.split("-")[1] == kind and b > 0]
                if per:
                    dm = statistics.median(x for x, _ in per)
                    cm = statistics.median(y for _, y in per)
                    print(f"{test:<20} {kind:<9} {dm:>8.2f} {cm:>8.2f} {dm + cm:>8.2f}")
    pin = []
    for rnd in sorted({k[1] for k in cmp if k[0] == "seqread-1m"}, key=int):
        p, t = cmp.get(("seqread-1m", rnd, "pinplain")), cmp.get(("seqread-1m", rnd, "pintls"))
        if p and t and float(p[3]) > 0:
            pin.append(float(t[3]) / float(p[3]))
            print(f"seqread-1m pinned (daemon CPU 0, fio CPU 1) round {rnd}: plain {float(p[3]):.0f} MB/s, "
                  f"TLS {float(t[3]):.0f} MB/s, tls/plain {pin[-1]:.2f}x")
    if pin:
        print(f"median pinned seqread-1m tls/plain {statistics.median(pin):.2f}x")
    if copies:
        r = []
        for rnd, size, sp, st in copies:
            r.append(float(sp) / float(st))
            print(f"nbdcopy URI null: round {rnd} ({size}): plain {float(sp):.2f} s, TLS {float(st):.2f} s, "
                  f"tls/plain throughput {r[-1]:.2f}x")
        print(f"median nbdcopy tls/plain {statistics.median(r):.2f}x (libnbd's nbdcopy, its default connections, GnuTLS)")
ref = {}
for r in rows:
    if r[1].startswith("ref-") and r[0] == "seqread-1m":
        _, kind, rnd = r[1].split("-")
        ref[(rnd[1:], kind)] = float(r[3])
if ref:
    import statistics
    print()
    print("tls-ref: seqread-1m MB/s, Cistern and nbdkit (file plugin), plaintext and TLS, same fio/libnbd/GnuTLS client:")
    for who, s in suites.items():
        print(f"  negotiated suite, {who}: {s}")
    print(f"{'round':>5} {'load':>6} {'cistern':>8} {'c-tls':>8} {'nbdkit':>8} {'k-tls':>8} {'cistern tls/plain':>18} {'nbdkit tls/plain':>17} {'quotient':>9}")
    rc, rk, rq = [], [], []
    for rnd in sorted({k[0] for k in ref}, key=int):
        cp, ct, kp, kt = (ref.get((rnd, k)) for k in ("cplain", "ctls", "kplain", "ktls"))
        if not (cp and ct and kp and kt):
            continue
        rc.append(ct / cp); rk.append(kt / kp); rq.append(rc[-1] / rk[-1])
        print(f"{rnd:>5} {loads.get(('ref', rnd), '-'):>6} {cp:>8.0f} {ct:>8.0f} {kp:>8.0f} {kt:>8.0f} {rc[-1]:>17.2f}x {rk[-1]:>16.2f}x {rq[-1]:>9.2f}")
    if rc:
        print(f"median: Cistern tls/plain {statistics.median(rc):.2f}x, nbdkit tls/plain {statistics.median(rk):.2f}x, "
              f"quotient {statistics.median(rq):.2f} (target: Cistern >= 0.80x)")
    pc, pk = [], []
    for rnd in sorted({k[0] for k in ref}, key=int):
        cp, ct, kp, kt = (ref.get((rnd, k)) for k in ("pcplain", "pctls", "pkplain", "pktls"))
        if cp and ct and kp and kt:
            pc.append(ct / cp); pk.append(kt / kp)
            print(f"pinned (server CPU 0, fio CPU 1) round {rnd}: Cistern {cp:.0f} / {ct:.0f} MB/s = {pc[-1]:.2f}x, "
                  f"nbdkit {kp:.0f} / {kt:.0f} MB/s = {pk[-1]:.2f}x")
    if pc:
        print(f"median pinned: Cistern tls/plain {statistics.median(pc):.2f}x, nbdkit tls/plain {statistics.median(pk):.2f}x")
    print(f"{'CPU-s per GB':<14} {'server':>8} {'client':>8} {'sum':>8}   (median of rounds)")
    for kind in ("cplain", "ctls", "kplain", "ktls", "pcplain", "pctls", "pkplain", "pktls"):
        per = [(d / (b / 1e9), c / (b / 1e9)) for (t, tg), (d, c, b) in cpu.items()
               if t == "seqread-1m" and tg.startswith("ref-" + kind + "-") and b > 0]
        if per:
            dm = statistics.median(x for x, _ in per)
            cm = statistics.median(y for _, y in per)
            print(f"  {kind:<12} {dm:>8.2f} {cm:>8.2f} {dm + cm:>8.2f}")
print()
if logs:
    print("intent log during randwrite-4k-flush (group commit):")
    for t, (syncs, flushes, records, *more) in logs.items():
        per = f"{syncs / flushes:.3f}" if flushes else "-"
        over = f", {more[0]} writes overlapped another" if more else ""
        print(f"  {t:<22} {syncs:>8} log syncs / {flushes:>8} FLUSHes = {per} syncs per FLUSH, {records} records{over}")
    print()
print("peak RSS (VmHWM) / RSS at the end, MiB:")
for t, v in rss.items():
    h, r = v.split()
    print(f"  {t:<20} {h:>6} / {r}")
print()
print("ratio = Cistern / nbdkit on IOPS (4K) or MB/s (1M); issue 15 targets >= 1.5x nbdkit on 4K+flush;")
print("vs raw = IOPS / the same 4K job on a raw file with fdatasync (the disk's limit); :slog targets put the log on tmpfs")
if enc:
    print("encryption target: at most 15% cost on sequential throughput (AES-NI: grep -c aes /proc/cpuinfo)")
if tls:
    print("TLS / plaintext: same volume settings, fio's nbd engine over nbds:// (libnbd, GnuTLS) vs nbd://; target >= 0.8x sequential")
EOF
echo "(raw fio JSON, logs: $BENCH_DIR)" >&2
