#!/usr/bin/env bash
# bench/nfs-copy.sh: copies through libnfs (nfs-cp, nfs-cat) to Cistern's NFS
# server and to nfs-ganesha (Debian's 4.3, FSAL VFS) exporting a directory on
# the same disk, one run each. A benchmark, not a test: it prints figures.
#
#   bash bench/nfs-copy.sh
#   SIZE=64M SMALL_FILES=200 bash bench/nfs-copy.sh
#
# Tests, same on both servers:
#   big-put     nfs-cp of one SIZE file of random data (256 MiB)
#   big-get     nfs-cat of it to /dev/null (caches dropped first when root)
#   small-put   SMALL_FILES files of 4 KiB (2,000), one nfs-cp each (each pays
#               a connection and a MOUNT, on both servers alike)
# Prints MB/s or files/s, Cistern / ganesha (> 1: Cistern faster) and each
# server's peak and final RSS.
#
# Ganesha registers with rpcbind and will not start without one, so both run
# in a private network and mount namespace (unshare: their own loopback and
# /run, nothing listens on the host); the clients enter it with nsenter.
# Cistern: `serve` with `[nfs] listen` on a free loopback port, a pool of one
# sparse file in BENCH_DIR, filesystem bench/fs with sharenfs=rw,no_root_squash.
#
# Environment: SIZE=256M SMALL_FILES=2000 POOL_SIZE=8G DROP_CACHES=1
#   BENCH_DIR=bench/out/nfs-copy-<time>  CISTERN_BIN=target/release/cistern
#   TARGETS="ganesha cistern"  KEEP_FILES=0
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE="${SIZE:-256M}"
SMALL_FILES="${SMALL_FILES:-2000}"
POOL_SIZE="${POOL_SIZE:-8G}"
TARGETS="${TARGETS:-ganesha cistern}"
export DROP_CACHES="${DROP_CACHES:-1}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/nfs-copy-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
KEEP_FILES="${KEEP_FILES:-0}"

for tool in nfs-cp nfs-cat curl python3 ganesha.nfsd rpcbind unshare nsenter ip; do
    command -v "$tool" >/dev/null || { echo "bench/nfs-copy.sh: $tool is not installed" >&2; exit 1; }
done
if [[ " $TARGETS " == *" cistern "* && ! -x "$CISTERN_BIN" ]]; then
    (cd "$ROOT" && cargo build --release -p cistern)
fi
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

PIDS=()
stop_all() {
    local p
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

bytes() { python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))" "$1"; }
rss() { awk '/VmHWM/ {h=$2} /VmRSS/ {r=$2} END {printf "%d %d", h/1024, r/1024}' "/proc/$1/status"; }
NETNS=""
inns() { if [[ -n "$NETNS" ]]; then nsenter --net="/proc/$NETNS/ns/net" "$@"; else "$@"; fi; }

# Seconds a command takes (its output discarded).
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    inns "$@" >/dev/null
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.4f}')"
}

make_sources() {
    local src="$BENCH_DIR/src"
    [[ -f "$src/big" ]] && return 0
    mkdir -p "$src/small"
    head -c "$(bytes "$SIZE")" /dev/urandom >"$src/big"
    python3 - "$src/small" "$SMALL_FILES" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(f"{d}/s{i:05d}", "wb") as f:
        f.write(os.urandom(4096))
EOF
    sync
}

run_tests() { # target base-url query server-pid
    local target="$1" base="$2" q="$3" spid="$4" t n
    n=$(bytes "$SIZE")
    echo "   $target big-put" >&2
    t=$(timed nfs-cp "$BENCH_DIR/src/big" "$base/big?$q")
    printf 'big-put\t%s\t%s\tMB/s\n' "$target" "$(python3 -c "print(f'{$n / 1e6 / $t:.1f}')")" >>"$RESULTS"
    drop_caches
    echo "   $target big-get" >&2
    t=$(timed nfs-cat "$base/big?$q")
    printf 'big-get\t%s\t%s\tMB/s\n' "$target" "$(python3 -c "print(f'{$n / 1e6 / $t:.1f}')")" >>"$RESULTS"
    echo "   $target small-put ($SMALL_FILES files)" >&2
    t=$(inns python3 - "$BENCH_DIR/src/small" "$base" "$q" <<'EOF'
import os, subprocess, sys, time
src, base, q = sys.argv[1:]
t = time.perf_counter()
for n in sorted(os.listdir(src)):
    subprocess.run(["nfs-cp", f"{src}/{n}", f"{base}/{n}?{q}"], check=True, stdout=subprocess.DEVNULL)
print(f"{time.perf_counter() - t:.4f}")
EOF
)
    printf 'small-put\t%s\t%s\tfiles/s\n' "$target" "$(python3 -c "print(f'{$SMALL_FILES / $t:.0f}')")" >>"$RESULTS"
    # The copy is checked, not only timed.
    inns nfs-cat "$base/big?$q" | cmp - "$BENCH_DIR/src/big"
    inns nfs-cat "$base/s00007?$q" | cmp - "$BENCH_DIR/src/small/s00007"
    printf 'rss\t%s\t%s\n' "$target" "$(rss "$spid")" >>"$RESULTS"
}

bench_ganesha() {
    local dir="$BENCH_DIR/ganesha" gpid i
    rm -rf "$dir/export"
    mkdir -p "$dir/export" "$dir/recovery"
    cat >"$dir/ganesha.conf" <<EOF
NFS_CORE_PARAM {
    NFS_Port = 2049;
    MNT_Port = 20048;
    Protocols = 3;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}
NFSV4 { Graceless = true; RecoveryBackend = fs; RecoveryRoot = "$dir/recovery"; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
    Export_Id = 1;
    Path = "$dir/export";
    Pseudo = /export;
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL { Name = VFS; }
}
EOF
    unshare --net --mount --propagation private bash -c '
        set -e
        ip link set lo up
        mount -t tmpfs nfscopy-run /run
        mkdir -p /run/rpcbind /run/ganesha
        rpcbind -f & r=$!
        for i in $(seq 50); do [ -S /run/rpcbind.sock ] && break; sleep 0.1; done
        ganesha.nfsd -F -f "$1/ganesha.conf" -L "$1/ganesha.log" -p "$1/ganesha.pid" -N NIV_EVENT & g=$!
        trap "kill -TERM \$g 2>/dev/null; wait \$g; kill -TERM \$r; wait \$r; exit 0" TERM INT
        wait $g || true
        kill -TERM $r; wait $r || true' nfscopy-ns "$dir" >"$dir/ns.log" 2>&1 &
    NETNS=$!
    PIDS+=("$NETNS")
    for ((i = 0; i < 300; i++)); do
        inns bash -c 'exec 3<>/dev/tcp/127.0.0.1/2049' 2>/dev/null && break
        kill -0 "$NETNS" 2>/dev/null || { cat "$dir/ns.log" "$dir/ganesha.log" >&2; exit 1; }
        sleep 0.1
    done
    gpid=$(cat "$dir/ganesha.pid")
    run_tests ganesha "nfs://127.0.0.1$dir/export" "nfsport=2049&mountport=20048&version=3" "$gpid"
    stop_all
    NETNS=""
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/export"
}

bench_cistern() {
    local dir="$BENCH_DIR/cistern" api nbd port pid
    mkdir -p "$dir"
    read -r api nbd port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
    printf '[nfs]\nlisten = "127.0.0.1:%s"\n' "$port" >"$dir/cistern.toml"
    "$CISTERN_BIN" serve --state-dir "$dir/state" --api "127.0.0.1:$api" --nbd "127.0.0.1:$nbd" \
        --config "$dir/cistern.toml" >"$dir/daemon.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_port "$api" 30
    wait_port "$port" 30
    export CISTERN_API="http://127.0.0.1:$api"
    "$CISTERN_BIN" pool create -s "$POOL_SIZE" bench "$dir/d0" >/dev/null
    curl -sf -X POST -H 'content-type: application/json' "$CISTERN_API/v1/datasets" \
        -d '{"name":"bench/fs","volsize":0,"kind":"filesystem","properties":[["sharenfs","rw,no_root_squash"]]}' >/dev/null
    run_tests cistern "nfs://127.0.0.1/bench/fs" "nfsport=$port&mountport=$port&version=3" "$pid"
    stop_all
    unset CISTERN_API
    grep -q "panicked at" "$dir/daemon.log" && echo "warning: the daemon panicked, see $dir/daemon.log" >&2
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/d0" "$dir/state"
}

echo "==> bench/nfs-copy.sh: SIZE=$SIZE SMALL_FILES=$SMALL_FILES on $(df -h --output=source,fstype "$BENCH_DIR" | tail -1 | tr -s ' ')" >&2
make_sources
for t in $TARGETS; do
    case "$t" in
    ganesha) bench_ganesha ;;
    cistern) bench_cistern ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
done
[[ "$KEEP_FILES" == 1 ]] || rm -rf "$BENCH_DIR/src"

python3 - "$RESULTS" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import sys
val, rss = {}, {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "rss":
        rss[f[1]] = f[2]
    else:
        val[(f[0], f[1])] = (float(f[2]), f[3])
print(f"{'test':<10} {'ganesha':>10} {'cistern':>10} {'unit':<8} {'cistern/ganesha':>16}")
for test in dict.fromkeys(k[0] for k in val):
    g, c = val.get((test, "ganesha")), val.get((test, "cistern"))
    unit = (g or c)[1]
    ratio = f"{c[0] / g[0]:.2f}x" if g and c and g[0] > 0 else ""
    print(f"{test:<10} {g[0] if g else '':>10} {c[0] if c else '':>10} {unit:<8} {ratio:>16}")
print("peak / final RSS, MiB:")
for t, v in rss.items():
    h, r = v.split()
    print(f"  {t:<8} {h:>6} / {r}")
EOF
echo "(logs: $BENCH_DIR)" >&2
