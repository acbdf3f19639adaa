//! Bonjour: `_smb._tcp` (the server, at its port) and `_adisk._tcp` (the
//! Time Machine shares, as a Time Capsule announces them) through
//! avahi-publish, one process per record, replaced when the shares change.

use crate::shares::Share;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// avahi-publish fails within this when no avahi-daemon answers.
const SETTLE: Duration = Duration::from_millis(700);

pub struct Bonjour {
    /// avahi-publish's messages (it reports the name it got, or why not).
    log: PathBuf,
    /// The arguments published and the processes holding them.
    published: Vec<(Vec<String>, Child)>,
    /// Set once avahi-publish proved unusable: say so once, then stay quiet.
    unusable: bool,
}

/// `avahi-publish -s` arguments for the records these shares need.
pub fn records(host: &str, port: u16, shares: &[Share]) -> Vec<Vec<String>> {
    if shares.is_empty() {
        return Vec::new();
    }
    let mut out = vec![vec![
        "-s".to_string(),
        host.to_string(),
        "_smb._tcp".to_string(),
        port.to_string(),
    ]];
    let tm: Vec<&Share> = shares.iter().filter(|s| s.timemachine).collect();
    if !tm.is_empty() {
        // adVF=0x82: an SMB share that takes Time Machine backups; port 9 as Apple's.
        let mut args = vec![
            "-s".to_string(),
            host.to_string(),
            "_adisk._tcp".to_string(),
            "9".to_string(),
            "sys=waMa=0,adVF=0x100".to_string(),
        ];
        args.extend(
            tm.iter()
                .enumerate()
                .map(|(i, s)| format!("dk{i}=adVN={},adVF=0x82", s.name)),
        );
        out.push(args);
    }
    out
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cistern".to_string())
}

impl Bonjour {
    pub fn new(log: PathBuf) -> Bonjour {
        Bonjour {
            log,
            published: Vec::new(),
            unusable: false,
        }
    }

    /// Publishes exactly `records(shares)`: keeps what is unchanged, stops
    /// what is gone, starts what is new.
    pub fn update(&mut self, port: u16, shares: &[Share]) {
        if self.unusable {
            return;
        }
        let want = records(&hostname(), port, shares);
        let mut keep = Vec::new();
        for (args, mut child) in std::mem::take(&mut self.published) {
            let alive = matches!(child.try_wait(), Ok(None));
            if alive && want.contains(&args) {
                keep.push((args, child));
            } else {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.published = keep;
        for args in want {
            if self.published.iter().any(|(a, _)| *a == args) {
                continue;
            }
            match publish(&args, &self.log) {
                Ok(child) => {
                    tracing::info!(record = %args[2], "published through Avahi");
                    self.published.push((args, child));
                }
                Err(why) => {
                    tracing::info!("Bonjour records not published (skipped): {why}");
                    self.unusable = true;
                    self.stop();
                    return;
                }
            }
        }
    }

    pub fn stop(&mut self) {
        for (_, mut child) in self.published.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Bonjour {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts avahi-publish; an error if it is missing or exits at once (no daemon).
fn publish(args: &[String], log: &std::path::Path) -> Result<Child, String> {
    let Some(bin) = crate::smbd::find_program(&PathBuf::from("avahi-publish")) else {
        return Err("avahi-publish is not installed (avahi-utils)".into());
    };
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))
    };
    let start = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let mut child = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(open()?)
        .stderr(open()?)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read(log).unwrap_or_default();
            let said = String::from_utf8_lossy(text.get(start as usize..).unwrap_or_default());
            return Err(format!("avahi-publish exited ({status}): {}", said.trim()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adisk_lists_time_machine_shares() {
        let share = |name: &str, tm: bool| Share {
            dataset: format!("tank/{name}"),
            name: name.into(),
            path: "/x".into(),
            guest: None,
            timemachine: tm,
            tm_max_size: None,
        };
        assert!(records("h", 445, &[]).is_empty());
        let r = records("h", 10445, &[share("a", false), share("mac1", true)]);
        assert_eq!(r[0], ["-s", "h", "_smb._tcp", "10445"]);
        assert_eq!(
            r[1],
            [
                "-s",
                "h",
                "_adisk._tcp",
                "9",
                "sys=waMa=0,adVF=0x100",
                "dk0=adVN=mac1,adVF=0x82"
            ]
        );
    }
}
