//! Writing to the terminal: results to stdout (a closed pipe is not an
//! error), diagnostics to stderr as `cistern: ...`.

use std::io::Write;

/// Writes `s` to stdout; a reader that went away (`| head`) ends us quietly.
pub fn out(s: &str) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cistern: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `out` with a newline.
pub fn outln(s: &str) {
    let mut line = String::with_capacity(s.len() + 1);
    line.push_str(s);
    line.push('\n');
    out(&line);
}

/// Pretty JSON to stdout.
pub fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    let s = serde_json::to_string_pretty(v)?;
    outln(&s);
    Ok(())
}

pub fn error(e: &anyhow::Error) {
    eprintln!("cistern: {e:#}");
}

/// CLI commands log only warnings unless RUST_LOG says otherwise.
pub fn init_client_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
