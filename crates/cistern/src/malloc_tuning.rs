//! The daemon's malloc settings (decision 0058).
//!
//! The ARC's blocks are ordinary heap allocations. After a restart the ARC
//! fills with fresh memory, and glibc's per-thread arenas grow one
//! `mprotect` step and one 4 KiB page fault at a time: a third of a cold
//! read's CPU went to `exc_page_fault`, `clear_page` and `mprotect`. glibc
//! hands its heap to the kernel as transparent huge pages only in its main
//! arena, grown in steps of at least `top_pad`, with `hugetlb=1`; those are
//! tunables read once at process start, so with `CISTERN_MALLOC_TUNING=on`
//! `serve` re-executes itself with them set. It is opt-in: the same huge
//! pages cost 4 KiB write + FLUSH loads 10-20% more CPU while the heap
//! grows (decision 0058 has the figures). A `GLIBC_TUNABLES` the user set
//! is left as it is (theirs wins).

/// One arena (the main one: only it can be backed by huge pages), grown
/// 32 MiB at a time and `madvise(MADV_HUGEPAGE)`d; allocations below 8 MiB
/// (NBD payloads, read runs) stay on the heap instead of a fresh `mmap`
/// each, and up to 64 MiB free at its top is kept rather than given back
/// and faulted in again (setting `top_pad` turns glibc's adaptive mmap and
/// trim thresholds off). Under memory pressure the monitor's `malloc_trim`
/// still returns every free page (crate::memory in dataset).
pub const TUNABLES: &str = "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:\
glibc.malloc.top_pad=33554432:glibc.malloc.mmap_threshold=8388608:\
glibc.malloc.trim_threshold=67108864";

/// `on` (or `1`, `true`): run with [`TUNABLES`]; anything else (or unset)
/// keeps glibc's defaults.
pub const OPT_IN: &str = "CISTERN_MALLOC_TUNING";

const VAR: &str = "GLIBC_TUNABLES";

/// Re-executes this process with [`TUNABLES`] when asked ([`OPT_IN`]),
/// unless `GLIBC_TUNABLES` is set already (by the user, or by this function before the exec). Call
/// before any thread is started. Returns only if no exec happened (or it
/// failed: the daemon then runs with glibc's defaults, which is only slower).
pub fn reexec_daemon() {
    let off = !std::env::var(OPT_IN)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "on" | "1" | "true"));
    if off || !cfg!(all(target_os = "linux", target_env = "gnu")) || std::env::var_os(VAR).is_some()
    {
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cistern: malloc tuning skipped (no path to this binary: {e})");
            return;
        }
    };
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    let err = cmd.args(args).env(VAR, TUNABLES).exec();
    eprintln!("cistern: malloc tuning skipped (re-exec failed: {err})");
}

#[cfg(test)]
mod tests {
    #[test]
    fn tunables_are_well_formed() {
        for t in super::TUNABLES.split(':') {
            let (name, value) = t.split_once('=').expect("name=value");
            assert!(name.starts_with("glibc.malloc."), "{name}");
            assert!(value.parse::<u64>().is_ok(), "{t}");
        }
    }
}
