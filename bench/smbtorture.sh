#!/usr/bin/env bash
# bench/smbtorture.sh: Samba's own protocol tests (smbtorture, from
# samba-testsuite) against two shares of the daemon's private smbd, same
# generated smb.conf, same run:
#   ext4     a filesystem dataset whose mountpoint is a plain ext4 directory
#            (the reference: what Samba does on a local filesystem)
#   cistern  a filesystem dataset served from Cistern's own filesystem
# and prints the pass counts side by side. Issue 12 asks for the same counts.
# Opt-in (not part of scripts/test.sh); needs root (smbd) and
# samba samba-vfs-modules smbclient samba-testsuite.
#
#   bash bench/smbtorture.sh
#   SUITES="smb2.durable-v2-open" bash bench/smbtorture.sh
#
# Environment:
#   SUITES="vfs.fruit vfs.fruit_timemachine smb2.durable-v2-open"
#   TARGETS="ext4 cistern"
#   SUITE_TIMEOUT=900       seconds per suite and target
#   BENCH_DIR=bench/out/smbtorture-<time>   pool, shares, logs (on the disk measured)
#   CISTERN_BIN=target/release/cistern      (built with cargo if missing)
#   KEEP_FILES=0            1: keep BENCH_DIR's data after the run
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The one line to change once the daemon FUSE-mounts filesystems at their
# mountpoint: 1 = the cistern share is the daemon's mount.
CISTERN_MOUNTS=1

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SUITES=${SUITES:-"vfs.fruit vfs.fruit_timemachine smb2.durable-v2-open"}
TARGETS=${TARGETS:-"ext4 cistern"}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-900}
BENCH_DIR=$(realpath -m "${BENCH_DIR:-$REPO/bench/out/smbtorture-$(date +%Y%m%d-%H%M%S)}")
CISTERN_BIN=${CISTERN_BIN:-$REPO/target/release/cistern}
KEEP_FILES=${KEEP_FILES:-0}
PASSWORD=smbtorture-bench

for tool in smbd smbtorture smbpasswd; do
    command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] || { echo "$tool is not installed" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "needs root: smbd serves files as their owners" >&2; exit 2; }
[[ -x $CISTERN_BIN ]] || (cd "$REPO" && cargo build --release -p cistern)

mkdir -p "$BENCH_DIR"/{disks,ext4,mnt}
API_PORT=$(free_port); NBD_PORT=$(free_port); SMB_PORT=$(free_port)
export CISTERN_API=http://127.0.0.1:$API_PORT
cat >"$BENCH_DIR/cistern.toml" <<EOF
[smb]
listen = "127.0.0.1:$SMB_PORT"
bonjour = false
EOF
"$CISTERN_BIN" serve --state-dir "$BENCH_DIR/state" --api "127.0.0.1:$API_PORT" --nbd "127.0.0.1:$NBD_PORT" \
    --config "$BENCH_DIR/cistern.toml" >"$BENCH_DIR/daemon.log" 2>&1 &
DAEMON=$!
cleanup() {
    kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
    [[ $KEEP_FILES == 1 ]] || rm -rf "$BENCH_DIR/disks" "$BENCH_DIR/ext4" "$BENCH_DIR/mnt" "$BENCH_DIR/state"
}
trap cleanup EXIT
wait_port "$API_PORT" 60
cistern() { "$CISTERN_BIN" "$@"; }
cistern pool create -s 8G tank "$BENCH_DIR/disks/d0" >/dev/null

# Two filesystems per target: TARGET (sharesmb=on) and TARGET_tm, a Time
# Machine destination of 32K, the size Samba's selftest gives
# vfs.fruit_timemachine (its volsize check expects it). Time Machine adds the
# FULL_SYNC volume capability, which vfs.fruit's AAPL check does not expect.
share() { # share DATASET MOUNTPOINT [timemachine]
    cistern create "$1" >/dev/null
    cistern set "mountpoint=$2" "$1"
    if [[ ${3:-} == timemachine ]]; then
        cistern set timemachine=on "$1"
        cistern set tm_max_size=32K "$1"
    else
        cistern set sharesmb=on "$1"
    fi
}
mkdir -p "$BENCH_DIR/ext4/plain" "$BENCH_DIR/ext4/tm"
share tank/ext4 "$BENCH_DIR/ext4/plain"
share tank/ext4_tm "$BENCH_DIR/ext4/tm" timemachine
if [[ $CISTERN_MOUNTS != 1 ]]; then
    mkdir -p "$BENCH_DIR/mnt/cistern" "$BENCH_DIR/mnt/cistern_tm"
    echo "note: the cistern shares are plain directories until the daemon mounts filesystems (CISTERN_MOUNTS)" >&2
fi
share tank/cistern "$BENCH_DIR/mnt/cistern"
share tank/cistern_tm "$BENCH_DIR/mnt/cistern_tm" timemachine
printf '%s\n%s\n' "$PASSWORD" "$PASSWORD" | smbpasswd -c "$BENCH_DIR/state/smb/smb.conf" -a -s root >/dev/null
wait_port "$SMB_PORT" 30

declare -A PASS TOTAL
for suite in $SUITES; do
    for target in $TARGETS; do
        out="$BENCH_DIR/$suite.$target.txt"
        name=tank_$target
        [[ $suite == *timemachine* ]] && name=${name}_tm
        timeout "$SUITE_TIMEOUT" smbtorture "//127.0.0.1/$name" -p "$SMB_PORT" -U "root%$PASSWORD" \
            "$suite" >"$out" 2>&1 || true
        PASS[$suite.$target]=$(grep -c '^success:' "$out" || true)
        TOTAL[$suite.$target]=$(grep -cE '^(success|failure|error|skip):' "$out" || true)
        grep -E '^(failure|error):' "$out" | sed "s/^/  $target $suite /" | cut -c1-120 >&2 || true
    done
done

printf '\n%-24s' "suite (passed/run)"
for target in $TARGETS; do printf '%14s' "$target"; done
printf '\n'
for suite in $SUITES; do
    printf '%-24s' "$suite"
    for target in $TARGETS; do printf '%14s' "${PASS[$suite.$target]}/${TOTAL[$suite.$target]}"; done
    printf '\n'
done
echo "logs: $BENCH_DIR"
