//! Small helpers for building pages: escaping (every value from the
//! engine, a user or a device goes through [`esc`]), sizes, times, the page frame.

use std::fmt::Write as _;

/// Text or attribute value, escaped for HTML.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A query-string component.
pub fn url(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            let _ = write!(o, "%{b:02X}");
        }
    }
    o
}

/// Bytes as zfs prints them: 1.50G, 512K, 0B.
pub fn size(b: u64) -> String {
    const U: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else if v < 10.0 {
        format!("{v:.2}{}", U[i])
    } else if v < 100.0 {
        format!("{v:.1}{}", U[i])
    } else {
        format!("{v:.0}{}", U[i])
    }
}

/// Unix seconds as `2026-11-26 13:05 UTC`.
pub fn time(secs: i64) -> String {
    if secs <= 0 {
        return "-".into();
    }
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration in words: `3d 4h`, `12m 5s`.
pub fn ago(secs: i64) -> String {
    let s = secs.max(0);
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m {}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h {}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}d {}h", s / 86_400, s % 86_400 / 3600)
    }
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// CSS class for a device or pool state.
pub fn state_class(state: &str) -> &'static str {
    match state {
        "ONLINE" => "ok",
        "DEGRADED" | "OFFLINE" => "warn",
        _ => "bad",
    }
}

/// The navigation entries: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/datasets", "Datasets"),
    ("/snapshots", "Snapshots"),
    ("/policies", "Policies"),
    ("/replication", "Replication"),
    ("/users", "S3 users"),
    ("/shares", "Shares & mounts"),
    ("/bench", "Bench"),
];

/// The whole page around `body`. `active` is the nav path to highlight.
pub fn page(title: &str, active: &str, pools: &[String], body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let cls = if *path == active {
            " class=\"active\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{path}\"{cls}>{label}</a>");
        if *path == "/" {
            for p in pools {
                let href = format!("/pools/{}", url(p));
                let cls = if href == active {
                    " class=\"active\""
                } else {
                    ""
                };
                let _ = write!(nav, "<a href=\"{href}\"{cls}>Pool {}</a>", esc(p));
            }
        }
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} - Cistern</title><link rel=\"icon\" href=\"/ui/logo.svg\">\
         <link rel=\"stylesheet\" href=\"/ui/ui.css\"></head><body>\
         <header><a class=\"brand\" href=\"/\"><img src=\"/ui/logo.svg\" alt=\"\">Cistern</a>\
         <nav>{nav}</nav><form class=\"api logout\" data-method=\"DELETE\" data-path=\"/v1/session\" \
         data-then=\"goto:/login\"><button type=\"submit\">Log out</button></form></header>\
         <main><h1>{t}</h1>{body}</main>\
         <dialog id=\"confirm\"><h2 id=\"confirm-title\"></h2><div id=\"confirm-text\"></div>\
         <div id=\"confirm-preview\"></div><div class=\"buttons\">\
         <button id=\"confirm-cancel\" type=\"button\">Cancel</button>\
         <button id=\"confirm-ok\" type=\"button\" class=\"danger\">Confirm</button></div></dialog>\
         <div id=\"toast\" role=\"status\"></div>\
         <script src=\"/ui/ui.js\"></script></body></html>",
        t = esc(title),
    )
}

/// The login page: no navigation, nothing about the pools.
pub fn login_page(form: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Log in - Cistern</title><link rel=\"icon\" href=\"/ui/logo.svg\">\
         <link rel=\"stylesheet\" href=\"/ui/ui.css\"></head><body>\
         <header><span class=\"brand\"><img src=\"/ui/logo.svg\" alt=\"\">Cistern</span></header>\
         <main><section class=\"card login\"><h1>Log in</h1>\
         <p>Paste the API token. The daemon keeps it in <code>STATE_DIR/api.token</code> \
         (mode 0600; <code>cistern serve</code> prints where), e.g. <code>sudo cat /var/lib/cistern/api.token</code>.</p>\
         {form}</section></main><div id=\"toast\" role=\"status\"></div>\
         <script src=\"/ui/ui.js\"></script></body></html>"
    )
}

/// A bar of parts (class, bytes, label) out of `total`.
pub fn bar(parts: &[(&str, u64, &str)], total: u64) -> String {
    let mut o = String::from("<div class=\"bar\">");
    let total = total.max(1) as f64;
    for (cls, v, label) in parts {
        let pct = (*v as f64 / total * 100.0).clamp(0.0, 100.0);
        let _ = write!(
            o,
            "<span class=\"{cls}\" style=\"width:{pct:.2}%\" title=\"{}: {}\"></span>",
            esc(label),
            size(*v)
        );
    }
    o.push_str("</div><div class=\"legend\">");
    for (cls, v, label) in parts {
        let _ = write!(
            o,
            "<span><i class=\"{cls}\"></i>{} {}</span>",
            esc(label),
            size(*v)
        );
    }
    o.push_str("</div>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        assert_eq!(url("tank/vol 0@a"), "tank%2Fvol%200%40a");
    }

    #[test]
    fn sizes_and_times() {
        assert_eq!(size(0), "0B");
        assert_eq!(size(1536), "1.50K");
        assert_eq!(size(20 << 30), "20.0G");
        assert_eq!(time(0), "-");
        assert_eq!(time(1_764_162_300), "2025-11-26 13:05:00 UTC");
        assert_eq!(ago(3700), "1h 1m");
    }
}
