#!/usr/bin/env bash
# bench/fs.sh: Cistern's FUSE mount of a filesystem dataset against ext4
# directly (the physical limit) and against bindfs over ext4 (a FUSE
# passthrough: the cost of FUSE itself), one run, same disk. A benchmark, not a
# test: it prints figures. NFS and SMB: bench/nfs.sh.
#
#   bash bench/fs.sh                                   # everything (~15 min a target)
#   BONNIE_FILES=10 FILES=2000 RUNTIME=5 TARGETS="ext4 bindfs" bash bench/fs.sh
#
# Tests (each target a fresh directory / mount):
#   bonnie        bonnie++ -s 0 -n BONNIE_FILES:8192:4096 (the seed's small-file
#                 test: 102,400 files of 4-8 KiB in one directory); total time
#                 and the create / delete rates bonnie++ prints
#   files         FILES empty files created by one process (create), `ls -l` of
#                 the directory after dropping the caches and remounting FUSE
#                 targets (ls-cold), `ls -l` again (ls-warm), unlink them all (delete)
#   randwrite     fio, JOBS jobs, 4 KiB random writes each followed by fsync,
#                 RUNTIME s on FIO_FILE_SIZE files
#   seq           fio, 1 MiB sequential writes of SEQ_SIZE (end_fsync), then
#                 1 MiB sequential reads of it after dropping the caches
#   postmark      postmark, POSTMARK_FILES files of 512 B-16 KiB in 10
#                 directories, POSTMARK_TRANSACTIONS transactions
# Prints each target's figure, its ratio against bindfs and against ext4
# (> 1 = faster), issue 12's goals (>= 1.0x bindfs on every row, >= 0.5x ext4
# on small-file creates, a cold listing of 10,000 entries under 1 s) and the
# peak RSS (VmHWM) of each FUSE server (Cistern's daemon, bindfs).
#
# Targets:
#   ext4          a directory on BENCH_DIR's filesystem when it is ext4, else a
#                 loop-mounted ext4 image file (EXT4_IMAGE_SIZE) beside it
#   bindfs        bindfs BINDFS_OPTS over a directory of that same ext4
#   cistern[:COMPRESSION[:RECORDSIZE]]
#                 `cistern mount` of bench/fs (file-backed pool under BENCH_DIR)
#                 created with -o compression= -o recordsize= when given
#
# Environment:
#   TARGETS="ext4 bindfs cistern"
#   TESTS="files bonnie randwrite seq postmark"
#   BONNIE_FILES=100        bonnie++ -n (in units of 1024 files)
#   FILES=10000             files of the files test
#   RUNTIME=15              seconds of fio randwrite and of seqread
#   JOBS=8                  fio randwrite jobs
#   FIO_FILE_SIZE=64M       each randwrite job's file
#   SEQ_SIZE=1G             the sequential file
#   POSTMARK_FILES=10000  POSTMARK_TRANSACTIONS=50000
#   DROP_CACHES=1           echo 3 > /proc/sys/vm/drop_caches before cold reads (root)
#   BINDFS_OPTS=--multithreaded
#   EXT4_MODE=auto          auto | dir (BENCH_DIR's fs, must be ext4) | loop (image)
#   EXT4_IMAGE_SIZE=16G
#   BENCH_DIR=bench/out/fs-<time>   data, logs, fio JSON (the disk measured)
#   CISTERN_BIN=target/release/cistern  (built with cargo if missing)
#   POOL_SIZE=32G           Cistern's sparse pool device
#   KEEP_FILES=0            1: keep the data after the run
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_apt bindfs bonnie++ postmark fio

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGETS="${TARGETS:-ext4 bindfs cistern}"
TESTS="${TESTS:-files bonnie randwrite seq postmark}"
BONNIE_FILES="${BONNIE_FILES:-100}"
FILES="${FILES:-10000}"
RUNTIME="${RUNTIME:-15}"
JOBS="${JOBS:-8}"
FIO_FILE_SIZE="${FIO_FILE_SIZE:-64M}"
SEQ_SIZE="${SEQ_SIZE:-1G}"
POSTMARK_FILES="${POSTMARK_FILES:-10000}"
POSTMARK_TRANSACTIONS="${POSTMARK_TRANSACTIONS:-50000}"
export DROP_CACHES="${DROP_CACHES:-1}"
BINDFS_OPTS="${BINDFS_OPTS:---multithreaded}"
EXT4_MODE="${EXT4_MODE:-auto}"
EXT4_IMAGE_SIZE="${EXT4_IMAGE_SIZE:-16G}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/fs-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
POOL_SIZE="${POOL_SIZE:-32G}"
KEEP_FILES="${KEEP_FILES:-0}"

need=(python3 fio mountpoint)
[[ " $TESTS " == *" bonnie "* ]] && need+=(bonnie++)
[[ " $TESTS " == *" postmark "* ]] && need+=(postmark)
[[ " $TARGETS " == *" bindfs "* ]] && need+=(bindfs fusermount3)
for tool in "${need[@]}"; do
    command -v "$tool" >/dev/null || { echo "bench/fs.sh: $tool is not installed (bash scripts/test.sh installs it)" >&2; exit 1; }
done
if [[ " $TARGETS" == *" cistern"* ]]; then
    if [[ ! -x "$CISTERN_BIN" ]]; then
        echo "==> building $CISTERN_BIN" >&2
        (cd "$ROOT" && cargo build --release -p cistern)
    fi
    "$CISTERN_BIN" mount --help >/dev/null 2>&1 ||
        { echo "bench/fs.sh: $CISTERN_BIN has no \`mount\` subcommand yet (drop cistern from TARGETS)" >&2; exit 1; }
fi
mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
RESULTS="$BENCH_DIR/results.tsv"
: >"$RESULTS"

# ---------------------------------------------------------------- processes, mounts
PIDS=()
MOUNTS=() # unmounted (lazily if need be) at exit, last first
cleanup() {
    local i m
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        m="${MOUNTS[i]}"
        mountpoint -q "$m" || continue
        fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    MOUNTS=()
    stop_pids
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The ext4 all targets live on: BENCH_DIR itself, or a loop-mounted image.
EXT4_ROOT=""
ext4_root() {
    [[ -n "$EXT4_ROOT" ]] && return 0
    local fstype mode="$EXT4_MODE"
    fstype=$(df --output=fstype "$BENCH_DIR" | tail -1 | tr -d ' ')
    if [[ "$mode" == auto ]]; then
        mode=loop
        [[ "$fstype" == ext4 ]] && mode=dir
    fi
    case "$mode" in
    dir)
        [[ "$fstype" == ext4 ]] || { echo "EXT4_MODE=dir but $BENCH_DIR is on $fstype" >&2; exit 1; }
        EXT4_ROOT="$BENCH_DIR/ext4fs"
        mkdir -p "$EXT4_ROOT"
        EXT4_DESC="$(df --output=source "$BENCH_DIR" | tail -1) (ext4, the disk's own filesystem)"
        ;;
    loop)
        EXT4_ROOT="$BENCH_DIR/ext4fs"
        mkdir -p "$EXT4_ROOT"
        truncate -s "$EXT4_IMAGE_SIZE" "$BENCH_DIR/ext4.img"
        mkfs.ext4 -q -F "$BENCH_DIR/ext4.img"
        mount -o loop "$BENCH_DIR/ext4.img" "$EXT4_ROOT"
        MOUNTS+=("$EXT4_ROOT")
        EXT4_DESC="ext4 image $BENCH_DIR/ext4.img ($EXT4_IMAGE_SIZE) loop-mounted, on $fstype"
        ;;
    *) echo "EXT4_MODE is auto, dir or loop" >&2; exit 2 ;;
    esac
}

# Each target: mount_T NAME DIR (DIR = the directory tests run in, set as MNT),
# remount_T (cold caches), umount_T, and SERVER_PID (the FUSE server, for RSS).
MNT="" SERVER_PID="" CISTERN_DS=""

mount_ext4() { MNT="$EXT4_ROOT/$1"; mkdir -p "$MNT"; SERVER_PID=""; }
remount_ext4() { drop_caches; }
umount_ext4() { :; }

BINDFS_SRC=""
start_bindfs() {
    # -f: in the foreground, so its pid is ours to stop and to measure.
    # shellcheck disable=SC2086
    bindfs -f $BINDFS_OPTS "$BINDFS_SRC" "$MNT" >>"$BENCH_DIR/$CUR/bindfs.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    MOUNTS+=("$MNT")
    wait_mounted "$MNT" 30 "$SERVER_PID"
}
stop_bindfs() {
    fusermount3 -u "$MNT"
    wait "$SERVER_PID" 2>/dev/null || true
}
mount_bindfs() {
    BINDFS_SRC="$EXT4_ROOT/$1-src"
    MNT="$BENCH_DIR/$1/mnt"
    mkdir -p "$BINDFS_SRC" "$MNT"
    start_bindfs
}
remount_bindfs() {
    # The peak RSS of the bindfs process before the remount is kept as the row's.
    note_rss
    stop_bindfs
    drop_caches
    start_bindfs
}
umount_bindfs() { note_rss; stop_bindfs; }

mount_cistern() { # NAME COMPRESSION RECORDSIZE
    local dir="$BENCH_DIR/$1" props=()
    [[ -n "$2" ]] && props+=(-o "compression=$2")
    [[ -n "$3" ]] && props+=(-o "recordsize=$3")
    start_cistern "$dir"
    SERVER_PID="$CISTERN_PID"
    CISTERN_DS=bench/fs
    "$CISTERN_BIN" create "${props[@]}" "$CISTERN_DS" >/dev/null
    MNT="$dir/mnt"
    mkdir -p "$MNT"
    "$CISTERN_BIN" mount "$CISTERN_DS" "$MNT"
    MOUNTS+=("$MNT")
    wait_mounted "$MNT" 30 "$SERVER_PID"
}
remount_cistern() {
    "$CISTERN_BIN" unmount "$MNT"
    drop_caches
    "$CISTERN_BIN" mount "$CISTERN_DS" "$MNT"
    wait_mounted "$MNT" 30 "$SERVER_PID"
}
umount_cistern() {
    note_rss
    "$CISTERN_BIN" get compressratio,used,logicalused "$CISTERN_DS" >"$BENCH_DIR/$CUR/props.txt" 2>&1 || true
    "$CISTERN_BIN" unmount "$MNT" || fusermount3 -u "$MNT"
    unset CISTERN_API
    stop_pids
    if grep -q "panicked at" "$BENCH_DIR/$CUR/daemon.log"; then
        echo "warning: the daemon panicked, see $BENCH_DIR/$CUR/daemon.log" >&2
    fi
}

note_rss() { # the FUSE server's peak RSS so far (max over its restarts)
    [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null || return 0
    printf 'rss\t%s\t%s\n' "$CUR" "$(rss "$SERVER_PID")" >>"$RESULTS"
}

# ---------------------------------------------------------------- tests
row() { # test target value better(hi|lo) unit
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RESULTS"
}

test_files() {
    local d="$MNT/files" t
    mkdir -p "$d"
    t=$(python3 - "$d" "$FILES" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
for i in range(n):
    os.close(os.open(f"{d}/f{i:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
print(f"{time.perf_counter() - t:.4f}")
EOF
)
    row files-create "$CUR" "$(python3 -c "print(f'{$FILES / $t:.0f}')")" hi files/s
    sync
    "remount_$KIND"
    d="$MNT/files"
    t=$(elapsed ls -l "$d")
    row ls-cold "$CUR" "$t" lo s
    t=$(elapsed ls -l "$d")
    row ls-warm "$CUR" "$t" lo s
    t=$(python3 - "$d" "$FILES" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
for i in range(n):
    os.unlink(f"{d}/f{i:06d}")
print(f"{time.perf_counter() - t:.4f}")
EOF
)
    row files-delete "$CUR" "$(python3 -c "print(f'{$FILES / $t:.0f}')")" hi files/s
    rmdir "$d"
}

test_bonnie() {
    local d="$MNT/bonnie" out="$BENCH_DIR/$CUR/bonnie" t
    mkdir -p "$d"
    t=$(python3 - "$d" "$BONNIE_FILES" "$out" <<'EOF'
import subprocess, sys, time
d, n, out = sys.argv[1:]
t = time.perf_counter()
with open(out + ".csv", "w") as o, open(out + ".log", "w") as e:
    r = subprocess.run(["bonnie++", "-d", d, "-s", "0", "-n", f"{n}:8192:4096", "-u", "0:0", "-q"], stdout=o, stderr=e)
if r.returncode:
    sys.exit(f"bonnie++ exited with {r.returncode}, see {out}.log")
print(f"{time.perf_counter() - t:.2f}")
EOF
) || { cat "$out.log" >&2; return 1; }
    row bonnie-time "$CUR" "$t" lo s
    # bonnie++ 1.98 CSV: 26 seq create/s, 28 seq read, 30 seq delete, 32 random
    # create/s, 34 random read, 36 random delete ("+++++": too fast to time).
    python3 - "$CUR" "$out.csv" >>"$RESULTS" <<'EOF'
import sys
target, path = sys.argv[1:]
f = open(path).read().strip().splitlines()[-1].split(",")
for name, i in (("bonnie-seq-create", 26), ("bonnie-seq-delete", 30), ("bonnie-rand-create", 32), ("bonnie-rand-delete", 36)):
    v = f[i] if f[i] and "+" not in f[i] else "-"
    print(f"{name}\t{target}\t{v}\thi\tfiles/s")
EOF
    rm -rf "$d"
}

run_fio() { # test, fio args... -> a row from the JSON
    local test="$1" out="$BENCH_DIR/$CUR/$1.json"
    shift
    fio --name="$test" --directory="$MNT/fio" --ioengine=psync --output-format=json "--output=$out" \
        --buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers "$@" >"$out.log" 2>&1 ||
        { echo "fio $test on $CUR failed:" >&2; cat "$out.log" >&2; return 1; }
    python3 - "$test" "$CUR" "$out" >>"$RESULTS" <<'EOF'
import json, sys
test, target, path = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
d = job["read"] if "read" in test else job["write"]
if test.startswith("randwrite"):
    print(f"{test}\t{target}\t{d['iops']:.0f}\thi\tIOPS")
    sync = job.get("sync", {}).get("lat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1e6
    print(f"fsync-p99-4k\t{target}\t{sync:.2f}\tlo\tms")
else:
    print(f"{test}\t{target}\t{d['bw_bytes'] / 1e6:.1f}\thi\tMB/s")
EOF
}

test_randwrite() {
    mkdir -p "$MNT/fio"
    run_fio randwrite-4k-fsync --rw=randwrite --bs=4k --fsync=1 --numjobs="$JOBS" --size="$FIO_FILE_SIZE" \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --group_reporting
    rm -rf "$MNT/fio"
}

test_seq() {
    mkdir -p "$MNT/fio"
    run_fio seqwrite-1m --rw=write --bs=1M --numjobs=1 --size="$SEQ_SIZE" --end_fsync=1 --runtime=$((RUNTIME * 8))
    "remount_$KIND"
    run_fio seqread-1m --rw=read --bs=1M --numjobs=1 --size="$SEQ_SIZE" --time_based --runtime="$RUNTIME"
    rm -rf "$MNT/fio"
}

test_postmark() {
    local d="$MNT/postmark" out="$BENCH_DIR/$CUR/postmark.log" t
    mkdir -p "$d"
    t=$(elapsed sh -c "postmark >'$out' 2>&1" <<EOF
set location $d
set number $POSTMARK_FILES
set transactions $POSTMARK_TRANSACTIONS
set subdirectories 10
set size 512 16384
set read 4096
set write 4096
set buffering false
set report terse
run
quit
EOF
) || { cat "$out" >&2; return 1; }
    row postmark-time "$CUR" "$t" lo s
    python3 - "$CUR" "$out" "$POSTMARK_TRANSACTIONS" "$t" >>"$RESULTS" <<'EOF'
import sys
target, path, n, t = sys.argv[1:]
print(f"postmark-tps\t{target}\t{int(n) / float(t):.0f}\thi\ttransactions/s")
EOF
    rm -rf "$d"
}

# ---------------------------------------------------------------- run
ext4_root
echo "==> bench/fs.sh: TARGETS=\"$TARGETS\" TESTS=\"$TESTS\" FILES=$FILES BONNIE_FILES=$BONNIE_FILES RUNTIME=${RUNTIME}s JOBS=$JOBS SEQ_SIZE=$SEQ_SIZE" >&2
echo "    ext4: $EXT4_DESC; bench data in $BENCH_DIR" >&2
for t in $TARGETS; do
    case "$t" in
    ext4) KIND=ext4 CUR=ext4; mkdir -p "$BENCH_DIR/$CUR"; mount_ext4 ext4 ;;
    bindfs) KIND=bindfs CUR=bindfs; mkdir -p "$BENCH_DIR/$CUR"; mount_bindfs bindfs ;;
    cistern | cistern:*)
        IFS=: read -r _ comp rs <<<"$t"
        KIND=cistern CUR="${t//:/-}"
        mkdir -p "$BENCH_DIR/$CUR"
        mount_cistern "$CUR" "${comp:-}" "${rs:-}"
        ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    printf 'load\t%s\tstart %s\n' "$CUR" "$(load_note)" >>"$RESULTS"
    for test in $TESTS; do
        case "$test" in
        files | bonnie | randwrite | seq | postmark) ;;
        *) echo "unknown test $test" >&2; exit 2 ;;
        esac
        echo "   $CUR $test" >&2
        "test_$test"
    done
    printf 'load\t%s\tend %s\n' "$CUR" "$(load_note)" >>"$RESULTS"
    "umount_$KIND"
    [[ "$KEEP_FILES" == 1 ]] || rm -rf "$BENCH_DIR/$CUR/disks" "$BENCH_DIR/$CUR/state" "$EXT4_ROOT/$CUR" "$EXT4_ROOT/$CUR-src"
done
cleanup
[[ "$KEEP_FILES" == 1 ]] || rm -f "$BENCH_DIR/ext4.img"

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
        h, r = map(int, f[2].split())
        ph, _ = rss.get(f[1], (0, 0))
        rss[f[1]] = (max(ph, h), r)
    else:
        rows.append(f)
val = {(r[0], r[1]): r for r in rows}
tests = list(dict.fromkeys(r[0] for r in rows))
creates = {"files-create", "bonnie-seq-create", "bonnie-rand-create"}

def ratio(test, target, ref):
    a, b = val.get((test, target)), val.get((test, ref))
    if not a or not b or target == ref or "-" in (a[2], b[2]) or float(a[2]) == 0 or float(b[2]) == 0:
        return ""
    x, y = float(a[2]), float(b[2])
    return f"{(x / y if a[3] == 'hi' else y / x):.2f}x"

print(f"{'test':<26} {'target':<16} {'figure':>10} {'unit':<14} {'vs bindfs':>9} {'vs ext4':>8}  goal")
for test in tests:
    for r in (r for r in rows if r[0] == test):
        target, v, better, unit = r[1], r[2], r[3], r[4]
        goal = ""
        if target.startswith("cistern"):
            goals = [">= 1.0x bindfs"]
            if test in creates:
                goals.append(">= 0.5x ext4")
            if test == "ls-cold":
                goals.append("< 1 s for 10,000")
            goal = ", ".join(goals)
        print(f"{test:<26} {target:<16} {v:>10} {unit:<14} {ratio(test, target, 'bindfs'):>9} {ratio(test, target, 'ext4'):>8}  {goal}")
print()
print("ratio > 1: faster than the reference (figure / reference, or reference / figure for times)")
if rss:
    print("peak RSS (VmHWM) / RSS at the end of the FUSE server, MiB:")
    for t, (h, r) in rss.items():
        print(f"  {t:<16} {h:>6} / {r}")
print("machine load during each target (other users share it):")
for t, v in load.items():
    print(f"  {t:<16} {', '.join(v)}")
EOF
echo "(fio JSON, bonnie++ CSV, postmark and daemon logs: $BENCH_DIR)" >&2
