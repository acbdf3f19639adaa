# Shell helpers shared by the bench/*.sh scripts (sourced, not run).

# Installs the Debian packages a bench needs that are missing (idempotent): need_apt PKG...
need_apt() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    echo "installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2
}

# A free TCP port on 127.0.0.1.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until 127.0.0.1:PORT accepts connections: wait_port PORT TIMEOUT_SECONDS.
wait_port() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "port $1 did not open within $2 s" >&2
    return 1
}

# Flushes dirty pages; with DROP_CACHES=1 (root) also empties the page cache,
# so reads that follow come from the disk.
drop_caches() {
    sync
    if [[ "${DROP_CACHES:-0}" == 1 ]]; then
        echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop caches: figures include the page cache)" >&2
    fi
}

# Peak and current resident memory of a process: rss PID -> "VmHWM VmRSS" in MiB.
rss() {
    awk '/^VmHWM:/ {h=$2} /^VmRSS:/ {r=$2} END {printf "%.0f %.0f", h/1024, r/1024}' "/proc/$1/status"
}

# Seconds (4 decimals) a command takes, its output discarded: elapsed CMD ARGS...
# The clock starts after the interpreter has started, so only the command counts.
elapsed() {
    python3 -c '
import subprocess, sys, time
t = time.perf_counter()
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
d = time.perf_counter() - t
if r.returncode:
    sys.exit(f"{sys.argv[1]} exited with {r.returncode}")
print(f"{d:.4f}")' "$@"
}

# Stops the processes whose ids are in the array PIDS (SIGTERM, SIGKILL after
# 10 s) and empties it. Scripts that use it set PIDS=() first.
stop_pids() {
    local pid
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}

# start_cistern DIR [CONFIG_TEXT]: `cistern serve` (CISTERN_BIN) with its state
# in DIR/state, its log in DIR/daemon.log, API and NBD on free loopback ports,
# DIR/cistern.toml holding CONFIG_TEXT when given, and a pool `bench` on the
# sparse file DIR/disks/d0 of POOL_SIZE (default 32G). Sets CISTERN_PID
# (appended to PIDS) and exports CISTERN_API and CISTERN_TOKEN.
start_cistern() {
    local dir="$1" config="${2:-}" api_port nbd_port args=()
    mkdir -p "$dir/disks"
    api_port=$(free_port)
    nbd_port=$(free_port)
    while [[ "$nbd_port" == "$api_port" ]]; do nbd_port=$(free_port); done
    if [[ -n "$config" ]]; then
        printf '%s\n' "$config" >"$dir/cistern.toml"
        args=(--config "$dir/cistern.toml")
    fi
    # CISTERN_SERVE_EXTRA: more serve flags, word-split (e.g. --standby POOL URL).
    # shellcheck disable=SC2086
    "$CISTERN_BIN" serve "${args[@]}" ${CISTERN_SERVE_EXTRA:-} --state-dir "$dir/state" --api "127.0.0.1:$api_port" \
        --nbd "127.0.0.1:$nbd_port" >"$dir/daemon.log" 2>&1 &
    CISTERN_PID=$!
    PIDS+=("$CISTERN_PID")
    local i
    for ((i = 0; i < 600; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null && break
        if ! kill -0 "$CISTERN_PID" 2>/dev/null; then
            echo "cistern serve exited; the end of $dir/daemon.log:" >&2
            tail -20 "$dir/daemon.log" >&2
            return 1
        fi
        sleep 0.1
    done
    wait_port "$api_port" 1
    export CISTERN_API="http://127.0.0.1:$api_port"
    # This daemon's own token: the CLI's default lives in a runtime directory
    # that other daemons on the machine may have overwritten.
    CISTERN_TOKEN=$(cat "$dir/state/api.token")
    export CISTERN_TOKEN
    "$CISTERN_BIN" pool create -s "${POOL_SIZE:-32G}" bench "$dir/disks/d0" >/dev/null
}

# Waits until DIR is a mount point: wait_mounted DIR TIMEOUT_SECONDS [PID]
# (fails early if PID, the process that should mount it, has exited).
wait_mounted() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        mountpoint -q "$1" && return 0
        if [[ -n "${3:-}" ]] && ! kill -0 "$3" 2>/dev/null; then
            echo "the process that should mount $1 exited" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "$1 was not mounted within $2 s" >&2
    return 1
}

# The 1-minute load average and the CPU count, to print beside figures taken on
# a machine others may be using: "load 3.2 on 2 CPUs".
load_note() {
    printf 'load %s on %s CPUs' "$(cut -d' ' -f1 /proc/loadavg)" "$(nproc)"
}
