# Shell helpers shared by the bench/*.sh scripts (sourced, not run).

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
