//! Sizes and tables as the zfs/zpool tools print them.

// One size grammar for the CLI and the engine: parsed where properties live.
pub use dataset::props::parse_size;

/// Human-readable size like zfs: `0B`, `512B`, `4K`, `1.50G`, `15.5G`, `150G`.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut idx = 0;
    let mut div: u64 = 1;
    while idx + 1 < UNITS.len() && n / div >= 1024 {
        div <<= 10;
        idx += 1;
    }
    let unit = UNITS[idx];
    if n % div == 0 {
        return format!("{}{unit}", n / div);
    }
    let v = n as f64 / div as f64;
    // Three significant digits, as zfs_nicenum.
    for decimals in [2usize, 1, 0] {
        let s = format!("{v:.decimals$}");
        if s.len() <= 4 || decimals == 0 {
            return format!("{s}{unit}");
        }
    }
    unreachable!()
}

/// A byte count as `-p` wants it (exact) or as people read it.
pub fn size_cell(n: u64, parsable: bool) -> String {
    if parsable {
        n.to_string()
    } else {
        human_size(n)
    }
}

/// A text table: aligned columns with a header, or with `scripted`
/// (`-H`) no header and tab-separated fields.
pub struct Table {
    headers: Vec<String>,
    /// Columns aligned right (numbers).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.as_ref().to_uppercase()).collect(),
            right: vec![false; headers.len()],
            rows: Vec::new(),
        }
    }

    pub fn align_right(&mut self, col: usize) {
        if let Some(r) = self.right.get_mut(col) {
            *r = true;
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    pub fn render(&self, scripted: bool) -> String {
        let mut out = String::new();
        if scripted {
            for row in &self.rows {
                out.push_str(&row.join("\t"));
                out.push('\n');
            }
            return out;
        }
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String], out: &mut String| {
            let n = cells.len();
            let mut s = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                let last = i + 1 == n;
                if self.right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(cell);
                } else {
                    s.push_str(cell);
                    if !last {
                        s.push_str(&" ".repeat(pad));
                    }
                }
                if !last {
                    s.push_str("  ");
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&self.headers, &mut out);
        for row in &self.rows {
            line(row, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16k"), Ok(16384));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("4KB"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("4kib"), Ok(4096));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("512b"), Ok(512));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("1P"), Ok(1 << 50));
        assert_eq!(parse_size("15E"), Ok(15 << 60));
        assert_eq!(parse_size(" 8G "), Ok(8 << 30));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1.3K"), Ok(1331));
    }

    #[test]
    fn refuses_bad_sizes_naming_them() {
        for bad in [
            "",
            "abc",
            "10X",
            "-1",
            "1.2.3K",
            "1.5",
            "16E",
            "99999999999999999999999",
            "K",
            ".",
            "4 K B",
            "1e6",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert!(e.to_string().contains(&format!("'{bad}'")), "{e}");
        }
        assert_eq!(parse_size("10X").unwrap_err().reason, "unknown unit");
        assert_eq!(parse_size("16E").unwrap_err().reason, "too large");
    }

    #[test]
    fn formats_sizes_like_zfs() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(8 << 30), "8G");
        assert_eq!(human_size(3 << 29), "1.50G");
        assert_eq!(human_size(15 * (1 << 30) + (1 << 29)), "15.5G");
        assert_eq!(human_size(150 * (1 << 30) + (1 << 29)), "150G");
        assert_eq!(human_size(1023 * 1024 + 1), "1023K");
        assert_eq!(human_size(u64::MAX), "16.0E");
    }

    #[test]
    fn renders_tables() {
        let mut t = Table::new(&["name", "size", "health"]);
        t.align_right(1);
        t.push(vec!["tank".into(), "8G".into(), "ONLINE".into()]);
        t.push(vec![
            "backup-pool".into(),
            "1.50T".into(),
            "DEGRADED".into(),
        ]);
        assert_eq!(
            t.render(false),
            "NAME          SIZE  HEALTH\ntank            8G  ONLINE\nbackup-pool  1.50T  DEGRADED\n"
        );
        assert_eq!(
            t.render(true),
            "tank\t8G\tONLINE\nbackup-pool\t1.50T\tDEGRADED\n"
        );
    }

    #[test]
    fn empty_table_has_only_header() {
        let t = Table::new(&["name"]);
        assert_eq!(t.render(false), "NAME\n");
        assert_eq!(t.render(true), "");
    }
}
