#!/usr/bin/env bash
# bench/policy.sh: snapshot policies at scale, one run. A benchmark, not a test.
#
#   bash bench/policy.sh              # N=10000
#   N=2000 bash bench/policy.sh
#
# 1. N automatic snapshots of one volume (taken N/1000 at a time: one txg each).
# 2. `cistern list -t snapshot` with N snapshots: names only, and with space columns.
# 3. `cistern policy run -n` (plan + reasons for N snapshots) and `policy run`
#    pruning all but 10 in one batch: wall time and txg commits it took.
# 4. Capacity pruning planned over N snapshots (`policy run -n` with a 1%
#    threshold no pruning can reach, as every snapshot shares the volume's
#    data: the worst case, the whole set estimated).
# Both should stay in seconds, not minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
N="${N:-10000}"
DIR="$(mktemp -d /tmp/cistern-policy-bench.XXXXXX)"
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
NBD=$(free_port); API=$(free_port)
export CISTERN_API="http://127.0.0.1:$API"
cat >"$DIR/c.toml" <<TOML
[engine]
policy_tick_secs = 0
[policy.bulk]
schedule = "daily"
keep = "last=10"
[policy.full]
schedule = "daily"
keep = "last=100000"
capacity = 1
TOML
"$BIN" serve --state-dir "$DIR/st" --nbd "127.0.0.1:$NBD" --api "127.0.0.1:$API" --config "$DIR/c.toml" >"$DIR/log" 2>&1 &
PID=$!
wait_port "$API" 30
"$BIN" pool create -s 2G tank mirror "$DIR/d0" "$DIR/d1" >/dev/null
"$BIN" create -V 64M tank/v >/dev/null
# 32 MiB of data every snapshot shares: the pool is past the 1% threshold of step 4.
head -c 32M /dev/urandom >"$DIR/data"
nbdcopy --flush "$DIR/data" "nbd://127.0.0.1:$NBD/tank/v"
secs() { python3 -c 'import time; print(f"{time.monotonic():.3f}")'; }
txgs() { curl -s -H "Authorization: Bearer $(cat "$DIR/st/api.token")" "$CISTERN_API/metrics" | awk '/^cistern_pool_txg_commits_total/ {print $2}'; }
t0=$(secs)
python3 - "$N" <<'PY' | while read -r line; do "$BIN" snapshot $line >/dev/null; done
import sys, datetime
n = int(sys.argv[1]); t = datetime.datetime(2020, 1, 1)
names = [f"tank/v@auto-{(t + datetime.timedelta(minutes=i)).strftime('%Y-%m-%dT%H%MZ')}" for i in range(n)]
for i in range(0, n, 1000):
    print(" ".join(names[i:i + 1000]))
PY
t1=$(secs)
echo "created $N snapshots in $(python3 -c "print(f'{$t1-$t0:.1f}')") s"
t0=$(secs); "$BIN" list -H -t snapshot -o name | wc -l >/dev/null; t1=$(secs)
echo "list -t snapshot -o name ($N): $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
t0=$(secs); "$BIN" list -H -t snapshot -o name,used,referenced >/dev/null; t1=$(secs)
echo "list -t snapshot (with used/refer): $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
t0=$(secs); "$BIN" list -H -t snapshot >/dev/null; t1=$(secs)
echo "list -t snapshot (default columns, with cistern:auto): $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
"$BIN" set snapshot:policy=full tank/v
t0=$(secs); lines=$("$BIN" policy run -n tank/v | grep -c 'capacity:' || true); t1=$(secs)
echo "capacity plan (policy run -n, threshold 1%): $lines would be destroyed, $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
"$BIN" set snapshot:policy=bulk tank/v
t0=$(secs); lines=$("$BIN" policy run -n tank/v | grep -c '^would destroy'); t1=$(secs)
echo "policy run -n: $lines would be destroyed, $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
before=$(txgs)
t0=$(secs); "$BIN" policy run tank/v | tail -1; t1=$(secs)
after=$(txgs)
echo "policy run: pruned $lines snapshots in $(python3 -c "print(f'{$t1-$t0:.2f}')") s, $(python3 -c "print(int($after-$before))") txg commits"
echo "left: $("$BIN" list -H -t snapshot -o name | wc -l) snapshots"
