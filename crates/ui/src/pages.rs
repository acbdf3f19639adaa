//! The page handlers. Each gathers what it shows in one blocking closure
//! over the engine (the calls the `/v1` handlers make; snapshot lists are
//! paged by the engine, so a page costs what it shows) and renders HTML.
//! Actions are `<form class="api">` elements the script turns into `/v1` requests:
//! `data-method`, `data-path` and `data-body` (a JSON template whose `${field}`
//! placeholders take the form's inputs), `data-cli` (the equivalent command,
//! recorded in `pool history`), `data-confirm` and `data-preview` (a dry run
//! shown in the confirmation).

use crate::html::{self, ago, bar, esc, page, size, state_class, time, url};
use crate::html_response;
use api::ApiState;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use dataset::{DatasetInfo, DatasetKind, Engine, PoolStatus, ScanFunction, ScanState};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Rows per page of snapshots and datasets.
const PER_PAGE: usize = 50;
const DATASETS_PER_PAGE: usize = 200;
/// A pool fuller than this is an alert (as the issue asks; zfs slows down past it).
const FULL_PCT: f64 = 80.0;
/// A scrub older than this is overdue (the monthly scrub most distributions schedule, plus slack).
const SCRUB_OVERDUE_SECS: i64 = 35 * 86_400;
/// Policy failures this recent are alerts.
const POLICY_ALERT_SECS: i64 = 7 * 86_400;

type PageResult = Result<String, dataset::Error>;

/// Runs `f` on the blocking pool and answers its page, or an error page.
async fn render<F>(st: &ApiState, title: &'static str, active: String, f: F) -> Response
where
    F: FnOnce(&ApiState, &Engine) -> PageResult + Send + 'static,
{
    let s = st.clone();
    let out = tokio::task::spawn_blocking(move || {
        let pools: Vec<String> = s.engine.list_pools().into_iter().map(|p| p.name).collect();
        (f(&s, &s.engine), pools)
    })
    .await;
    match out {
        Ok((Ok(body), pools)) => html_response(StatusCode::OK, page(title, &active, &pools, &body)),
        Ok((Err(e), pools)) => html_response(
            api::status_for(&e),
            page(
                title,
                &active,
                &pools,
                &format!("<p class=\"alert bad\">{}</p>", esc(&e.to_string())),
            ),
        ),
        Err(e) => html_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            page(
                title,
                &active,
                &[],
                &format!("<p class=\"alert bad\">{}</p>", esc(&e.to_string())),
            ),
        ),
    }
}

fn prop<'a>(d: &'a DatasetInfo, name: &str) -> &'a str {
    d.property(name).map_or("-", |p| p.value.as_str())
}

fn num(d: &DatasetInfo, name: &str) -> u64 {
    d.property(name)
        .and_then(|p| p.parsable.parse().ok())
        .unwrap_or(0)
}

/// An action form (see the module comment). `fields` is the inner HTML
/// (inputs and the submit button).
struct Action<'a> {
    method: &'a str,
    path: String,
    body: Option<serde_json::Value>,
    cli: String,
    confirm: Option<String>,
    preview: Option<(&'a str, String, serde_json::Value)>,
    then: &'a str,
    class: &'a str,
}

impl<'a> Action<'a> {
    fn new(method: &'a str, path: impl Into<String>, cli: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            body: None,
            cli: cli.into(),
            confirm: None,
            preview: None,
            then: "reload",
            class: "",
        }
    }
    fn body(mut self, b: serde_json::Value) -> Self {
        self.body = Some(b);
        self
    }
    fn confirm(mut self, c: impl Into<String>) -> Self {
        self.confirm = Some(c.into());
        self
    }
    /// A dry run shown in the confirmation: (kind, path, body) where kind is `destroy` or `rollback`.
    fn preview(mut self, kind: &'a str, path: String, body: serde_json::Value) -> Self {
        self.preview = Some((kind, path, body));
        self
    }
    fn then(mut self, t: &'a str) -> Self {
        self.then = t;
        self
    }
    fn class(mut self, c: &'a str) -> Self {
        self.class = c;
        self
    }
    fn form(&self, fields: &str) -> String {
        let mut a = format!(
            "<form class=\"api {}\" data-method=\"{}\" data-path=\"{}\" data-cli=\"{}\" data-then=\"{}\"",
            self.class,
            self.method,
            esc(&self.path),
            esc(&self.cli),
            esc(self.then)
        );
        if let Some(b) = &self.body {
            let _ = write!(a, " data-body=\"{}\"", esc(&b.to_string()));
        }
        if let Some(c) = &self.confirm {
            let _ = write!(a, " data-confirm=\"{}\"", esc(c));
        }
        if let Some((kind, path, body)) = &self.preview {
            let _ = write!(
                a,
                " data-preview=\"{kind}\" data-preview-path=\"{}\" data-preview-body=\"{}\"",
                esc(path),
                esc(&body.to_string())
            );
        }
        let _ = write!(a, ">{fields}<span class=\"err\"></span></form>");
        a
    }
    fn button(&self, label: &str, cls: &str) -> String {
        self.form(&format!(
            "<button type=\"submit\" class=\"{cls}\">{}</button>",
            esc(label)
        ))
    }
}

// ------------------------------------------------------------------ alerts

struct Alert {
    level: &'static str,
    text: String,
}

fn pool_alerts(s: &PoolStatus, policy_failures: &[(i64, String)], now: i64) -> Vec<Alert> {
    let mut out = Vec::new();
    let name = &s.summary.name;
    let bad = |t: String| Alert {
        level: "bad",
        text: t,
    };
    let warn = |t: String| Alert {
        level: "warn",
        text: t,
    };
    if let Some(why) = &s.suspended {
        out.push(bad(format!("pool {name} is SUSPENDED: {why}")));
    }
    if s.summary.health != "ONLINE" {
        out.push(bad(format!(
            "pool {name} is {}{}",
            s.summary.health,
            s.status
                .as_deref()
                .map(|x| format!(": {x}"))
                .unwrap_or_default()
        )));
    }
    for g in &s.groups {
        for d in &g.devices {
            let path = d.path.display();
            if d.state != "ONLINE" {
                out.push(bad(format!(
                    "device {path} in {} is {}{}",
                    g.name,
                    d.state,
                    d.reason
                        .as_deref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                )));
            }
            if d.checksum_errors > 0 {
                out.push(bad(format!(
                    "device {path} has {} checksum error(s) (CKSUM): it returned data that does not match its checksum",
                    d.checksum_errors
                )));
            }
            if d.read_errors + d.write_errors > 0 {
                out.push(bad(format!(
                    "device {path} has {} read and {} write error(s)",
                    d.read_errors, d.write_errors
                )));
            }
        }
    }
    if !s.data_errors.is_empty() {
        out.push(bad(format!(
            "pool {name} has {} block(s) no copy could repair (see pool status -v)",
            s.data_errors.len()
        )));
    }
    let used_pct = s.summary.allocated as f64 / s.summary.size.max(1) as f64 * 100.0;
    if used_pct > FULL_PCT {
        out.push(warn(format!("pool {name} is {used_pct:.0}% full")));
    }
    match &s.scan {
        Some(sc) if sc.function == ScanFunction::Scrub && sc.errors > 0 => out.push(bad(format!(
            "the last scrub of {name} found {} error(s) it could not repair",
            sc.errors
        ))),
        Some(sc)
            if sc.function == ScanFunction::Scrub
                && sc.state == ScanState::Finished
                && now - sc.end_time as i64 > SCRUB_OVERDUE_SECS =>
        {
            out.push(warn(format!(
                "scrub of {name} overdue: the last one finished {} ago",
                ago(now - sc.end_time as i64)
            )))
        }
        None => out.push(warn(format!("pool {name} has never been scrubbed"))),
        _ => {}
    }
    for (t, what) in policy_failures {
        out.push(warn(format!(
            "snapshot policy run failed {} ago: {what}",
            ago(now - t)
        )));
    }
    out
}

/// Policy runs with errors in the last week, per pool.
fn policy_failures(e: &Engine, now: i64) -> HashMap<String, Vec<(i64, String)>> {
    let mut out: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    for r in e.policy_history(None) {
        if !r.errors.is_empty() && now - r.time < POLICY_ALERT_SECS {
            let pool = r.dataset.split(['/', '@']).next().unwrap_or("").to_string();
            out.entry(pool).or_default().push((
                r.time,
                format!("{} ({}): {}", r.dataset, r.policy, r.errors.join("; ")),
            ));
        }
    }
    out
}

/// Space of a pool from its datasets, for its bar.
struct PoolSpace {
    data: u64,
    reserved: u64,
    snapshots: u64,
    free: u64,
    ratio: String,
}

impl PoolSpace {
    fn bar(&self) -> String {
        bar(
            &[
                ("data", self.data, "data"),
                ("snap", self.snapshots, "snapshots"),
                ("resv", self.reserved, "reserved, not yet written"),
                ("free", self.free, "free"),
            ],
            self.data + self.snapshots + self.reserved + self.free,
        )
    }
}

fn pool_space(e: &Engine, pool: &str) -> Result<PoolSpace, dataset::Error> {
    let (_, list) = e.list_datasets_page(
        Some(pool),
        &[
            DatasetKind::Filesystem,
            DatasetKind::Volume,
            DatasetKind::Bucket,
        ],
        None,
        0,
        usize::MAX,
    )?;
    let root = list.iter().find(|d| d.name == pool);
    let snapshots: u64 = list.iter().map(|d| num(d, "usedbysnapshots")).sum();
    let reserved: u64 = list.iter().map(|d| num(d, "usedbyrefreservation")).sum();
    let used = root.map_or(0, |r| num(r, "used"));
    Ok(PoolSpace {
        data: used.saturating_sub(snapshots + reserved),
        reserved,
        snapshots,
        free: root.map_or(0, |r| num(r, "available")),
        ratio: root.map_or("-".into(), |r| prop(r, "compressratio").to_string()),
    })
}

fn alerts_html(alerts: &[Alert]) -> String {
    if alerts.is_empty() {
        return "<p class=\"alert ok\">No alerts: every device is online, no errors.</p>".into();
    }
    let mut o = String::from("<ul class=\"alerts\">");
    for a in alerts {
        let _ = write!(o, "<li class=\"alert {}\">{}</li>", a.level, esc(&a.text));
    }
    o.push_str("</ul>");
    o
}

fn charts_html(pool: &str) -> String {
    format!(
        "<div class=\"charts\"><figure><figcaption>Pool I/O, last hour (bytes/s)</figcaption>\
         <svg class=\"chart\" data-chart=\"pool-bw\" data-pool=\"{p}\" viewBox=\"0 0 600 170\"></svg></figure>\
         <figure><figcaption>NBD requests, last hour (IOPS, all exports)</figcaption>\
         <svg class=\"chart\" data-chart=\"nbd-iops\" viewBox=\"0 0 600 170\"></svg></figure></div>",
        p = esc(pool)
    )
}

// ------------------------------------------------------------------ overview

pub async fn overview(State(st): State<ApiState>) -> Response {
    render(&st, "Overview", "/".into(), |_, e| {
        let now = html::now();
        let failures = policy_failures(e, now);
        let mut o = String::new();
        let pools = e.list_pools();
        if pools.is_empty() {
            o.push_str("<p>No pool is imported. Create one:</p>");
        }
        let mut all_alerts = Vec::new();
        let mut cards = String::new();
        for p in &pools {
            let s = e.pool_status(&p.name)?;
            let space = pool_space(e, &p.name)?;
            let alerts = pool_alerts(
                &s,
                failures.get(&p.name).map_or(&[][..], |v| v.as_slice()),
                now,
            );
            let pct = p.allocated as f64 / p.size.max(1) as f64 * 100.0;
            let _ = write!(
                cards,
                "<section class=\"card pool\" id=\"pool-{id}\"><h2><a href=\"/pools/{u}\">{n}</a> \
                 <span class=\"badge {c}\">{h}</span></h2>\
                 <p class=\"kv\"><span>size {size}</span><span>allocated {alloc} ({pct:.0}%)</span>\
                 <span>compressratio <b class=\"ratio\">{ratio}</b></span><span>txg {txg}</span></p>{bar}{charts}</section>",
                id = esc(&p.name),
                u = url(&p.name),
                n = esc(&p.name),
                c = state_class(&p.health),
                h = esc(&p.health),
                size = size(p.size),
                alloc = size(p.allocated),
                ratio = esc(&space.ratio),
                txg = p.txg,
                bar = space.bar(),
                charts = charts_html(&p.name),
            );
            all_alerts.extend(alerts);
        }
        let _ = write!(o, "<section class=\"card\"><h2>Alerts</h2>{}</section>", alerts_html(&all_alerts));
        o.push_str(&cards);
        o.push_str(&create_pool_form());
        Ok(o)
    })
    .await
}

fn create_pool_form() -> String {
    let a = Action::new(
        "POST",
        "/v1/pools",
        "cistern pool create ${name} ${kind} ${devices}",
    )
    .body(json!({
        "name": "${name}",
        "groups": [{"kind": "${kind}", "devices": "${list:devices}"}],
        "create_size": "${optsize:create_size}",
    }))
    .confirm("Create pool ${name} as ${kind} over ${devices}? Devices that exist are overwritten.");
    format!(
        "<section class=\"card\"><h2>Create a pool</h2>{}</section>",
        a.form(
            "<label>Name <input name=\"name\" required pattern=\"[A-Za-z][A-Za-z0-9_.:-]*\"></label>\
             <label>Layout <select name=\"kind\"><option value=\"mirror\">mirror</option>\
             <option value=\"disk\">disk (stripe)</option><option value=\"raidz1\">raidz1</option>\
             <option value=\"raidz2\">raidz2</option><option value=\"raidz3\">raidz3</option></select></label>\
             <label>Devices (absolute paths, comma-separated) <input name=\"devices\" size=\"60\" required></label>\
             <label>Create missing files sparse, of size <input name=\"create_size\" placeholder=\"e.g. 10G\" size=\"8\"></label>\
             <button type=\"submit\">Create pool</button>"
        )
    )
}

// ------------------------------------------------------------------ pool

#[derive(Deserialize, Default)]
pub struct PlanQuery {
    drives: Option<u32>,
    size: Option<String>,
    iops: Option<f64>,
    mbps: Option<f64>,
}

pub async fn pool(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Query(q): Query<PlanQuery>,
) -> Response {
    let active = format!("/pools/{}", url(&pool));
    render(&st, "Pool", active, move |_, e| {
        let s = e.pool_status(&pool)?;
        let now = html::now();
        let failures = policy_failures(e, now);
        let space = pool_space(e, &pool)?;
        let sum = &s.summary;
        let mut o = String::new();
        let _ = write!(
            o,
            "<section class=\"card\"><h2>{n} <span class=\"badge {c}\">{h}</span></h2>\
             <p class=\"kv\"><span>size {sz}</span><span>allocated {al}</span><span>free {fr}</span>\
             <span>fragmentation {frag}</span><span>compressratio {ratio}</span><span>txg {txg}</span></p>{bar}",
            n = esc(&sum.name),
            c = state_class(&sum.health),
            h = esc(&sum.health),
            sz = size(sum.size),
            al = size(sum.allocated),
            fr = size(sum.free),
            frag = sum.fragmentation.map_or("-".into(), |f| format!("{f}%")),
            ratio = esc(&space.ratio),
            txg = sum.txg,
            bar = space.bar(),
        );
        if let Some(st) = &s.status {
            let _ = write!(o, "<p><b>status:</b> {}</p>", esc(st));
        }
        if let Some(a) = &s.action {
            let _ = write!(o, "<p><b>action:</b> {}</p>", esc(a));
        }
        o.push_str(&alerts_html(&pool_alerts(
            &s,
            failures.get(&pool).map_or(&[][..], |v| v.as_slice()),
            now,
        )));
        o.push_str("</section>");
        o.push_str(&scan_html(&s));
        o.push_str(&devices_html(&s));
        o.push_str(&format!("<section class=\"card\"><h2>I/O</h2>{}</section>", charts_html(&pool)));
        o.push_str(&planner_html(&s, &q));
        let mut hist = e.pool_history(&pool)?;
        hist.retain(|h| !h.internal);
        let _ = write!(o, "<section class=\"card\"><h2>Recent commands (pool history)</h2><table><tr><th>time</th><th>command</th><th>user</th></tr>");
        for h in hist.iter().rev().take(15) {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                time(h.time as i64),
                esc(&h.command),
                esc(&h.user)
            );
        }
        o.push_str("</table></section>");
        Ok(o)
    })
    .await
}

fn scan_html(s: &PoolStatus) -> String {
    let pool = &s.summary.name;
    let mut o = format!(
        "<section class=\"card\" id=\"scan\" data-poll-scan=\"{}\"><h2>Scrub and resilver</h2>",
        esc(pool)
    );
    match &s.scan {
        None => o.push_str("<p class=\"scan-text\">No scrub has run on this pool.</p>"),
        Some(sc) => {
            let what = match sc.function {
                ScanFunction::Scrub => "scrub",
                ScanFunction::Resilver => "resilver",
            };
            let pct = if sc.total == 0 {
                100.0
            } else {
                (sc.examined as f64 / sc.total as f64 * 100.0).min(100.0)
            };
            let text = match sc.state {
                ScanState::Scanning => format!(
                    "{what} in progress since {}: {} of {} examined ({pct:.1}%), {} repaired, {} errors, {}/s{}",
                    time(sc.start_time as i64),
                    size(sc.examined),
                    size(sc.total),
                    size(sc.repaired),
                    sc.errors,
                    size(sc.rate),
                    sc.eta_secs.map(|s| format!(", {} to go", ago(s as i64))).unwrap_or_default()
                ),
                ScanState::Paused => format!(
                    "{what} paused at {pct:.1}% ({} of {})",
                    size(sc.examined),
                    size(sc.total)
                ),
                ScanState::Finished => format!(
                    "{what} repaired {} in {} with {} errors on {}",
                    size(sc.repaired),
                    ago(sc.elapsed_secs as i64),
                    sc.errors,
                    time(sc.end_time as i64)
                ),
                ScanState::Canceled => format!("{what} canceled on {}", time(sc.end_time as i64)),
            };
            let state = format!("{:?}", sc.state).to_lowercase();
            let _ = write!(
                o,
                "<div class=\"progress\"><span style=\"width:{pct:.1}%\"></span></div>\
                 <p class=\"scan-text\" data-state=\"{state}\">{}</p>",
                esc(&text)
            );
        }
    }
    o.push_str("<div class=\"row\">");
    let path = format!("/v1/pools/{}/scrub", url(pool));
    o.push_str(
        &Action::new("POST", path.clone(), format!("cistern pool scrub {pool}"))
            .body(json!({"action": "start"}))
            .class("inline")
            .button("Start / resume scrub", ""),
    );
    o.push_str(
        &Action::new(
            "POST",
            path.clone(),
            format!("cistern pool scrub -p {pool}"),
        )
        .body(json!({"action": "pause"}))
        .class("inline")
        .button("Pause", ""),
    );
    o.push_str(
        &Action::new("POST", path, format!("cistern pool scrub -s {pool}"))
            .body(json!({"action": "stop"}))
            .class("inline")
            .confirm(format!(
                "Cancel the scrub of {pool}? A new scrub starts from the beginning."
            ))
            .button("Cancel", "danger"),
    );
    o.push_str("</div></section>");
    o
}

fn devices_html(s: &PoolStatus) -> String {
    let pool = &s.summary.name;
    let mut o = String::from(
        "<section class=\"card\"><h2>Devices</h2><table class=\"devices\"><tr><th>name</th><th>state</th>\
         <th>READ</th><th>WRITE</th><th>CKSUM</th><th>actions</th></tr>",
    );
    let _ = write!(
        o,
        "<tr class=\"pool-row\"><td>{}</td><td><span class=\"badge {}\">{}</span></td><td></td><td></td><td></td><td></td></tr>",
        esc(pool),
        state_class(&s.summary.health),
        esc(&s.summary.health)
    );
    for g in &s.groups {
        let single = g.devices.len() == 1 && g.kind == dataset::GroupKind::Disk;
        if !single {
            let _ = write!(
                o,
                "<tr class=\"group-row\"><td class=\"indent1\">{}</td><td><span class=\"badge {}\">{}</span></td><td></td><td></td><td></td><td></td></tr>",
                esc(&g.name),
                state_class(&g.state),
                esc(&g.state)
            );
        }
        let ind = if single { "indent1" } else { "indent2" };
        for d in &g.devices {
            let path = d.path.display().to_string();
            let dev = if d.was.is_some() {
                d.guid.to_string()
            } else {
                path.clone()
            };
            let mut actions = String::new();
            let p = url(pool);
            if d.state == "OFFLINE" {
                actions.push_str(
                    &Action::new("POST", format!("/v1/pools/{p}/online"), format!("cistern pool online {pool} {dev}"))
                        .body(json!({"device": dev}))
                        .class("inline")
                        .confirm(format!(
                            "Bring {path} back online? It receives I/O again, and what it missed while offline is resilvered from the other devices."
                        ))
                        .button("Online", ""),
                );
            } else {
                actions.push_str(
                    &Action::new("POST", format!("/v1/pools/{p}/offline"), format!("cistern pool offline {pool} {dev}"))
                        .body(json!({"device": dev}))
                        .class("inline")
                        .confirm(format!(
                            "Take {path} offline? No more I/O goes to it; {g} runs DEGRADED on its other devices until you bring it online, \
                             then what it missed is resilvered. Refused if data would be lost.",
                            g = g.name
                        ))
                        .button("Offline", ""),
                );
            }
            if d.read_errors + d.write_errors + d.checksum_errors > 0 || d.state == "FAULTED" {
                actions.push_str(
                    &Action::new(
                        "POST",
                        format!("/v1/pools/{p}/clear"),
                        format!("cistern pool clear {pool} {dev}"),
                    )
                    .body(json!({"device": dev}))
                    .class("inline")
                    .button("Clear errors", ""),
                );
            }
            actions.push_str(
                &Action::new("POST", format!("/v1/pools/{p}/replace"), format!("cistern pool replace {pool} {dev} ${{new}}"))
                    .body(json!({"old": dev, "new": "${new}"}))
                    .class("inline")
                    .confirm(format!(
                        "Replace {path} with ${{new}}? ${{new}} must exist; it takes {path}'s place and everything {path} held \
                         is rebuilt onto it from the other devices (resilver). {path} is no longer used by the pool."
                    ))
                    .form("<input name=\"new\" placeholder=\"/path/of/new/device\" size=\"22\" required><button type=\"submit\">Replace</button>"),
            );
            let label = match &d.was {
                Some(w) => format!("{} (was {})", d.guid, w.display()),
                None => path.clone(),
            };
            let _ = write!(
                o,
                "<tr class=\"device-row\" data-device=\"{dp}\"><td class=\"{ind}\">{label}{res}{why}</td>\
                 <td><span class=\"badge {c}\">{st}</span></td><td class=\"n read\">{r}</td><td class=\"n write\">{w}</td>\
                 <td class=\"n cksum\">{ck}</td><td>{actions}</td></tr>",
                dp = esc(&path),
                label = esc(&label),
                res = if d.resilvering { " <i>(resilvering)</i>" } else { "" },
                why = d.reason.as_deref().map(|r| format!(" <i>{}</i>", esc(r))).unwrap_or_default(),
                c = state_class(&d.state),
                st = esc(&d.state),
                r = d.read_errors,
                w = d.write_errors,
                ck = d.checksum_errors,
            );
        }
    }
    o.push_str("</table>");
    for (title, kind) in [
        ("Per-device I/O, last hour (operations/s)", "device-io"),
        ("Per-device error counters, last hour", "device"),
    ] {
        let _ = write!(o, "<h3>{title}</h3><div class=\"charts\">");
        for g in &s.groups {
            for d in &g.devices {
                let path = d.path.display().to_string();
                let _ = write!(
                    o,
                    "<figure><figcaption>{}</figcaption><svg class=\"chart small\" data-chart=\"{kind}\" data-pool=\"{}\" \
                     data-device=\"{}\" viewBox=\"0 0 600 170\"></svg></figure>",
                    esc(&path),
                    esc(pool),
                    esc(&path)
                );
            }
        }
        o.push_str("</div>");
    }
    o.push_str(
        "<p class=\"note\">The same counters as <code>cistern pool iostat -v</code> \
                (latency histograms: <code>pool iostat -w</code>).</p></section>",
    );
    o
}

fn parse_drive_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "K" | "KIB" => 1024.0,
        "M" | "MIB" => 1024f64.powi(2),
        "G" | "GIB" => 1024f64.powi(3),
        "T" | "TIB" => 1024f64.powi(4),
        _ => return None,
    };
    Some((n * mult) as u64)
}

fn planner_html(s: &PoolStatus, q: &PlanQuery) -> String {
    let ndev: u32 = s.groups.iter().map(|g| g.devices.len() as u32).sum();
    let dev_size = s
        .groups
        .iter()
        .flat_map(|g| g.devices.iter())
        .filter_map(|d| std::fs::metadata(&d.path).ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(8_000_000_000_000);
    let drives = q
        .drives
        .unwrap_or(ndev + 2)
        .clamp(1, bench::plan::MAX_DRIVES);
    let size_text = q.size.clone().unwrap_or_else(|| dev_size.to_string());
    let (iops, mbps) = (q.iops.unwrap_or(180.0), q.mbps.unwrap_or(250.0));
    let mut o = format!(
        "<section class=\"card\" id=\"planner\"><h2>Layout planner: what if the pool had these drives</h2>\
         <form method=\"get\" class=\"plan\"><label>Drives <input name=\"drives\" type=\"number\" min=\"1\" value=\"{drives}\"></label>\
         <label>Drive size <input name=\"size\" value=\"{}\" size=\"14\"></label>\
         <label>Drive IOPS <input name=\"iops\" value=\"{iops}\" size=\"6\"></label>\
         <label>Drive MB/s <input name=\"mbps\" value=\"{mbps}\" size=\"6\"></label>\
         <button type=\"submit\">Plan</button></form>\
         <p class=\"note\">As <code>cistern pool plan -n {drives} --size {} --iops {iops} --mbps {mbps}</code>: usable space \
         for 16K blocks and predicted speed from one drive's figures. This pool has {ndev} device(s).</p>",
        esc(&size_text),
        esc(&size_text),
    );
    let Some(bytes) = parse_drive_size(&size_text) else {
        let _ = write!(
            o,
            "<p class=\"alert bad\">'{}' is not a size</p></section>",
            esc(&size_text)
        );
        return o;
    };
    let req = bench::plan::Request {
        drives,
        spares: 0,
        drive: bench::plan::Drive {
            size: bytes,
            read_iops: iops,
            write_iops: iops,
            read_mbps: mbps,
            write_mbps: mbps,
        },
        block_size: 16 << 10,
        families: Vec::new(),
        min_width: None,
        max_width: None,
    };
    match bench::plan::plan(&req) {
        Err(e) => {
            let _ = write!(o, "<p class=\"alert bad\">{}</p>", esc(&e.to_string()));
        }
        Ok(plan) => {
            o.push_str(
                "<table class=\"plan\"><tr><th>layout</th><th>usable</th><th>eff</th><th>lose</th><th>lose-max</th>\
                 <th>R-IOPS</th><th>W-IOPS</th><th>R-MB/s</th><th>W-MB/s</th><th>note</th></tr>",
            );
            for l in plan.layouts.iter().take(30) {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.0}%</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{:.0}</td><td class=\"n\">{:.0}</td><td class=\"n\">{:.0}</td><td class=\"n\">{:.0}</td><td>{}</td></tr>",
                    esc(&l.name),
                    size(l.usable_bytes),
                    l.efficiency_pct,
                    l.lose_any,
                    l.lose_max,
                    l.random_read_iops,
                    l.random_write_iops,
                    l.seq_read_mbps,
                    l.seq_write_mbps,
                    esc(l.note.as_deref().unwrap_or("-"))
                );
            }
            o.push_str("</table>");
            for sk in &plan.skipped {
                let _ = write!(o, "<p class=\"note\">{}</p>", esc(sk));
            }
        }
    }
    o.push_str("</section>");
    o
}

// ------------------------------------------------------------------ datasets

#[derive(Deserialize, Default)]
pub struct PageQuery {
    page: Option<usize>,
    name: Option<String>,
}

fn pager(base: &str, page: usize, pages: usize) -> String {
    if pages <= 1 {
        return String::new();
    }
    let mut o = String::from("<nav class=\"pager\">");
    if page > 0 {
        let _ = write!(
            o,
            "<a href=\"{base}page={}\" rel=\"prev\">&larr; newer</a>",
            page - 1
        );
    }
    let _ = write!(o, "<span>page {} of {pages}</span>", page + 1);
    if page + 1 < pages {
        let _ = write!(
            o,
            "<a href=\"{base}page={}\" rel=\"next\">older &rarr;</a>",
            page + 1
        );
    }
    o.push_str("</nav>");
    o
}

pub async fn datasets(State(st): State<ApiState>, Query(q): Query<PageQuery>) -> Response {
    render(&st, "Datasets", "/datasets".into(), move |_, e| {
        let page = q.page.unwrap_or(0);
        let kinds = [DatasetKind::Filesystem, DatasetKind::Volume, DatasetKind::Bucket];
        let (total, list) = e.list_datasets_page(None, &kinds, None, page * DATASETS_PER_PAGE, DATASETS_PER_PAGE)?;
        let pages = total.div_ceil(DATASETS_PER_PAGE);
        let mut o = String::new();
        let _ = write!(o, "<section class=\"card\"><p>{total} datasets.</p>{}", pager_plain("/datasets?", page, pages));
        o.push_str(
            "<table class=\"tree\"><tr><th>name</th><th>type</th><th>used</th><th>avail</th><th>refer</th>\
             <th>ratio</th><th>space: data / snapshots / children / reserved</th><th></th></tr>",
        );
        for d in &list {
            let depth = d.name.matches('/').count();
            let short = d.name.rsplit('/').next().unwrap_or(&d.name);
            let used = num(d, "used");
            let kind = format!("{:?}", d.kind).to_lowercase();
            let _ = write!(
                o,
                "<tr data-name=\"{n}\"><td style=\"padding-left:{pad}em\"><a href=\"/dataset?name={u}\">{s}</a></td><td>{kind}</td>\
                 <td class=\"n\">{used}</td><td class=\"n\">{avail}</td><td class=\"n\">{refer}</td><td class=\"n\">{ratio}</td><td>{bar}</td>\
                 <td><a href=\"/snapshots?name={u}\">snapshots</a></td></tr>",
                n = esc(&d.name),
                pad = 0.4 + depth as f64 * 1.4,
                u = url(&d.name),
                s = esc(if depth == 0 { &d.name } else { short }),
                used = esc(prop(d, "used")),
                avail = esc(prop(d, "available")),
                refer = esc(prop(d, "referenced")),
                ratio = esc(prop(d, "compressratio")),
                bar = mini_bar(
                    &[
                        ("data", num(d, "usedbydataset")),
                        ("snap", num(d, "usedbysnapshots")),
                        ("child", num(d, "usedbychildren")),
                        ("resv", num(d, "usedbyrefreservation")),
                    ],
                    used
                ),
            );
        }
        o.push_str("</table></section>");
        o.push_str(&create_dataset_form(list.first().map(|d| d.name.split('/').next().unwrap_or("")).unwrap_or("tank")));
        Ok(o)
    })
    .await
}

fn pager_plain(base: &str, page: usize, pages: usize) -> String {
    pager(base, page, pages)
        .replace("&larr; newer", "&larr; previous")
        .replace("older &rarr;", "next &rarr;")
}

fn mini_bar(parts: &[(&str, u64)], total: u64) -> String {
    let mut o = String::from("<div class=\"bar mini\">");
    let t = total.max(1) as f64;
    for (cls, v) in parts {
        let _ = write!(
            o,
            "<span class=\"{cls}\" style=\"width:{:.1}%\" title=\"{cls} {}\"></span>",
            (*v as f64 / t * 100.0).min(100.0),
            size(*v)
        );
    }
    o.push_str("</div>");
    o
}

fn create_dataset_form(pool: &str) -> String {
    let a = Action::new("POST", "/v1/datasets", "cistern create -t ${kind} ${name}")
        .body(json!({
            "name": "${name}",
            "kind": "${kind}",
            "volsize": "${size:volsize}",
            "properties": "${props:properties}",
        }))
        .then("reload");
    format!(
        "<section class=\"card\" id=\"create\"><h2>Create a volume, bucket or filesystem</h2>{}</section>",
        a.form(&format!(
            "<label>Type <select name=\"kind\"><option value=\"volume\">volume</option>\
             <option value=\"filesystem\">filesystem</option><option value=\"bucket\">bucket</option></select></label>\
             <label>Name <input name=\"name\" value=\"{}/\" size=\"24\" required></label>\
             <label>Size (volumes) <input name=\"volsize\" placeholder=\"e.g. 1G\" size=\"8\"></label>\
             <label><span>Properties (one <code>name=value</code> a line)</span><textarea name=\"properties\" rows=\"2\" cols=\"32\" \
             placeholder=\"compression=zstd\"></textarea></label>\
             <button type=\"submit\">Create</button>",
            esc(pool)
        ))
    )
}

pub async fn dataset(State(st): State<ApiState>, Query(q): Query<PageQuery>) -> Response {
    render(&st, "Dataset", "/datasets".into(), move |_, e| {
        let name = q.name.unwrap_or_default();
        let d = e.dataset(&name)?;
        let u = url(&name);
        let mut o = format!(
            "<section class=\"card\"><h2>{n} <span class=\"badge\">{k}</span></h2>\
             <p class=\"kv\"><span>used {used}</span><span>available {avail}</span><span>referenced {refer}</span>\
             <span>compressratio {ratio}</span></p>{bar}<p><a href=\"/snapshots?name={u}\">Snapshots of {n}</a></p></section>",
            n = esc(&name),
            k = format!("{:?}", d.kind).to_lowercase(),
            used = esc(prop(&d, "used")),
            avail = esc(prop(&d, "available")),
            refer = esc(prop(&d, "referenced")),
            ratio = esc(prop(&d, "compressratio")),
            bar = bar(
                &[
                    ("data", num(&d, "usedbydataset"), "data"),
                    ("snap", num(&d, "usedbysnapshots"), "snapshots"),
                    ("child", num(&d, "usedbychildren"), "children"),
                    ("resv", num(&d, "usedbyrefreservation"), "reserved"),
                ],
                num(&d, "used")
            ),
        );
        o.push_str("<section class=\"card\"><h2>Properties</h2><table class=\"props\"><tr><th>property</th><th>value</th><th>source</th><th>change</th></tr>");
        for p in &d.properties {
            let editable = p.source != "-" && d.kind != DatasetKind::Snapshot;
            let mut change = String::new();
            if editable {
                change.push_str(
                    &Action::new("PATCH", format!("/v1/dataset?name={u}"), format!("cistern set {}=${{value}} {name}", p.name))
                        .body(json!({"property": p.name, "value": "${value}"}))
                        .class("inline")
                        .form(&format!(
                            "<input name=\"value\" value=\"{}\" size=\"14\"><button type=\"submit\">Set</button>",
                            esc(&p.value)
                        )),
                );
                if p.source == "local" {
                    change.push_str(
                        &Action::new("POST", "/v1/inherit", format!("cistern inherit {} {name}", p.name))
                            .body(json!({"name": name, "property": p.name}))
                            .class("inline")
                            .button("Inherit", ""),
                    );
                }
            }
            let _ = write!(
                o,
                "<tr data-prop=\"{pn}\"><td>{pn}</td><td class=\"value\">{v}</td><td class=\"source\">{s}</td><td>{change}</td></tr>",
                pn = esc(&p.name),
                v = esc(&p.value),
                s = esc(&p.source),
            );
        }
        o.push_str("</table>");
        o.push_str(
            &Action::new("PATCH", format!("/v1/dataset?name={u}"), format!("cistern set ${{property}}=${{value}} {name}"))
                .body(json!({"property": "${property}", "value": "${value}"}))
                .form("<label>Set another property <input name=\"property\" placeholder=\"com.example:note\" size=\"18\" required></label>\
                       <label>to <input name=\"value\" size=\"14\" required></label><button type=\"submit\">Set</button>"),
        );
        o.push_str("</section>");
        if !name.contains('/') {
            return Ok(o);
        }
        let dry = format!("/v1/dataset?name={u}&recursive=true&dependents=false&dry_run=true");
        o.push_str(&format!(
            "<section class=\"card\"><h2>Destroy</h2>{}</section>",
            Action::new("DELETE", format!("/v1/dataset?name={u}&recursive=true&dependents=false"), format!("cistern destroy -r {name}"))
                .confirm(format!("Destroy {name}, its children and its snapshots? This cannot be undone."))
                .preview("destroy", dry, serde_json::Value::Null)
                .then("goto:/datasets")
                .button(&format!("Destroy {name}"), "danger")
        ));
        Ok(o)
    })
    .await
}

// ------------------------------------------------------------------ snapshots

pub async fn snapshots(State(st): State<ApiState>, Query(q): Query<PageQuery>) -> Response {
    render(&st, "Snapshots", "/snapshots".into(), move |_, e| {
        let Some(name) = q.name.filter(|n| !n.is_empty()) else {
            // Which dataset: a list to choose from.
            let kinds = [DatasetKind::Filesystem, DatasetKind::Volume, DatasetKind::Bucket];
            let (_, list) = e.list_datasets_page(None, &kinds, None, 0, 1000)?;
            let mut o = String::from("<section class=\"card\"><h2>Choose a dataset</h2><table><tr><th>dataset</th><th>snapshots use</th></tr>");
            for d in &list {
                let _ = write!(
                    o,
                    "<tr><td><a href=\"/snapshots?name={}\">{}</a></td><td class=\"n\">{}</td></tr>",
                    url(&d.name),
                    esc(&d.name),
                    esc(prop(d, "usedbysnapshots"))
                );
            }
            o.push_str("</table></section>");
            return Ok(o);
        };
        let d = e.dataset(&name)?;
        let snap_kind = [DatasetKind::Snapshot];
        // Snapshots directly of this dataset, newest first; the engine pages
        // in creation order (oldest first), so count, then take the window.
        let (own_total, _) = e.list_datasets_page(Some(&name), &snap_kind, Some(1), 0, 0)?;
        let page = q.page.unwrap_or(0);
        let pages = own_total.div_ceil(PER_PAGE).max(1);
        let end = own_total.saturating_sub(page * PER_PAGE);
        let start = end.saturating_sub(PER_PAGE);
        let (_, mut list) = e.list_datasets_page(Some(&name), &snap_kind, Some(1), start, end - start)?;
        list.reverse();
        let u = url(&name);
        let mut o = format!(
            "<section class=\"card\"><h2>{n}</h2><p class=\"kv\"><span>{own_total} snapshot(s)</span>\
             <span>they use {snapused}</span><span>written since the newest: {written}</span>\
             <span><a href=\"/dataset?name={u}\">properties</a></span></p>",
            n = esc(&name),
            snapused = esc(prop(&d, "usedbysnapshots")),
            written = esc(prop(&d, "written")),
        );
        let stamp = time(html::now());
        // manual-2026-11-26T1405Z
        let default_name = format!("manual-{}T{}{}Z", &stamp[..10], &stamp[11..13], &stamp[14..16]);
        o.push_str(
            &Action::new("POST", "/v1/snapshots", format!("cistern snapshot {name}@${{snap}}"))
                .body(json!({"names": [format!("{name}@${{snap}}")], "recursive": "${bool:recursive}"}))
                .form(&format!(
                    "<label>New snapshot <input name=\"snap\" value=\"{}\" size=\"24\" required></label>\
                     <label><input type=\"checkbox\" name=\"recursive\"> and of every dataset below (-r)</label>\
                     <button type=\"submit\" id=\"take-snapshot\">Take snapshot</button>",
                    esc(&default_name)
                )),
        );
        o.push_str("</section><section class=\"card\"><h2>Timeline (newest first)</h2>");
        o.push_str(&pager(&format!("/snapshots?name={u}&"), page, pages));
        let max_used = list.iter().map(|s| num(s, "used")).max().unwrap_or(0).max(1);
        o.push_str(
            "<table class=\"snapshots\"><tr><th>created</th><th>snapshot</th><th>used</th><th>written</th>\
             <th>refer</th><th>kind</th><th>holds</th><th>actions</th></tr>",
        );
        let mut options = String::new();
        for s in &list {
            let short = s.name.split_once('@').map_or("", |x| x.1);
            let auto = prop(s, dataset::AUTO_PROPERTY);
            let holds = num(s, "userrefs");
            let used = num(s, "used");
            let _ = write!(options, "<option value=\"{}\">{}</option>", esc(&s.name), esc(short));
            let su = url(&s.name);
            let mut actions = String::new();
            actions.push_str(
                &Action::new("POST", "/v1/rollback", format!("cistern rollback -r {}", s.name))
                    .body(json!({"snapshot": s.name, "recursive": true}))
                    .class("inline")
                    .confirm(format!("Roll {name} back to {short}? Its data becomes what it was when {short} was taken."))
                    .preview("rollback", "/v1/rollback".into(), json!({"snapshot": s.name, "dry_run": true}))
                    .button("Rollback", "danger rollback"),
            );
            actions.push_str(
                &Action::new("POST", "/v1/clone", format!("cistern clone {} ${{clone}}", s.name))
                    .body(json!({"snapshot": s.name, "name": "${clone}"}))
                    .class("inline")
                    .form(&format!(
                        "<input name=\"clone\" value=\"{}-clone\" size=\"14\" required><button type=\"submit\">Clone</button>",
                        esc(&name)
                    )),
            );
            actions.push_str(
                &Action::new("DELETE", format!("/v1/dataset?name={su}&dependents=false"), format!("cistern destroy {}", s.name))
                    .class("inline")
                    .confirm(format!("Destroy snapshot {short}?"))
                    .preview("destroy", format!("/v1/dataset?name={su}&dependents=false&dry_run=true"), serde_json::Value::Null)
                    .button("Destroy", "danger"),
            );
            if holds == 0 {
                actions.push_str(
                    &Action::new("POST", "/v1/holds", format!("cistern hold keep {}", s.name))
                        .body(json!({"tag": "keep", "snapshots": [s.name]}))
                        .class("inline")
                        .button("Hold", ""),
                );
            } else {
                actions.push_str(
                    &Action::new("DELETE", "/v1/holds", format!("cistern release keep {}", s.name))
                        .body(json!({"tag": "keep", "snapshots": [s.name]}))
                        .class("inline")
                        .button("Release 'keep'", ""),
                );
            }
            let _ = write!(
                o,
                "<tr data-snapshot=\"{n}\"><td>{c}</td><td>{sh}</td><td class=\"n used\"><div class=\"bar mini\"><span class=\"snap\" \
                 style=\"width:{w:.1}%\"></span></div>{us}</td><td class=\"n written\">{wr}</td><td class=\"n\">{rf}</td>\
                 <td>{kind}</td><td class=\"n\">{holds}</td><td>{actions}</td></tr>",
                n = esc(&s.name),
                c = esc(prop(s, "creation")),
                sh = esc(short),
                w = used as f64 / max_used as f64 * 100.0,
                us = esc(prop(s, "used")),
                wr = esc(prop(s, "written")),
                rf = esc(prop(s, "referenced")),
                kind = if auto == "-" {
                    "<span class=\"badge\">manual</span>".to_string()
                } else {
                    format!("<span class=\"badge auto\">auto: {}</span>", esc(auto))
                },
            );
        }
        o.push_str("</table>");
        o.push_str(&pager(&format!("/snapshots?name={u}&"), page, pages));
        let _ = write!(
            o,
            "</section><section class=\"card\"><h2>Difference between two snapshots</h2>\
             <form method=\"get\" action=\"/diff\"><label>from <select name=\"from\">{options}</select></label>\
             <label>to <select name=\"to\"><option value=\"\">now ({n})</option>{options}</select></label>\
             <button type=\"submit\">Diff</button></form></section>",
            n = esc(&name)
        );
        Ok(o)
    })
    .await
}

#[derive(Deserialize)]
pub struct DiffQuery {
    from: String,
    to: Option<String>,
}

pub async fn diff(State(st): State<ApiState>, Query(q): Query<DiffQuery>) -> Response {
    render(&st, "Diff", "/snapshots".into(), move |_, e| {
        let to = q.to.filter(|t| !t.is_empty());
        let r = e.diff(&q.from, to.as_deref())?;
        let mut o = format!(
            "<section class=\"card\"><h2>{} &rarr; {}</h2><p class=\"kv\"><span>changed <b>{}</b></span>\
             <span>{} range(s)</span><span>{} name(s)</span></p>",
            esc(&r.from),
            esc(&r.to),
            size(r.changed_bytes),
            r.ranges.len(),
            r.names.len()
        );
        if !r.names.is_empty() {
            o.push_str("<table><tr><th></th><th>name</th></tr>");
            for n in r.names.iter().take(500) {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}{}</td></tr>",
                    esc(&n.change.to_string()),
                    esc(&n.name),
                    n.renamed_to.as_deref().map(|t| format!(" &rarr; {}", esc(t))).unwrap_or_default()
                );
            }
            o.push_str("</table>");
        }
        if !r.ranges.is_empty() {
            o.push_str("<table><tr><th>offset</th><th>length</th></tr>");
            for c in r.ranges.iter().take(500) {
                let _ = write!(o, "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>", c.offset, size(c.length));
            }
            o.push_str("</table>");
            if r.ranges.len() > 500 {
                o.push_str("<p class=\"note\">first 500 ranges; <code>cistern diff --json</code> lists all</p>");
            }
        }
        o.push_str("</section>");
        Ok(o)
    })
    .await
}

// ------------------------------------------------------------------ policies

pub async fn policies(State(st): State<ApiState>) -> Response {
    render(&st, "Snapshot policies", "/policies".into(), |_, e| {
        let now = html::now();
        let mut o = String::from("<section class=\"card\"><h2>Policies</h2><table><tr><th>policy</th><th>schedule</th>\
            <th>keep</th><th>prefix</th><th>events</th><th>from</th><th>datasets</th></tr>");
        let infos = e.policies();
        for p in &infos {
            let v = &p.policy;
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&v.name),
                esc(&v.schedule),
                esc(&v.keep),
                esc(&v.prefix),
                esc(&v.events.join(", ")),
                esc(&v.origin),
                esc(&p.datasets.join(", "))
            );
        }
        o.push_str("</table></section><section class=\"card\"><h2>Datasets with a policy</h2><table><tr><th>dataset</th>\
            <th>policy</th><th>set</th><th>last run</th><th>next run</th><th>next run would</th><th></th></tr>");
        let mut seen = std::collections::BTreeSet::new();
        for p in &infos {
            for ds in &p.datasets {
                if !seen.insert(ds.clone()) {
                    continue;
                }
                let Ok(show) = e.policy_show(ds) else { continue };
                let next = show.plan.as_ref().and_then(|p| p.next_run);
                let would = show.plan.as_ref().map_or(String::from("-"), |p| {
                    format!(
                        "take {}, destroy {}",
                        p.create.as_deref().unwrap_or("nothing"),
                        p.destroy.len()
                    )
                });
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(ds),
                    esc(&show.policy.as_ref().map_or("-".into(), |p| p.name.clone())),
                    esc(&show.source.clone().unwrap_or_default()),
                    show.last_run.map_or("-".into(), time),
                    next.map_or("-".into(), |n| format!("{} (in {})", time(n), ago(n - now))),
                    esc(&would),
                    Action::new("POST", "/v1/policy/run", format!("cistern policy run {ds}"))
                        .body(json!({"dataset": ds}))
                        .class("inline")
                        .button("Run now", "")
                );
            }
        }
        o.push_str("</table><p class=\"note\">Set a policy with <code>cistern set snapshot:policy=NAME DATASET</code> \
                    or on the dataset's page (property <code>snapshot:policy</code>).</p></section>");
        o.push_str("<section class=\"card\"><h2>History (newest first)</h2><table><tr><th>time</th><th>dataset</th><th>policy</th>\
                    <th>trigger</th><th>created</th><th>destroyed</th><th>freed</th><th>errors</th></tr>");
        let mut hist = e.policy_history(None);
        hist.sort_by_key(|r| std::cmp::Reverse(r.time));
        for r in hist.iter().take(200) {
            let cls = if r.errors.is_empty() { "" } else { " class=\"failed\"" };
            let _ = write!(
                o,
                "<tr{cls}><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                time(r.time),
                esc(&r.dataset),
                esc(&r.policy),
                esc(&r.trigger),
                if r.dry_run { " (dry run)" } else { "" },
                esc(r.created.as_deref().unwrap_or("-")),
                r.destroyed_count.max(r.destroyed.len()),
                size(r.freed),
                esc(&r.errors.join("; "))
            );
        }
        o.push_str("</table></section>");
        Ok(o)
    })
    .await
}

// ------------------------------------------------------------------ S3 users

pub async fn users(State(st): State<ApiState>) -> Response {
    render(&st, "S3 users", "/users".into(), |s, _| {
        let Some(users) = &s.users else {
            return Ok("<p class=\"alert warn\">This daemon keeps no S3 users (no S3 endpoint).</p>".into());
        };
        let mut o = String::from("<section class=\"card\"><h2>Users</h2><table><tr><th>name</th><th>access key</th>\
            <th>created</th><th>grants</th><th></th></tr>");
        for u in users.list() {
            let grants: Vec<String> = u.grants.iter().map(|g| g.to_string()).collect();
            let _ = write!(
                o,
                "<tr data-user=\"{n}\"><td>{n}</td><td><code>{k}</code></td><td>{c}</td><td>{g}</td><td>{rm}</td></tr>",
                n = esc(&u.name),
                k = esc(&u.access_key),
                c = time(u.created as i64),
                g = esc(&grants.join(", ")),
                rm = Action::new("DELETE", format!("/v1/users/{}", url(&u.name)), format!("cistern user remove {}", u.name))
                    .class("inline")
                    .confirm(format!("Remove S3 user {}? Its key stops working at once.", u.name))
                    .button("Remove", "danger"),
            );
        }
        o.push_str("</table><p class=\"note\">Secret keys are shown once, when the user is made; the daemon \
                    never shows them again.</p></section>");
        let _ = write!(
            o,
            "<section class=\"card\"><h2>Add a user</h2>{}<div id=\"secret\" hidden></div></section>",
            Action::new("POST", "/v1/users", "cistern user add ${name} --grant ${grants}")
                .body(json!({"name": "${name}", "grants": "${grants:grants}"}))
                .then("secret")
                .form("<label>Name <input name=\"name\" required size=\"14\"></label>\
                       <label><span>Grants (<code>bucket=ro|rw</code>, comma-separated; <code>*</code>: every bucket)</span>\
                       <input name=\"grants\" size=\"24\" placeholder=\"photos=rw,logs=ro\"></label>\
                       <button type=\"submit\">Add user</button>")
        );
        Ok(o)
    })
    .await
}

// ------------------------------------------------------------------ shares and mounts

pub async fn shares(State(st): State<ApiState>) -> Response {
    render(&st, "Shares and mounts", "/shares".into(), |s, _| {
        let l = api::shares::list(s);
        let mut o = String::from("<section class=\"card\"><h2>Shares (SMB, NFS)</h2><table><tr><th>protocol</th><th>dataset</th>\
            <th>share</th><th>path</th><th></th></tr>");
        for sh in &l.shares {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&sh.protocol),
                esc(&sh.dataset),
                esc(&sh.name),
                esc(&sh.path.display().to_string()),
                Action::new("DELETE", "/v1/shares", format!("cistern unshare {}", sh.dataset))
                    .body(json!({"dataset": sh.dataset, "protocol": sh.protocol}))
                    .class("inline")
                    .confirm(format!("Stop sharing {} over {} until the next `share` or restart? Connected clients are dropped.", sh.dataset, sh.protocol))
                    .button("Unshare", "danger")
            );
        }
        o.push_str("</table>");
        for p in &l.problems {
            let _ = write!(o, "<p class=\"alert warn\">{} {}: {}</p>", esc(&p.protocol), esc(&p.dataset), esc(&p.why));
        }
        o.push_str("<p class=\"note\">A filesystem is shared by its properties: set <code>sharesmb=on</code> or \
                    <code>sharenfs=on</code> on its page.</p>");
        o.push_str(
            &Action::new("POST", "/v1/shares", "cistern share -a")
                .body(json!({}))
                .button("Share all (cistern share -a)", ""),
        );
        o.push_str("</section><section class=\"card\"><h2>FUSE mounts</h2>");
        match &s.mounts {
            None => o.push_str("<p>This daemon mounts nothing.</p>"),
            Some(m) => {
                o.push_str("<table><tr><th>dataset</th><th>mountpoint</th><th></th></tr>");
                for mi in m.list() {
                    let _ = write!(
                        o,
                        "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                        esc(&mi.dataset),
                        esc(&mi.mountpoint.display().to_string()),
                        Action::new("POST", "/v1/unmount", format!("cistern unmount {}", mi.dataset))
                            .body(json!({"target": mi.dataset}))
                            .class("inline")
                            .confirm(format!("Unmount {}? Refused while files are open there.", mi.dataset))
                            .button("Unmount", "danger")
                    );
                }
                o.push_str("</table>");
                o.push_str(
                    &Action::new("POST", "/v1/mounts", "cistern mount ${dataset}")
                        .body(json!({"dataset": "${dataset}"}))
                        .form("<label>Mount filesystem <input name=\"dataset\" placeholder=\"tank/home\" required></label>\
                               <button type=\"submit\">Mount</button>"),
                );
            }
        }
        o.push_str("</section>");
        Ok(o)
    })
    .await
}

// ------------------------------------------------------------------ login

#[derive(Deserialize, Default)]
pub struct LoginQuery {
    next: Option<String>,
}

/// The login page: the admin pastes the API token; the script sends it to
/// `POST /v1/session`, which sets the session cookie (api::auth).
pub async fn login(Query(q): Query<LoginQuery>) -> Response {
    // Only a path on this site (no `//host` or scheme): no open redirect.
    let next = q
        .next
        .filter(|n| n.starts_with('/') && !n.starts_with("//") && !n.contains('\\'))
        .unwrap_or_else(|| "/".into());
    let form = Action::new("POST", "/v1/session", "")
        .body(json!({"token": "${token}"}))
        .then(&format!("goto:{next}"))
        .class("login-form")
        .form(
            "<label>API token <textarea name=\"token\" rows=\"3\" cols=\"44\" required autocomplete=\"off\" \
             spellcheck=\"false\" autofocus></textarea></label><button type=\"submit\">Log in</button>",
        );
    html_response(StatusCode::OK, html::login_page(&form))
}

// ------------------------------------------------------------------ bench

fn bench_dir(e: &Engine) -> std::path::PathBuf {
    e.state_dir().join("bench")
}

/// `/bench?target=IOPS&confidence=C`: the provisioning question asked of the saved runs.
#[derive(Debug, Deserialize)]
pub struct BenchQuery {
    pub target: Option<f64>,
    pub confidence: Option<f64>,
}

/// The provisioning table of `cistern bench provision` over every saved run
/// with per-second samples: nodes needed for `target` IOPS with `confidence`.
fn provision_html(runs: &[&std::path::PathBuf], target: f64, confidence: f64) -> String {
    use bench::provision::{estimate, Params};
    // Fewer trials than the CLI's default: the page must answer at once;
    // the exact column does not depend on them.
    let p = Params {
        target,
        confidence,
        seed: 1,
        trials: 2_000,
        buckets: 200,
    };
    let mut o = format!(
        "<section class=\"card\"><h2>Provisioning</h2>\
         <form method=\"get\" action=\"/bench\" class=\"inline\">\
         <label>target IOPS <input name=\"target\" type=\"number\" min=\"1\" value=\"{target:.0}\"></label> \
         <label>confidence <input name=\"confidence\" type=\"number\" step=\"0.001\" min=\"0.5\" max=\"0.9999\" value=\"{confidence}\"></label> \
         <button>Recompute</button></form>\
         <p>Nodes like the measured one needed for {target:.0} IOPS in a second with {pct:.1}% confidence \
         (the same estimates as <code>cistern bench provision --target-iops {target:.0} --confidence {confidence}</code>).</p>\
         <table><tr><th>run</th><th>seconds</th><th>best case</th><th>Monte Carlo</th><th>exact</th>\
         <th>all-dip bound</th><th>ratio to best</th></tr>",
        pct = confidence * 100.0
    );
    let cell = |r: &Result<(u64, f64), String>| match r {
        Ok((n, _)) => n.to_string(),
        Err(_) => "n/a".into(),
    };
    for path in runs {
        let Ok(s) = bench::iops::load_samples(path) else {
            continue;
        };
        match estimate(&s.name, &s.per_second, &p) {
            Ok(e) => {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&e.name),
                    e.seconds,
                    e.best_case,
                    cell(&e.monte_carlo),
                    cell(&e.exact),
                    e.all_dip.map_or("none".into(), |n| n.to_string()),
                    e.ratio().map_or("n/a".into(), |r| format!("{r:.2}"))
                );
            }
            Err(err) => {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td colspan=\"6\">{}</td></tr>",
                    esc(&s.name),
                    esc(&err.to_string())
                );
            }
        }
    }
    o.push_str("</table></section>");
    o
}

pub async fn bench(State(st): State<ApiState>, Query(q): Query<BenchQuery>) -> Response {
    let target = q
        .target
        .filter(|t| t.is_finite() && *t > 0.0)
        .unwrap_or(100_000.0);
    let confidence = q
        .confidence
        .filter(|c| *c > 0.0 && *c < 1.0)
        .unwrap_or(0.99);
    render(&st, "Bench results", "/bench".into(), move |_, e| {
        let dir = bench_dir(e);
        let mut o = format!(
            "<section class=\"card\"><p>Saved <code>cistern bench iops</code> runs in <code>{}</code> \
             (run <code>cistern bench iops --out {} TARGET</code> to add one).</p>",
            esc(&dir.display().to_string()),
            esc(&dir.display().to_string())
        );
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        let runs: Vec<&std::path::PathBuf> = files
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .take(100)
            .collect();
        if runs.is_empty() {
            o.push_str("<p>No saved runs yet.</p>");
        }
        o.push_str("</section>");
        if !runs.is_empty() {
            o.push_str(&provision_html(&runs, target, confidence));
        }
        for p in runs {
            let Ok(text) = std::fs::read_to_string(p) else { continue };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
            let f = |k: &str| v.get(k).map(|x| x.to_string().trim_matches('"').to_string()).unwrap_or_default();
            let g = |a: &str, b: &str| v.get(a).and_then(|x| x.get(b)).and_then(|x| x.as_f64()).unwrap_or(0.0);
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let svg = format!("{stem}.svg");
            let _ = write!(
                o,
                "<section class=\"card\"><h2>{name} <small>{started}</small></h2>\
                 <p class=\"kv\"><span>target {target}</span><span>{rw} x{workers}, {bs} blocks</span>\
                 <span>IOPS mean {mean:.0}, p1 {p1:.0}, p99 {p99:.0}</span><span>latency p99 {lat:.2} ms</span>\
                 <span>{mbps:.1} MB/s</span></p>",
                name = esc(&f("name")),
                started = esc(&f("started_at")),
                target = esc(&f("target")),
                rw = esc(&f("rw")),
                workers = esc(&f("workers")),
                bs = size(v.get("block_size").and_then(|x| x.as_u64()).unwrap_or(0)),
                mean = g("iops", "mean"),
                p1 = g("iops", "p1"),
                p99 = g("iops", "p99"),
                lat = g("latency", "p99_ns") / 1e6,
                mbps = v.get("mb_per_s").and_then(|x| x.as_f64()).unwrap_or(0.0),
            );
            if dir.join(&svg).is_file() {
                let _ = write!(o, "<img class=\"bench\" alt=\"X or better chart\" src=\"/bench/chart/{}\">", url(&svg));
            }
            o.push_str("</section>");
        }
        Ok(o)
    })
    .await
}

pub async fn bench_file(State(st): State<ApiState>, Path(file): Path<String>) -> Response {
    // One file name from the bench directory, an SVG only (served as an
    // image: scripts in it do not run).
    if file.contains('/') || file.starts_with('.') || !file.ends_with(".svg") {
        return StatusCode::NOT_FOUND.into_response();
    }
    let path = bench_dir(&st.engine).join(&file);
    match tokio::fs::read(&path).await {
        Ok(b) => (
            [
                (header::CONTENT_TYPE, "image/svg+xml"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'unsafe-inline'",
                ),
            ],
            b,
        )
            .into_response(),
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}
