//! The smb.conf of the daemon's private smbd (documented in README.md).

use crate::shares::Share;
use crate::Settings;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where the private instance keeps everything: `STATE/smb/...`.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub root: PathBuf,
}

impl Dirs {
    pub fn new(state_dir: &Path) -> Dirs {
        Dirs {
            root: state_dir.join("smb"),
        }
    }
    pub fn conf(&self) -> PathBuf {
        self.root.join("smb.conf")
    }
    pub fn sub(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    /// The directories smbd needs (created before it starts).
    pub const SUBDIRS: [&'static str; 8] = [
        "lock", "state", "cache", "private", "run", "ncalrpc", "bind-dns", "log",
    ];
    pub fn pid_file(&self) -> PathBuf {
        self.sub("run").join("smbd.pid")
    }
}

/// The whole file. Shares come in the order given (the plan's, by dataset name).
pub fn render(settings: &Settings, dirs: &Dirs, shares: &[Share]) -> String {
    let d = |n: &str| dirs.sub(n).display().to_string();
    let mut s = String::new();
    let mut line = |k: &str, v: &str| {
        let _ = writeln!(s, "\t{k} = {v}");
    };
    // Header written below (line borrows s); collect globals first.
    line("server role", "standalone server");
    line("server string", "Cistern");
    line("smb ports", &settings.listen.port().to_string());
    if settings.listen.ip().is_unspecified() {
        line("bind interfaces only", "no");
    } else {
        line("interfaces", &settings.listen.ip().to_string());
        line("bind interfaces only", "yes");
    }
    line("disable netbios", "yes");
    line("server min protocol", "SMB2_10");
    for (k, sub) in [
        ("lock directory", "lock"),
        ("state directory", "state"),
        ("cache directory", "cache"),
        ("private dir", "private"),
        ("pid directory", "run"),
        ("ncalrpc dir", "ncalrpc"),
        ("binddns dir", "bind-dns"),
    ] {
        line(k, &d(sub));
    }
    line("log file", &format!("{}/smbd.log", d("log")));
    line("max log size", "10000");
    line(
        "passdb backend",
        &format!("tdbsam:{}/passdb.tdb", d("private")),
    );
    line(
        "map to guest",
        if settings.guest { "Bad User" } else { "Never" },
    );
    line("load printers", "no");
    line("printing", "bsd");
    line("printcap name", "/dev/null");
    line("disable spoolss", "yes");
    // Macs: Apple's SMB extensions, resource forks and Finder info as xattrs.
    line("vfs objects", "catia fruit streams_xattr");
    line("fruit:metadata", "stream");
    line("fruit:model", "MacSamba");
    line("fruit:copyfile", "yes");
    line("fruit:posix_rename", "yes");
    line("fruit:wipe_intentionally_left_blank_rfork", "yes");
    line("fruit:delete_empty_adfiles", "yes");
    line("ea support", "yes");
    // Durable handles: smbd must be the only keeper of locks and share modes.
    line("durable handles", "yes");
    line("kernel oplocks", "no");
    line("kernel share modes", "no");
    line("posix locking", "no");
    // An SMB2 FLUSH (a Mac's F_FULLFSYNC) becomes fsync on the mount, which
    // the filesystem makes durable through the intent log; plain writes stay
    // asynchronous (sync always would fsync every write).
    line("strict sync", "yes");
    line("sync always", "no");
    let globals = std::mem::take(&mut s);

    let mut out = String::from(
        "# Written by the Cistern daemon; rewritten whenever shares change.\n\
         # Do not edit: set sharesmb / timemachine / tm_max_size on datasets.\n\
         [global]\n",
    );
    out.push_str(&globals);
    for sh in shares {
        let _ = writeln!(out, "\n[{}]", sh.name);
        let mut kv = |k: &str, v: &str| {
            let _ = writeln!(out, "\t{k} = {v}");
        };
        kv("comment", &format!("Cistern dataset {}", sh.dataset));
        kv("path", &sh.path.display().to_string());
        kv("read only", "no");
        kv("browseable", "yes");
        let guest = sh.guest.unwrap_or(settings.guest);
        kv("guest ok", if guest { "yes" } else { "no" });
        if let Some(u) = &settings.force_user {
            kv("force user", u);
        }
        if sh.timemachine {
            kv("fruit:time machine", "yes");
            if let Some(n) = sh.tm_max_size {
                kv("fruit:time machine max size", &n.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_machine_share_renders() {
        let settings = Settings::default();
        let dirs = Dirs::new(Path::new("/var/lib/cistern"));
        let shares = [Share {
            dataset: "tank/tm".into(),
            name: "tank_tm".into(),
            path: "/srv/tm".into(),
            guest: None,
            timemachine: true,
            tm_max_size: Some(1 << 40),
        }];
        let text = render(&settings, &dirs, &shares);
        for want in [
            "\tsmb ports = 10445\n",
            "\tinterfaces = 127.0.0.1\n",
            "\tlock directory = /var/lib/cistern/smb/lock\n",
            "\tvfs objects = catia fruit streams_xattr\n",
            "\tdurable handles = yes\n",
            "\tstrict sync = yes\n",
            "[tank_tm]\n\tcomment = Cistern dataset tank/tm\n\tpath = /srv/tm\n",
            "\tguest ok = no\n",
            "\tfruit:time machine = yes\n\tfruit:time machine max size = 1099511627776\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
