#!/usr/bin/env bash
# bench/nfs.sh: NFSv3 and SMB through user-space clients, Cistern against the
# reference servers on ext4, one run, same disk. A benchmark, not a test: it
# prints figures. Local mounts (FUSE, ext4, bindfs): bench/fs.sh.
#
#   bash bench/nfs.sh                                  # everything
#   SIZE=256M FILES=2000 SMALL_FILES=200 TARGETS="ganesha smbd" bash bench/nfs.sh
#
# Clients: libnfs-utils (nfs-cp, nfs-cat, nfs-ls) for NFS, smbclient for SMB.
# Tests (each target a fresh export / share):
#   put         nfs-cp / smbclient put of one SIZE file (urandom data)
#   get         the same file read back (nfs-cat, smbclient get to /dev/null),
#               caches dropped first
#   small-put   SMALL_FILES files of 4 KiB: NFS one nfs-cp each (so each pays a
#               MOUNT and a connection), SMB one smbclient session (mput)
#   ls          a listing with attributes of a directory of FILES entries
#               (nfs-ls, smbclient ls), caches dropped first; the entries are
#               made on the server's side (ext4 directly, Cistern's FUSE mount)
# Prints MB/s, files/s or seconds, the ratio of Cistern to its reference
# (ganesha for NFS, smbd for SMB; > 1 = faster) and each server's peak RSS.
#
# Targets:
#   ganesha       nfs-ganesha (Debian's 4.3, FSAL VFS) exporting a directory of
#                 BENCH_DIR's filesystem. Ganesha registers with rpcbind and will
#                 not start without one, so both run in a private network and
#                 mount namespace (unshare: their own loopback and /run, nothing
#                 listens on the host); the clients enter that namespace.
#   cistern-nfs   the daemon's NFS server ([nfs] listen on a free loopback port,
#                 MOUNT on the same port), export /bench/fs
#   smbd          a private smbd (own smb.conf, state, pid and log directories
#                 under BENCH_DIR, 127.0.0.1:free port, guest access) sharing a
#                 directory of BENCH_DIR's filesystem
#   cistern-smb   `cistern set sharesmb=on bench/fs` on a daemon started with
#                 CISTERN_SMB_CONFIG; smbclient -p CISTERN_SMB_PORT to the share
#                 CISTERN_SMB_SHARE
#
# Environment:
#   TARGETS="ganesha cistern-nfs smbd cistern-smb"
#   TESTS="put get small-put ls"
#   SIZE=1G  FILES=10000  SMALL_FILES=1000
#   DROP_CACHES=1           echo 3 > /proc/sys/vm/drop_caches before get and ls (root)
#   BENCH_DIR=bench/out/nfs-<time>
#   CISTERN_BIN=target/release/cistern  POOL_SIZE=32G
#   CISTERN_SMB_PORT=445  CISTERN_SMB_SHARE=bench_fs  CISTERN_SMB_CONFIG=""  (TOML
#                         added to the daemon's config, e.g. an [smb] section)
#   SMB_AUTH="-N"           smbclient credentials options (guest by default)
#   KEEP_FILES=0
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_apt libnfs-utils nfs-ganesha nfs-ganesha-vfs rpcbind smbclient samba samba-vfs-modules

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGETS="${TARGETS:-ganesha cistern-nfs smbd cistern-smb}"
TESTS="${TESTS:-put get small-put ls}"
SIZE="${SIZE:-1G}"
FILES="${FILES:-10000}"
SMALL_FILES="${SMALL_FILES:-1000}"
export DROP_CACHES="${DROP_CACHES:-1}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/nfs-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
POOL_SIZE="${POOL_SIZE:-32G}"
CISTERN_SMB_PORT="${CISTERN_SMB_PORT:-445}"
CISTERN_SMB_SHARE="${CISTERN_SMB_SHARE:-bench_fs}"
CISTERN_SMB_CONFIG="${CISTERN_SMB_CONFIG:-}"
SMB_AUTH="${SMB_AUTH:--N}"
KEEP_FILES="${KEEP_FILES:-0}"

need=(python3)
[[ " $TARGETS " == *" ganesha "* ]] && need+=(ganesha.nfsd rpcbind unshare nsenter ip)
[[ " $TARGETS " == *nfs* || " $TARGETS " == *ganesha* ]] && need+=(nfs-cp nfs-ls)
[[ " $TARGETS " == *smb* ]] && need+=(smbclient)
[[ " $TARGETS " == *" smbd "* ]] && need+=(smbd)
for tool in "${need[@]}"; do
    command -v "$tool" >/dev/null || { echo "bench/nfs.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ " $TARGETS" == *" cistern-"* ]]; then
    if [[ ! -x "$CISTERN_BIN" ]]; then
        echo "==> building $CISTERN_BIN" >&2
        (cd "$ROOT" && cargo build --release -p cistern)
    fi
    "$CISTERN_BIN" mount --help >/dev/null 2>&1 ||
        { echo "bench/nfs.sh: $CISTERN_BIN has no \`mount\` subcommand yet (drop the cistern targets)" >&2; exit 1; }
fi
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

PIDS=()
MOUNTS=()
cleanup() {
    local m
    for m in "${MOUNTS[@]}"; do
        mountpoint -q "$m" && { "$CISTERN_BIN" unmount "$m" 2>/dev/null || fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
    done
    MOUNTS=()
    stop_pids
}
trap cleanup EXIT
trap 'exit 130' INT TERM

row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RESULTS"; }
rate() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.${3:-1}f}')" "$1" "$2"; }
bytes() { python3 -c "import sys; s=sys.argv[1].upper(); u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))" "$1"; }

# The source files, made once on BENCH_DIR's disk.
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
}

# A directory of FILES empty entries, made on the server's side (path).
make_listing() {
    python3 - "$1" "$FILES" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for i in range(n):
    os.close(os.open(f"{d}/f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
EOF
    sync
}

# ---------------------------------------------------------------- NFS
# NETNS: the pid whose network namespace the NFS clients enter ("" = the host's).
NETNS=""
inns() {
    if [[ -n "$NETNS" ]]; then nsenter --net="/proc/$NETNS/ns/net" "$@"; else "$@"; fi
}

nfs_tests() { # target url server-side-dir server-pid
    local target="$1" url="$2" sdir="$3" spid="$4" t q="${2#*\?}" base="${2%%\?*}"
    for test in $TESTS; do
        echo "   $target $test" >&2
        case "$test" in
        put)
            t=$(inns "$(command -v bash)" -c "$(declare -f elapsed); elapsed nfs-cp '$BENCH_DIR/src/big' '$base/big?$q'")
            row put "$target" "$(rate "$(bytes "$SIZE")e-6" "$t")" hi MB/s
            ;;
        get)
            drop_caches
            t=$(inns "$(command -v bash)" -c "$(declare -f elapsed); elapsed nfs-cat '$base/big?$q'")
            row get "$target" "$(rate "$(bytes "$SIZE")e-6" "$t")" hi MB/s
            ;;
        small-put)
            t=$(inns python3 - "$BENCH_DIR/src/small" "$base/small" "$q" <<'EOF'
import os, subprocess, sys, time
src, base, q = sys.argv[1:]
names = sorted(os.listdir(src))
t = time.perf_counter()
for n in names:
    subprocess.run(["nfs-cp", f"{src}/{n}", f"{base}/{n}?{q}"], check=True, stdout=subprocess.DEVNULL)
print(f"{time.perf_counter() - t:.4f}")
EOF
)
            row small-put "$target" "$(rate "$SMALL_FILES" "$t" 0)" hi files/s
            ;;
        ls)
            make_listing "$sdir/list"
            drop_caches
            t=$(inns "$(command -v bash)" -c "$(declare -f elapsed); elapsed nfs-ls '$base/list?$q'")
            row ls-cold "$target" "$t" lo s
            t=$(inns "$(command -v bash)" -c "$(declare -f elapsed); elapsed nfs-ls '$base/list?$q'")
            row ls-warm "$target" "$t" lo s
            local n
            n=$(inns nfs-ls "$base/list?$q" | grep -c ' f[0-9]')
            [[ "$n" == "$FILES" ]] || echo "warning: nfs-ls listed $n of $FILES entries on $target" >&2
            ;;
        *) echo "unknown test $test" >&2; exit 2 ;;
        esac
    done
    printf 'rss\t%s\t%s\n' "$target" "$(rss "$spid")" >>"$RESULTS"
}

bench_ganesha() {
    local dir="$BENCH_DIR/ganesha" gpid
    rm -rf "$dir/export"
    mkdir -p "$dir/export/small" "$dir/recovery"
    cat >"$dir/ganesha.conf" <<EOF
# A private instance in its own network namespace (only a loopback there, so
# the standard ports and no Bind_addr: ganesha's lookup of it wants a
# non-loopback address to exist).
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
    # The namespace's shell starts rpcbind and ganesha and stops both on TERM.
    unshare --net --mount --propagation private bash -c '
        set -e
        ip link set lo up
        mount -t tmpfs fsbench-run /run
        mkdir -p /run/rpcbind /run/ganesha
        rpcbind -f & r=$!
        for i in $(seq 50); do [ -S /run/rpcbind.sock ] && break; sleep 0.1; done
        ganesha.nfsd -F -f "$1/ganesha.conf" -L "$1/ganesha.log" -p "$1/ganesha.pid" -N NIV_EVENT & g=$!
        trap "kill -TERM \$g 2>/dev/null; wait \$g; kill -TERM \$r; wait \$r; exit 0" TERM INT
        wait $g || true
        kill -TERM $r; wait $r || true' fsbench-ns "$dir" >"$dir/ns.log" 2>&1 &
    NETNS=$!
    PIDS+=("$NETNS")
    local i
    for ((i = 0; i < 300; i++)); do
        inns bash -c 'exec 3<>/dev/tcp/127.0.0.1/2049' 2>/dev/null && break
        kill -0 "$NETNS" 2>/dev/null || { cat "$dir/ns.log" "$dir/ganesha.log" >&2; echo "ganesha did not start" >&2; exit 1; }
        sleep 0.1
    done
    gpid=$(cat "$dir/ganesha.pid")
    make_sources
    local url="nfs://127.0.0.1$dir/export?nfsport=2049&mountport=20048&version=3"
    inns nfs-ls "$url" >/dev/null || { cat "$dir/ganesha.log" >&2; exit 1; }
    ganesha.nfsd -v 2>/dev/null | head -1 >"$dir/version" || true
    nfs_tests ganesha "$url" "$dir/export" "$gpid"
    stop_pids
    NETNS=""
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/export"
}

cistern_up() { # dir extra-config: a daemon, bench/fs created and FUSE-mounted at dir/mnt
    start_cistern "$1" "$2"
    "$CISTERN_BIN" create bench/fs >/dev/null
    mkdir -p "$1/mnt"
    "$CISTERN_BIN" mount bench/fs "$1/mnt"
    MOUNTS+=("$1/mnt")
    wait_mounted "$1/mnt" 30 "$CISTERN_PID"
    mkdir -p "$1/mnt/small"
}

cistern_down() {
    cleanup
    unset CISTERN_API
    if grep -q "panicked at" "$1/daemon.log"; then
        echo "warning: the daemon panicked, see $1/daemon.log" >&2
    fi
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$1/disks" "$1/state"
}

bench_cistern_nfs() {
    local dir="$BENCH_DIR/cistern-nfs" port
    port=$(free_port)
    cistern_up "$dir" "$(printf '[nfs]\nlisten = "127.0.0.1:%s"' "$port")"
    # Root writes (the bench runs as root): not squashed, as ganesha's export.
    "$CISTERN_BIN" set sharenfs=rw,no_root_squash bench/fs
    wait_port "$port" 30
    make_sources
    nfs_tests cistern-nfs "nfs://127.0.0.1/bench/fs?nfsport=$port&mountport=$port&version=3" "$dir/mnt" "$CISTERN_PID"
    cistern_down "$dir"
}

# ---------------------------------------------------------------- SMB
smb_tests() { # target //host/share port server-side-dir server-pid
    local target="$1" share="$2" port="$3" sdir="$4" spid="$5" t
    # shellcheck disable=SC2086
    local smb=(smbclient "$share" -p "$port" $SMB_AUTH)
    for test in $TESTS; do
        echo "   $target $test" >&2
        case "$test" in
        put)
            t=$(elapsed "${smb[@]}" -c "put $BENCH_DIR/src/big big" 2>/dev/null)
            row put "$target" "$(rate "$(bytes "$SIZE")e-6" "$t")" hi MB/s
            ;;
        get)
            drop_caches
            t=$(elapsed "${smb[@]}" -c "get big /dev/null" 2>/dev/null)
            row get "$target" "$(rate "$(bytes "$SIZE")e-6" "$t")" hi MB/s
            ;;
        small-put)
            t=$(elapsed "${smb[@]}" -c "prompt off; lcd $BENCH_DIR/src/small; mkdir small; cd small; mput s*" 2>/dev/null)
            row small-put "$target" "$(rate "$SMALL_FILES" "$t" 0)" hi files/s
            ;;
        ls)
            make_listing "$sdir/list"
            drop_caches
            t=$(elapsed "${smb[@]}" -c "cd list; ls")
            row ls-cold "$target" "$t" lo s
            t=$(elapsed "${smb[@]}" -c "cd list; ls")
            row ls-warm "$target" "$t" lo s
            local n
            n=$("${smb[@]}" -c "cd list; ls" 2>/dev/null | grep -c ' f[0-9]')
            [[ "$n" == "$FILES" ]] || echo "warning: smbclient listed $n of $FILES entries on $target" >&2
            ;;
        *) echo "unknown test $test" >&2; exit 2 ;;
        esac
    done
    printf 'rss\t%s\t%s\n' "$target" "$(rss "$spid")" >>"$RESULTS"
}

bench_smbd() {
    local dir="$BENCH_DIR/smbd" port d
    port=$(free_port)
    rm -rf "$dir/share"
    for d in share state private lock cache pid ncalrpc log; do mkdir -p "$dir/$d"; done
    cat >"$dir/smb.conf" <<EOF
[global]
    server role = standalone server
    workgroup = BENCH
    netbios name = fsbench
    interfaces = 127.0.0.1
    bind interfaces only = yes
    smb ports = $port
    disable netbios = yes
    map to guest = Bad User
    guest account = root
    load printers = no
    printing = bsd
    printcap name = /dev/null
    disable spoolss = yes
    pid directory = $dir/pid
    lock directory = $dir/lock
    state directory = $dir/state
    cache directory = $dir/cache
    private dir = $dir/private
    ncalrpc dir = $dir/ncalrpc
    passdb backend = tdbsam:$dir/private/passdb.tdb
    log file = $dir/log/smbd.log
[bench]
    path = $dir/share
    read only = no
    guest ok = yes
    force user = root
EOF
    # In a session of its own: at exit smbd signals its whole process group.
    setsid smbd --foreground --no-process-group -s "$dir/smb.conf" >"$dir/smbd.out" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_port "$port" 30
    smbd --version >"$dir/version" 2>&1 || true
    make_sources
    smb_tests smbd "//127.0.0.1/bench" "$port" "$dir/share" "$spid"
    stop_pids
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$dir/share"
}

bench_cistern_smb() {
    local dir="$BENCH_DIR/cistern-smb"
    cistern_up "$dir" "$CISTERN_SMB_CONFIG"
    "$CISTERN_BIN" set sharesmb=on bench/fs
    wait_port "$CISTERN_SMB_PORT" 30
    make_sources
    smb_tests cistern-smb "//127.0.0.1/$CISTERN_SMB_SHARE" "$CISTERN_SMB_PORT" "$dir/mnt" "$CISTERN_PID"
    cistern_down "$dir"
}

# ---------------------------------------------------------------- run
echo "==> bench/nfs.sh: TARGETS=\"$TARGETS\" TESTS=\"$TESTS\" SIZE=$SIZE FILES=$FILES SMALL_FILES=$SMALL_FILES" >&2
echo "    files on $(df -h --output=source,fstype "$BENCH_DIR" | tail -1 | tr -s ' ') in $BENCH_DIR" >&2
for t in $TARGETS; do
    printf 'load\t%s\tstart %s\n' "$t" "$(load_note)" >>"$RESULTS"
    case "$t" in
    ganesha) bench_ganesha ;;
    cistern-nfs) bench_cistern_nfs ;;
    smbd) bench_smbd ;;
    cistern-smb) bench_cistern_smb ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    printf 'load\t%s\tend %s\n' "$t" "$(load_note)" >>"$RESULTS"
done
[[ "$KEEP_FILES" == 1 ]] || rm -rf "$BENCH_DIR/src"

# ---------------------------------------------------------------- report
python3 - "$RESULTS" <<'EOF' | tee "$BENCH_DIR/summary.txt"
import sys
rows, rss, load = [], {}, {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "load":
        load.setdefault(f[1], []).append(f[2])
        continue
    if f[0] == "rss":
        rss[f[1]] = f[2]
    else:
        rows.append(f)
val = {(r[0], r[1]): r for r in rows}
ref = {"cistern-nfs": "ganesha", "cistern-smb": "smbd"}
print(f"{'test':<10} {'target':<12} {'figure':>10} {'unit':<8} {'vs reference':>12}")
for proto in (("ganesha", "cistern-nfs"), ("smbd", "cistern-smb")):
    for test in dict.fromkeys(r[0] for r in rows):
        for target in proto:
            r = val.get((test, target))
            if not r:
                continue
            ratio = ""
            b = val.get((test, ref.get(target, "")))
            if b and float(r[2]) > 0 and float(b[2]) > 0:
                x, y = float(r[2]), float(b[2])
                ratio = f"{(x / y if r[3] == 'hi' else y / x):.2f}x {b[1]}"
            print(f"{test:<10} {target:<12} {r[2]:>10} {r[4]:<8} {ratio:>12}")
print()
print("ratio > 1: Cistern faster than the reference")
print("peak RSS (VmHWM) / RSS at the end of each server, MiB:")
for t, v in rss.items():
    h, r = v.split()
    print(f"  {t:<12} {h:>6} / {r}")
print("machine load during each target (other users share it):")
for t, v in load.items():
    print(f"  {t:<12} {', '.join(v)}")
EOF
echo "(logs and configurations: $BENCH_DIR)" >&2
