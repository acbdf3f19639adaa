//! `sharenfs`: which clients may mount a dataset, read-only or read-write,
//! and whose identity their requests carry (squashing).
//!
//! - `off`: not shared. `on`: read-write for clients on loopback
//!   (127.0.0.0/8, ::1), root squashed (as Linux exports(5) by default).
//! - Options, comma-separated: `rw=HOST[:HOST...]`, `ro=HOST[:HOST...]`,
//!   bare `rw` / `ro` (loopback clients, read-write or read-only),
//!   `root_squash` (default) / `no_root_squash`, `all_squash`,
//!   `anonuid=N`, `anongid=N` (default 65534).
//! - A HOST is `*`, an IP address or a CIDR (`10.0.0.0/8`, `[fd00::]/8`;
//!   IPv6 in brackets, since `:` separates hosts). Host names and netgroups
//!   are refused: the daemon does no DNS.
//! - With host lists, only the hosts named get in (plus loopback if a bare
//!   `rw`/`ro` is also given); a host in both lists is read-only.

use std::net::IpAddr;

/// Who a squashed request becomes when the options do not say (nobody/nogroup).
pub const NOBODY: u32 = 65534;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Any,
    Net { addr: IpAddr, prefix: u8 },
}

impl Host {
    fn parse(s: &str) -> Result<Host, String> {
        if s == "*" {
            return Ok(Host::Any);
        }
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = addr.parse().map_err(|_| {
            format!(
                "'{s}' is not an IP address or CIDR (host names and netgroups are not supported)"
            )
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("'{s}': prefix length must be 0..={max}")),
            },
        };
        Ok(Host::Net { addr: ip, prefix })
    }

    fn matches(&self, ip: IpAddr) -> bool {
        match self {
            Host::Any => true,
            Host::Net { addr, prefix } => match (addr, ip.to_canonical()) {
                (IpAddr::V4(net), IpAddr::V4(ip)) => {
                    let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
                    u32::from(*net) & mask == u32::from(ip) & mask
                }
                (IpAddr::V6(net), IpAddr::V6(ip)) => {
                    let mask = u128::MAX.checked_shl(128 - u32::from(*prefix)).unwrap_or(0);
                    u128::from(*net) & mask == u128::from(ip) & mask
                }
                _ => false,
            },
        }
    }
}

/// Splits a host list on `:`, keeping `[...]` (IPv6) whole.
fn split_hosts(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut depth) = (0, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ':' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

/// A parsed `sharenfs` value (not `off`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareOptions {
    rw: Vec<Host>,
    ro: Vec<Host>,
    /// Access of loopback clients not in a list (None: only listed hosts).
    loopback: Option<Access>,
    pub root_squash: bool,
    pub all_squash: bool,
    pub anonuid: u32,
    pub anongid: u32,
}

impl ShareOptions {
    /// `Ok(None)` for `off`; an error names the option that is wrong.
    pub fn parse(value: &str) -> Result<Option<ShareOptions>, String> {
        let mut o = ShareOptions {
            rw: Vec::new(),
            ro: Vec::new(),
            loopback: None,
            root_squash: true,
            all_squash: false,
            anonuid: NOBODY,
            anongid: NOBODY,
        };
        match value {
            "off" => return Ok(None),
            "on" => {
                o.loopback = Some(Access::ReadWrite);
                return Ok(Some(o));
            }
            _ => {}
        }
        let mut bare: Option<Access> = None;
        for opt in value.split(',') {
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let id = |v: Option<&str>| -> Result<u32, String> {
                v.and_then(|v| v.parse::<u32>().ok())
                    .ok_or_else(|| format!("sharenfs option '{opt}': expected a number"))
            };
            match (key, val) {
                ("rw" | "ro", Some(list)) => {
                    let mut hosts = Vec::new();
                    for h in split_hosts(list) {
                        hosts.push(
                            Host::parse(h).map_err(|e| format!("sharenfs option '{opt}': {e}"))?,
                        );
                    }
                    if key == "rw" {
                        o.rw.extend(hosts);
                    } else {
                        o.ro.extend(hosts);
                    }
                }
                ("rw", None) => bare = Some(Access::ReadWrite),
                ("ro", None) => bare = Some(Access::ReadOnly),
                ("root_squash", None) => o.root_squash = true,
                ("no_root_squash", None) => o.root_squash = false,
                ("all_squash", None) => o.all_squash = true,
                ("anonuid", v) => o.anonuid = id(v)?,
                ("anongid", v) => o.anongid = id(v)?,
                _ => {
                    return Err(format!(
                        "unknown sharenfs option '{opt}' (expected rw=HOSTS, ro=HOSTS, rw, ro, \
                         root_squash, no_root_squash, all_squash, anonuid=N, anongid=N)"
                    ))
                }
            }
        }
        o.loopback = match bare {
            Some(a) => Some(a),
            None if o.rw.is_empty() && o.ro.is_empty() => Some(Access::ReadWrite),
            None => None,
        };
        Ok(Some(o))
    }

    /// What a client at `ip` may do; None: not allowed in.
    pub fn access_for(&self, ip: IpAddr) -> Option<Access> {
        if self.ro.iter().any(|h| h.matches(ip)) {
            return Some(Access::ReadOnly);
        }
        if self.rw.iter().any(|h| h.matches(ip)) {
            return Some(Access::ReadWrite);
        }
        if ip.to_canonical().is_loopback() {
            return self.loopback;
        }
        None
    }

    /// The identity a request acts as: AUTH_UNIX's (`None`: AUTH_NULL,
    /// anonymous), squashed as configured.
    pub fn cred(&self, unix: Option<(u32, u32, &[u32])>) -> posix::Cred {
        let anon = posix::Cred {
            uid: self.anonuid,
            gid: self.anongid,
            groups: Vec::new(),
        };
        match unix {
            None => anon,
            Some(_) if self.all_squash => anon,
            Some((0, _, _)) if self.root_squash => anon,
            Some((uid, gid, groups)) => posix::Cred {
                uid,
                gid,
                groups: groups.to_vec(),
            },
        }
    }

    /// The host lists, for MOUNT's EXPORT reply (empty: loopback only).
    pub fn groups(&self) -> Vec<String> {
        let show = |h: &Host| match h {
            Host::Any => "*".to_string(),
            Host::Net { addr, prefix } => format!("{addr}/{prefix}"),
        };
        self.rw.iter().chain(self.ro.iter()).map(show).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn on_is_loopback_read_write_with_root_squashed() {
        let o = ShareOptions::parse("on").unwrap().unwrap();
        assert_eq!(o.access_for(ip("127.0.0.1")), Some(Access::ReadWrite));
        assert_eq!(o.access_for(ip("::1")), Some(Access::ReadWrite));
        assert_eq!(o.access_for(ip("10.1.2.3")), None);
        assert_eq!(o.cred(Some((0, 0, &[]))).uid, NOBODY);
        assert_eq!(o.cred(Some((1000, 100, &[5]))).groups, vec![5]);
        assert_eq!(ShareOptions::parse("off").unwrap(), None);
    }

    #[test]
    fn host_lists_cidrs_and_squash_options() {
        let o = ShareOptions::parse(
            "rw=10.0.0.0/8:[fd00::]/8,ro=10.9.0.0/16:192.168.1.5,no_root_squash,anonuid=99",
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.access_for(ip("10.1.2.3")), Some(Access::ReadWrite));
        assert_eq!(o.access_for(ip("10.9.2.3")), Some(Access::ReadOnly));
        assert_eq!(o.access_for(ip("192.168.1.5")), Some(Access::ReadOnly));
        assert_eq!(o.access_for(ip("192.168.1.6")), None);
        assert_eq!(o.access_for(ip("fd12::1")), Some(Access::ReadWrite));
        assert_eq!(o.access_for(ip("::ffff:10.0.0.1")), Some(Access::ReadWrite));
        assert_eq!(
            o.access_for(ip("127.0.0.1")),
            None,
            "lists name who gets in"
        );
        assert_eq!(o.cred(Some((0, 0, &[]))).uid, 0);
        assert_eq!(o.cred(None).uid, 99);
        let all = ShareOptions::parse("ro,all_squash,anongid=7")
            .unwrap()
            .unwrap();
        assert_eq!(all.access_for(ip("127.0.0.1")), Some(Access::ReadOnly));
        assert_eq!(all.cred(Some((1000, 1000, &[]))).gid, 7);
        let star = ShareOptions::parse("rw=*").unwrap().unwrap();
        assert_eq!(star.access_for(ip("203.0.113.9")), Some(Access::ReadWrite));
    }

    #[test]
    fn a_bad_option_is_named() {
        for (bad, names) in [
            ("rw=myhost", "myhost"),
            ("rw=10.0.0.0/40", "10.0.0.0/40"),
            ("sync", "sync"),
            ("anonuid=x", "anonuid=x"),
            ("rw,no_root_sqash", "no_root_sqash"),
        ] {
            let e = ShareOptions::parse(bad).unwrap_err();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }
}
