//! The NBD server's process-wide counters as Prometheus families.

use api::metrics::MetricsWriter;

pub fn render() -> String {
    let s = nbd::stats().snapshot();
    let mut w = MetricsWriter::new();
    let counters: &[(&str, &str, u64)] = &[
        (
            "cistern_nbd_connections_total",
            "NBD connections accepted.",
            s.connections_total,
        ),
        (
            "cistern_nbd_connections_rejected_total",
            "NBD connections refused at the connection limit.",
            s.connections_rejected,
        ),
        (
            "cistern_nbd_handshakes_failed_total",
            "NBD connections that ended during the handshake.",
            s.handshakes_failed,
        ),
        (
            "cistern_nbd_protocol_errors_total",
            "NBD connections closed for protocol violations.",
            s.protocol_errors,
        ),
        (
            "cistern_nbd_read_bytes_total",
            "Payload bytes returned by NBD reads.",
            s.bytes_read,
        ),
        (
            "cistern_nbd_written_bytes_total",
            "Payload bytes accepted by NBD writes.",
            s.bytes_written,
        ),
        (
            "cistern_nbd_errors_total",
            "NBD requests answered with an error.",
            s.errors,
        ),
        (
            "cistern_nbd_handshakes_evicted_total",
            "NBD connections closed in the handshake to admit a newer one (max_handshakes).",
            s.handshakes_evicted,
        ),
        (
            "cistern_nbd_stalled_evicted_total",
            "NBD connections closed for not reading replies while the in-flight byte budget was exhausted.",
            s.stalled_evicted,
        ),
        (
            "cistern_nbd_tls_handshakes_total",
            "NBD connections upgraded to TLS (NBD_OPT_STARTTLS).",
            s.tls_handshakes,
        ),
        (
            "cistern_nbd_tls_failures_total",
            "NBD TLS handshakes that failed (bad or missing client certificate, bad client).",
            s.tls_failed,
        ),
    ];
    for (name, help, v) in counters {
        w.family(name, "counter", help);
        w.sample(name, &[], *v as f64);
    }
    w.family(
        "cistern_nbd_connections_active",
        "gauge",
        "NBD connections open now.",
    );
    w.sample(
        "cistern_nbd_connections_active",
        &[],
        s.connections_active as f64,
    );
    let requests: &[(&str, u64)] = &[
        ("read", s.requests_read),
        ("write", s.requests_write),
        ("flush", s.requests_flush),
        ("trim", s.requests_trim),
        ("write_zeroes", s.requests_write_zeroes),
        ("block_status", s.requests_block_status),
        ("cache", s.requests_cache),
        ("disc", s.requests_disc),
        ("unknown", s.requests_unknown),
    ];
    w.family(
        "cistern_nbd_requests_total",
        "counter",
        "NBD requests by command.",
    );
    for (cmd, v) in requests {
        w.sample("cistern_nbd_requests_total", &[("command", cmd)], *v as f64);
    }
    w.finish()
}
