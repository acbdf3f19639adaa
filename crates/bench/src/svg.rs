//! Hand-written SVG charts: a line/step chart (the "X or better" curves) and
//! a labelled scatter chart (compression: time against ratio). No
//! dependencies; the output is plain, well-formed SVG 1.1.

use std::fmt::Write as _;

const W: f64 = 860.0;
const H: f64 = 500.0;
const ML: f64 = 80.0; // margins
const MR: f64 = 30.0;
const MT: f64 = 50.0;
const MB: f64 = 60.0;

const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Colour of series `i`.
pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for use in SVG element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `n` ticks over `span`.
pub fn nice_step(span: f64, n: usize) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    let a = v.abs();
    if a >= 1e6 && step >= 1e5 {
        trim_num(v / 1e6, "M")
    } else if a >= 1e4 && step >= 1e3 {
        trim_num(v / 1e3, "k")
    } else if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let digits = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
        format!("{v:.digits$}")
    }
}

fn trim_num(v: f64, unit: &str) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

/// One axis: data range mapped onto a pixel range.
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
    /// Logarithmic (base 10); `lo` and `hi` are then powers of ten.
    log: bool,
}

impl Axis {
    fn new(min: f64, max: f64, ticks: usize) -> Self {
        let (mut lo, mut hi) = (min, max);
        if !(lo.is_finite() && hi.is_finite()) {
            lo = 0.0;
            hi = 1.0;
        }
        if hi <= lo {
            hi = lo + if lo.abs() > 0.0 { lo.abs() * 0.1 } else { 1.0 };
        }
        let step = nice_step(hi - lo, ticks);
        let lo = (lo / step).floor() * step;
        let hi = (hi / step).ceil() * step;
        Self {
            lo,
            hi,
            step,
            log: false,
        }
    }
    /// A log axis over the decades holding `min..=max` (positive values).
    fn log(min: f64, max: f64) -> Self {
        let min = if min.is_finite() && min > 0.0 {
            min
        } else {
            1e-3
        };
        let max = if max.is_finite() && max > min {
            max
        } else {
            min * 10.0
        };
        let lo = 10f64.powf(min.log10().floor());
        let mut hi = 10f64.powf(max.log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        Self {
            lo,
            hi,
            step: lo,
            log: true,
        }
    }
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let decades = (self.hi / self.lo).log10().round() as i32;
            let mults: &[f64] = if decades > 4 {
                &[1.0]
            } else {
                &[1.0, 2.0, 5.0]
            };
            let mut v = Vec::new();
            for d in 0..=decades.clamp(0, 30) {
                let base = self.lo * 10f64.powi(d);
                for m in mults {
                    let t = base * m;
                    if t <= self.hi * (1.0 + 1e-9) {
                        v.push(t);
                    }
                }
            }
            return v;
        }
        let n = ((self.hi - self.lo) / self.step).round() as i64;
        (0..=n.clamp(0, 100))
            .map(|i| self.lo + i as f64 * self.step)
            .collect()
    }
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            let v = v.max(self.lo);
            return (v / self.lo).log10() / (self.hi / self.lo).log10();
        }
        (v - self.lo) / (self.hi - self.lo)
    }
    fn label(&self, t: f64) -> String {
        if self.log {
            if t >= 1.0 {
                return fmt_tick(t, 1.0);
            }
            let digits = (-t.log10()).ceil().clamp(0.0, 9.0) as usize;
            return format!("{t:.digits$}");
        }
        fmt_tick(t, self.step)
    }
}

fn px(v: f64) -> String {
    format!("{:.1}", v)
}

fn header(out: &mut String, title: &str) {
    let _ = writeln!(
        out,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<title>{t}</title>
<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>
<text x="{cx}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{t}</text>"#,
        t = esc(title),
        cx = px(W / 2.0),
    );
}

fn axes(out: &mut String, xa: &Axis, ya: &Axis, x_label: &str, y_label: &str) {
    let (x0, x1, y0, y1) = (ML, W - MR, H - MB, MT);
    out.push_str("<g stroke=\"#ddd\" stroke-width=\"1\">\n");
    for t in ya.ticks() {
        let y = y0 + (y1 - y0) * ya.frac(t);
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}"/>"#,
            px(x0),
            px(y),
            px(x1),
            px(y)
        );
    }
    for t in xa.ticks() {
        let x = x0 + (x1 - x0) * xa.frac(t);
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}"/>"#,
            px(x),
            px(y0),
            px(x),
            px(y1)
        );
    }
    out.push_str("</g>\n");
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333" stroke-width="1"/>"##,
        px(x0),
        px(y1),
        px(x1 - x0),
        px(y0 - y1)
    );
    out.push_str("<g fill=\"#333\">\n");
    for t in ya.ticks() {
        let y = y0 + (y1 - y0) * ya.frac(t);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            px(x0 - 6.0),
            px(y + 4.0),
            esc(&ya.label(t))
        );
    }
    for t in xa.ticks() {
        let x = x0 + (x1 - x0) * xa.frac(t);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px(x),
            px(y0 + 18.0),
            esc(&xa.label(t))
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
        px((x0 + x1) / 2.0),
        px(H - 16.0),
        esc(x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{}" text-anchor="middle" font-size="13" transform="rotate(-90 18 {})">{}</text>"#,
        px((y0 + y1) / 2.0),
        px((y0 + y1) / 2.0),
        esc(y_label)
    );
    out.push_str("</g>\n");
}

/// The legend box, top-right or (`bottom`) bottom-right of the plot.
fn legend(out: &mut String, names: &[String], bottom: bool) {
    if names.is_empty() {
        return;
    }
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as f64;
    let w = 40.0 + longest * 7.0;
    let h = 8.0 + 18.0 * names.len() as f64;
    let x = W - MR - w - 8.0;
    let y = if bottom { H - MB - h - 8.0 } else { MT + 8.0 };
    let _ = writeln!(
        out,
        r##"<g><rect x="{}" y="{}" width="{}" height="{}" fill="white" fill-opacity="0.85" stroke="#999"/>"##,
        px(x),
        px(y),
        px(w),
        px(h)
    );
    for (i, n) in names.iter().enumerate() {
        let ly = y + 16.0 + 18.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            px(x + 8.0),
            px(ly - 4.0),
            px(x + 30.0),
            px(ly - 4.0),
            colour(i),
            px(x + 36.0),
            px(ly),
            esc(n)
        );
    }
    out.push_str("</g>\n");
}

/// One line of a [`LineChart`].
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Lines over a shared pair of axes that start at zero.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

impl LineChart {
    /// Renders the chart: one `<polyline>` per series.
    pub fn render(&self) -> String {
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let (mut xmax, mut ymax) = (0f64, 0f64);
        for &(x, y) in pts {
            if x.is_finite() {
                xmax = xmax.max(x);
            }
            if y.is_finite() {
                ymax = ymax.max(y);
            }
        }
        let xa = Axis::new(0.0, xmax * 1.02, 8);
        let ya = Axis::new(0.0, ymax, 6);
        let mut out = String::new();
        header(&mut out, &self.title);
        axes(&mut out, &xa, &ya, &self.x_label, &self.y_label);
        let (x0, x1, y0, y1) = (ML, W - MR, H - MB, MT);
        for (i, s) in self.series.iter().enumerate() {
            let mut p = String::new();
            for &(x, y) in s
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
            {
                let _ = write!(
                    p,
                    "{},{} ",
                    px(x0 + (x1 - x0) * xa.frac(x)),
                    px(y0 + (y1 - y0) * ya.frac(y))
                );
            }
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                colour(i),
                p.trim_end(),
                esc(&s.name)
            );
        }
        let names: Vec<String> = self.series.iter().map(|s| s.name.clone()).collect();
        legend(&mut out, &names, false);
        out.push_str("</svg>\n");
        out
    }
}

/// A labelled point of a [`ScatterChart`]; `group` picks the colour.
#[derive(Debug, Clone)]
pub struct ScatterPoint {
    pub label: String,
    pub x: f64,
    pub y: f64,
    pub group: usize,
}

/// Labelled points, coloured by group, over axes that start at zero (x) and
/// at the smallest value (y).
#[derive(Debug, Clone)]
pub struct ScatterChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub points: Vec<ScatterPoint>,
    /// Logarithmic x axis (for times spanning decades).
    pub x_log: bool,
}

impl ScatterChart {
    pub fn render(&self) -> String {
        let fin = self
            .points
            .iter()
            .filter(|p| p.x.is_finite() && p.y.is_finite());
        let (mut xmin, mut xmax) = (f64::INFINITY, 0f64);
        let (mut ymin, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in fin.clone() {
            if p.x > 0.0 {
                xmin = xmin.min(p.x);
            }
            xmax = xmax.max(p.x);
            ymin = ymin.min(p.y);
            ymax = ymax.max(p.y);
        }
        let xa = if self.x_log {
            Axis::log(xmin, xmax)
        } else {
            Axis::new(0.0, xmax * 1.08, 8)
        };
        let ya = Axis::new(ymin.min(1.0), ymax * 1.03, 6);
        let mut out = String::new();
        header(&mut out, &self.title);
        axes(&mut out, &xa, &ya, &self.x_label, &self.y_label);
        let (x0, x1, y0, y1) = (ML, W - MR, H - MB, MT);
        // Labels that would overlap an earlier one move down a line, or are
        // left to the tooltip.
        let mut placed: Vec<(f64, f64, f64)> = Vec::new(); // x, y, width
        for p in fin {
            let cx = x0 + (x1 - x0) * xa.frac(p.x);
            let cy = y0 + (y1 - y0) * ya.frac(p.y);
            let w = 6.0 * p.label.chars().count() as f64;
            let mut label_y = None;
            for k in 0..4 {
                let ly = cy - 5.0 + 11.0 * k as f64;
                let lx = cx + 6.0;
                let clash = placed.iter().any(|&(px_, py_, pw)| {
                    lx < px_ + pw && px_ < lx + w && (ly - py_).abs() < 10.0
                });
                if !clash {
                    label_y = Some(ly);
                    placed.push((lx, ly, w));
                    break;
                }
            }
            let _ = write!(
                out,
                r#"<g><circle cx="{}" cy="{}" r="4" fill="{}"><title>{}</title></circle>"#,
                px(cx),
                px(cy),
                colour(p.group),
                esc(&p.label),
            );
            if let Some(ly) = label_y {
                let _ = write!(
                    out,
                    r#"<text x="{}" y="{}" font-size="10" fill="{}">{}</text>"#,
                    px(cx + 6.0),
                    px(ly),
                    colour(p.group),
                    esc(&p.label)
                );
            }
            out.push_str("</g>\n");
        }
        // slow and poor (bottom-right) is usually empty
        legend(&mut out, &self.groups, true);
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal well-formedness check: tags balance, quotes close, one root `<svg>`.
    pub(crate) fn check_well_formed(s: &str) -> Result<Vec<String>, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut all = Vec::new();
        let mut rest = s;
        let mut roots = 0;
        while let Some(i) = rest.find('<') {
            let text = &rest[..i];
            if text.contains('>') {
                return Err(format!("stray '>' in text {text:?}"));
            }
            rest = &rest[i..];
            if rest.starts_with("<?") {
                let e = rest.find("?>").ok_or("unclosed <?")?;
                rest = &rest[e + 2..];
                continue;
            }
            // find the closing '>' outside quotes
            let mut in_q: Option<char> = None;
            let mut end = None;
            for (j, c) in rest.char_indices().skip(1) {
                match (in_q, c) {
                    (Some(q), c) if c == q => in_q = None,
                    (Some(_), '<') => return Err("'<' inside attribute".into()),
                    (Some(_), _) => {}
                    (None, '"') | (None, '\'') => in_q = Some(c),
                    (None, '>') => {
                        end = Some(j);
                        break;
                    }
                    (None, '<') => return Err("nested '<'".into()),
                    _ => {}
                }
            }
            let end = end.ok_or("unclosed tag")?;
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let name = name.trim();
                match stack.pop() {
                    Some(open) if open == name => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else {
                let name: String = tag
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != '/')
                    .collect();
                if name.is_empty() {
                    return Err("empty tag name".into());
                }
                if stack.is_empty() {
                    roots += 1;
                }
                all.push(name.clone());
                if !tag.trim_end().ends_with('/') {
                    stack.push(name);
                }
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed: {stack:?}"));
        }
        if roots != 1 || all.first().map(String::as_str) != Some("svg") {
            return Err("expected exactly one <svg> root".into());
        }
        Ok(all)
    }

    #[test]
    fn line_chart_is_well_formed() {
        let c = LineChart {
            title: "X or better <test> & \"quotes\"".into(),
            x_label: "IOPS".into(),
            y_label: "seconds".into(),
            series: vec![
                Series {
                    name: "a&b".into(),
                    points: vec![(0.0, 10.0), (5000.0, 10.0), (5000.0, 3.0), (12000.0, 0.0)],
                },
                Series {
                    name: "c".into(),
                    points: vec![(0.0, 10.0), (8000.0, 0.0)],
                },
            ],
        };
        let s = c.render();
        assert!(s.contains("<svg") && s.contains("</svg>"));
        let tags = check_well_formed(&s).unwrap();
        assert_eq!(tags.iter().filter(|t| *t == "polyline").count(), 2);
    }

    #[test]
    fn scatter_and_degenerate_ranges() {
        let c = ScatterChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            groups: vec!["1 writer".into()],
            points: vec![ScatterPoint {
                label: "lz4".into(),
                x: 0.0,
                y: 1.0,
                group: 0,
            }],
            x_log: true,
        };
        check_well_formed(&c.render()).unwrap();
        let empty = LineChart {
            title: "e".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![],
        };
        check_well_formed(&empty.render()).unwrap();
        assert!(check_well_formed("<svg><g></svg>").is_err());
        assert_eq!(nice_step(100.0, 10), 10.0);
        assert_eq!(nice_step(13000.0, 8), 2000.0);
    }
}
