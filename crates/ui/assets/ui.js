// Cistern dashboard script: turns <form class="api"> into /v1 JSON requests
// (the ones the CLI makes), shows confirmations with dry-run previews, polls
// scans and draws the live charts. No libraries, no build step.
"use strict";

const units = ["B", "K", "M", "G", "T", "P", "E"];
function fmtSize(b) {
  let v = Number(b) || 0, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  if (i === 0) return `${Math.round(v)}B`;
  return `${v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)}${units[i]}`;
}

// "1G", "512M", "10" (bytes) -> bytes, as the CLI reads sizes (powers of 1024).
function parseSize(s) {
  s = String(s || "").trim();
  if (s === "") return 0;
  const m = s.match(/^(\d+(?:\.\d+)?)\s*([kmgtpe]?)(?:i?b)?$/i);
  if (!m) return null;
  const exp = "bkmgtpe".indexOf((m[2] || "b").toLowerCase());
  return Math.round(parseFloat(m[1]) * Math.pow(1024, exp));
}

// Header-safe text (the API's encode_header): bytes outside printable ASCII and % as %XX.
function encHeader(s) {
  let out = "";
  for (const b of new TextEncoder().encode(s)) {
    out += (b >= 0x20 && b < 0x7f && b !== 0x25) ? String.fromCharCode(b) : "%" + b.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function fields(form) {
  const v = {};
  for (const el of form.elements) {
    if (el.name) v[el.name] = el.type === "checkbox" ? el.checked : el.value.trim();
  }
  return v;
}

function fill(str, v, encode) {
  return String(str).replace(/\$\{(\w+)\}/g, (_, k) => {
    const x = v[k] === undefined ? "" : String(v[k]);
    return encode ? encodeURIComponent(x) : x;
  });
}

// A JSON template with "${field}" strings, or typed ones: "${size:f}",
// "${optsize:f}", "${props:f}", "${bool:f}", "${list:f}", "${grants:f}".
function build(tpl, v) {
  if (typeof tpl === "string") {
    const m = tpl.match(/^\$\{(size|optsize|props|bool|list|grants):(\w+)\}$/);
    if (!m) return fill(tpl, v, false);
    const x = v[m[2]];
    switch (m[1]) {
      case "size":
      case "optsize": {
        if (m[1] === "optsize" && !x) return null;
        const n = parseSize(x);
        if (n === null) throw new Error(`'${x}' is not a size (e.g. 1G, 512M)`);
        return n;
      }
      case "props":
        return String(x || "").split(/\n/).map(l => l.trim()).filter(Boolean).map(l => {
          const i = l.indexOf("=");
          if (i < 1) throw new Error(`'${l}' is not property=value`);
          return [l.slice(0, i).trim(), l.slice(i + 1).trim()];
        });
      case "bool": return !!x;
      case "list": return String(x || "").split(",").map(s => s.trim()).filter(Boolean);
      case "grants":
        return String(x || "").split(",").map(s => s.trim()).filter(Boolean).map(g => {
          const i = g.lastIndexOf("=");
          if (i < 1) throw new Error(`'${g}' is not bucket=ro or bucket=rw`);
          return { bucket: g.slice(0, i), access: g.slice(i + 1) };
        });
    }
  }
  if (Array.isArray(tpl)) return tpl.map(t => build(t, v));
  if (tpl && typeof tpl === "object") {
    const o = {};
    for (const [k, t] of Object.entries(tpl)) o[k] = build(t, v);
    return o;
  }
  return tpl;
}

async function api(method, path, body, cli) {
  const h = { "Accept": "application/json" };
  if (body !== undefined && body !== null) h["Content-Type"] = "application/json";
  if (cli) h["X-Cistern-Command"] = encHeader(`${cli} (web ui)`);
  h["X-Cistern-User"] = "web";
  const r = await fetch(path, {
    method, headers: h, credentials: "same-origin",
    body: body === undefined || body === null ? undefined : JSON.stringify(body),
  });
  if (r.status === 401 && path !== "/v1/session") {
    location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
    throw new Error("not logged in");
  }
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  if (!r.ok) throw new Error((data && data.error) || `${r.status} ${r.statusText}`);
  return data;
}

function toast(msg, error) {
  const t = document.getElementById("toast");
  if (!t) return;
  t.textContent = msg;
  t.className = "show" + (error ? " error" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, error ? 12000 : 5000);
}

// Dry-run previews: what the action would do, from the API.
const previews = {
  destroy(r) {
    const names = r.destroyed || [];
    return `<p>Frees <b>${fmtSize(r.freed)}</b>, destroys ${names.length === 1 ? "this" : `these <b>${names.length}</b>`}:</p>` +
      `<ul>${names.map(n => `<li>${esc(n)}</li>`).join("")}</ul>`;
  },
  rollback(r) {
    const n = r.destroys.length;
    let h = `<p>Discards <b>${fmtSize(r.discards_changed_bytes)}</b> changed since ${esc(r.snapshot)}.</p>`;
    if (n === 0) return h + "<p>No newer snapshot is destroyed.</p>";
    return h + `<p>Destroys these <b>${n}</b> newer snapshot${n === 1 ? "" : "s"}, freeing <b>${fmtSize(r.frees_snapshot_bytes)}</b> only they hold:</p>` +
      `<ul>${r.destroys.map(s => `<li>${esc(s)}</li>`).join("")}</ul>`;
  },
};

function confirmDialog(title, text, previewPromise) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const pv = document.getElementById("confirm-preview");
  pv.innerHTML = "";
  const ok = document.getElementById("confirm-ok");
  ok.disabled = false;
  if (previewPromise) {
    pv.innerHTML = '<p class="loading">Asking the daemon what this would do (dry run)...</p>';
    ok.disabled = true;
    previewPromise.then(html => { pv.innerHTML = html; ok.disabled = false; })
      .catch(e => { pv.innerHTML = `<p class="alert bad">${esc(e.message)}</p>`; });
  }
  return new Promise(resolve => {
    const done = v => { d.close(); ok.onclick = null; document.getElementById("confirm-cancel").onclick = null; resolve(v); };
    ok.onclick = () => done(true);
    document.getElementById("confirm-cancel").onclick = () => done(false);
    d.oncancel = () => done(false);
    d.showModal();
  });
}

async function submitApi(form) {
  const err = form.querySelector(".err");
  if (err) err.textContent = "";
  const v = fields(form);
  const ds = form.dataset;
  try {
    const path = fill(ds.path, v, true);
    const body = ds.body ? build(JSON.parse(ds.body), v) : undefined;
    const cli = ds.cli ? fill(ds.cli, v, false) : "";
    if (ds.confirm) {
      let preview = null;
      if (ds.preview) {
        const pbody = ds.previewBody && ds.previewBody !== "null" ? JSON.parse(ds.previewBody) : undefined;
        const method = ds.preview === "destroy" ? "DELETE" : "POST";
        preview = api(method, fill(ds.previewPath, v, true), pbody).then(previews[ds.preview]);
      }
      if (!(await confirmDialog(cli || "Confirm", fill(ds.confirm, v, false), preview))) return;
    }
    const res = await api(ds.method, path, body, cli);
    const then = ds.then || "reload";
    if (then === "secret") {
      const box = document.getElementById("secret");
      box.hidden = false;
      box.innerHTML = `<p><b>Copy the secret now: it is shown only once.</b></p>` +
        `<p>user <code>${esc(res.name)}</code><br>access key <code id="new-access-key">${esc(res.access_key)}</code><br>` +
        `secret key <code id="new-secret-key">${esc(res.secret_key)}</code></p>` +
        `<p><a href="${location.pathname}">Done: back to the list</a></p>`;
      form.reset();
      return;
    }
    toast(`done: ${cli}`);
    if (then.startsWith("goto:")) location.href = then.slice(5);
    else setTimeout(() => location.reload(), 300);
  } catch (e) {
    if (err) err.textContent = e.message;
    toast(e.message, true);
  }
}

document.addEventListener("submit", ev => {
  const f = ev.target;
  if (f.classList && f.classList.contains("api")) {
    ev.preventDefault();
    submitApi(f);
  }
});

// ---------------------------------------------------------------- scans
function pollScan(el) {
  const pool = el.dataset.pollScan;
  const text = el.querySelector(".scan-text");
  const was = text && text.dataset.state;
  const tick = async () => {
    try {
      const s = await api("GET", `/v1/pools/${encodeURIComponent(pool)}`);
      const sc = s.scan;
      if (!sc) return;
      if (sc.state !== was) { location.reload(); return; }
      if (sc.state === "scanning") {
        const pct = sc.total ? Math.min(100, sc.examined / sc.total * 100) : 100;
        el.querySelector(".progress span").style.width = pct.toFixed(1) + "%";
        text.textContent = `${sc.function} in progress: ${fmtSize(sc.examined)} of ${fmtSize(sc.total)} examined (${pct.toFixed(1)}%), ` +
          `${fmtSize(sc.repaired)} repaired, ${sc.errors} errors, ${fmtSize(sc.rate)}/s`;
      }
    } catch (e) { /* next tick */ }
  };
  setInterval(tick, 1000);
}
document.querySelectorAll("[data-poll-scan]").forEach(pollScan);

// ---------------------------------------------------------------- charts
const NS = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// series: [{name, color, points: [[t, v], ...]}]; fmt formats the y axis.
function drawChart(svg, series, fmt, now, floor) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = 600, H = 170, L = 62, R = 8, T = 10, B = 34;
  const t0 = now - 3600;
  const max = niceMax(Math.max(floor || 1, ...series.flatMap(s => s.points.map(p => p[1]))));
  const x = t => L + (W - L - R) * Math.max(0, t - t0) / 3600;
  const y = v => T + (H - T - B) * (1 - v / max);
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4;
    svg.appendChild(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e3e7ee" }));
    svg.appendChild(el("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  for (const [t, label] of [[t0, "-60 min"], [t0 + 1800, "-30 min"], [now, "now"]]) {
    svg.appendChild(el("text", { x: x(t), y: H - B + 14, "text-anchor": t === t0 ? "start" : t === now ? "end" : "middle" }, label));
  }
  let lx = L;
  for (const s of series) {
    if (s.points.length > 0) {
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
      svg.appendChild(el("path", { d, fill: "none", stroke: s.color, "stroke-width": 1.8 }));
    }
    const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
    svg.appendChild(el("rect", { x: lx, y: H - 13, width: 10, height: 10, fill: s.color }));
    const label = el("text", { x: lx + 14, y: H - 4 }, `${s.name} ${fmt(last)}`);
    svg.appendChild(label);
    lx += 150;
  }
  if (series.every(s => s.points.length === 0)) {
    svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "collecting samples (one every 5 s)..."));
  }
}

const rate = v => v >= 1024 ? fmtSize(v) + "/s" : `${Math.round(v)}B/s`;
const count = v => v >= 1000 ? (v / 1000).toFixed(1) + "k" : String(Math.round(v * 10) / 10);

async function refreshCharts() {
  const charts = document.querySelectorAll("svg.chart");
  if (charts.length === 0) return;
  let h;
  try { h = await api("GET", "/v1/samples"); } catch (e) { return; }
  const now = Math.floor(Date.now() / 1000);
  for (const svg of charts) {
    const kind = svg.dataset.chart;
    const pool = (h.pools || {})[svg.dataset.pool] || [];
    if (kind === "pool-bw") {
      drawChart(svg, [
        { name: "read", color: "#3d8fc6", points: pool.map(s => [s.t, s.read_bps]) },
        { name: "write", color: "#e0a030", points: pool.map(s => [s.t, s.write_bps]) },
      ], rate, now, 1024);
    } else if (kind === "nbd-iops") {
      drawChart(svg, [
        { name: "read IOPS", color: "#3d8fc6", points: h.nbd.map(s => [s.t, s.read_iops]) },
        { name: "write IOPS", color: "#e0a030", points: h.nbd.map(s => [s.t, s.write_iops]) },
      ], count, now, 10);
    } else if (kind === "device-io") {
      const dev = svg.dataset.device;
      const pick = (s, k) => { const d = s.devices.find(d => d.path === dev); return d ? (d[k] || 0) : 0; };
      drawChart(svg, [
        { name: "read ops/s", color: "#3d8fc6", points: pool.map(s => [s.t, pick(s, "read_iops")]) },
        { name: "write ops/s", color: "#e0a030", points: pool.map(s => [s.t, pick(s, "write_iops")]) },
      ], count, now, 10);
    } else if (kind === "device") {
      const dev = svg.dataset.device;
      const pick = (s, k) => { const d = s.devices.find(d => d.path === dev); return d ? d[k] : 0; };
      drawChart(svg, [
        { name: "READ", color: "#3d8fc6", points: pool.map(s => [s.t, pick(s, "read_errors")]) },
        { name: "WRITE", color: "#7a62c4", points: pool.map(s => [s.t, pick(s, "write_errors")]) },
        { name: "CKSUM", color: "#b3261e", points: pool.map(s => [s.t, pick(s, "checksum_errors")]) },
      ], count, now, 4);
    }
  }
}
refreshCharts();
setInterval(refreshCharts, 5000);
