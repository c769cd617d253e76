// mlirtuna dashboard: every page draws what /api/ answers (docs/dashboard.md). No build step.
"use strict";

const $ = (sel) => document.querySelector(sel);
// Every value put into innerHTML or plotly text goes through esc(): data, never markup.
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => (
  { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (v, digits = 3) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const PLOT_CONFIG = { displaylogo: false, responsive: true };
// Room above the plotting area for Plotly's toolbar (it shows on hover at the top right): with
// less, it covers the top of the tallest bar.
const PLOT_TOP = 36;
// TFlops ticks as plain numbers (0.0001, 0.01, 1): plotly's default SI prefixes read "100µ".
const NUMBER_TICKS = { tickformat: "~g", exponentformat: "none" };
// Below this R² the forest explains too little for its importance to be read as a ranking.
const IMPORTANCE_R2_TRUSTED = 0.5;

async function api(path) {
  const res = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

// A stored UTC time (ISO) as the reader's local "YYYY-MM-DD HH:MM"; the ISO in its title.
function localTime(iso) {
  const d = new Date(iso);
  if (!iso || Number.isNaN(d.getTime())) return String(iso ?? "");
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

function timeHtml(iso) {
  return iso ? `<time datetime="${esc(iso)}" title="${esc(iso)}">${esc(localTime(iso))}</time>` : "–";
}

// The times a template wrote (job attempts, session context, notes): made local in place.
function localTimes() {
  for (const el of document.querySelectorAll("time.local")) {
    el.textContent = localTime(el.getAttribute("datetime"));
    el.title = el.getAttribute("datetime");
  }
}

// A test vector that wraps only between its flags: each flag with its value one unbreakable
// piece (a browser otherwise breaks "-k" after its hyphen). Escaped, as esc().
function vectorHtml(text) {
  const words = String(text ?? "").split(" ");
  const pieces = [];
  for (let i = 0; i < words.length; i++) {
    const pair = words[i].startsWith("-") && i + 1 < words.length && !words[i + 1].startsWith("-");
    pieces.push(pair ? `${words[i]} ${words[++i]}` : words[i]);
  }
  return pieces.map((p) => `<span class="nw">${esc(p)}</span>`).join(" ");
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}

// columns: [{key, label, html(row) -> string, sort}]
function table(el, columns, rows, sort) {
  const head = columns.map((c) => {
    const mark = sort && c.sort && sort.key === c.sort ? (sort.desc ? " ▼" : " ▲") : "";
    return `<th${c.sort ? ` data-sort="${c.sort}"` : ""}>${esc(c.label)}${mark}</th>`;
  }).join("");
  const body = rows.map((r) => `<tr>${columns.map((c) =>
    `<td class="${c.cls || ""}">${c.html ? c.html(r) : esc(r[c.key])}</td>`).join("")}</tr>`).join("");
  el.innerHTML = `<thead><tr>${head}</tr></thead><tbody>${body}</tbody>`;
}

function showError(err) {
  let box = $("#load-error");
  if (!box) {
    box = document.createElement("p");
    box.id = "load-error";
    box.className = "error";
    $("main").prepend(box);
  }
  box.textContent = String(err.message || err);
}

function histogram(el, h, xTitle) {
  const mids = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
  const widths = h.counts.map((_, i) => h.edges[i + 1] - h.edges[i]);
  Plotly.newPlot(el, [{ type: "bar", x: mids, y: h.counts, width: widths, marker: { color: "#3b6ea5" } }],
    { margin: { t: PLOT_TOP, r: 10 }, xaxis: { title: { text: xTitle } },
      yaxis: { title: { text: "count" }, dtick: Math.max(1, Math.ceil(Math.max(0, ...h.counts) / 5)) },
      height: 280 }, PLOT_CONFIG);
}

// ------------------------------------------------------------------ farm

function progressBar(p) {
  // A session of import-tsv (or one not loaded yet) has no jobs: say so, not "0/0".
  if (!p.total) {
    const why = p.session.tuner === "imported" ? "imported: no jobs" : "no jobs loaded";
    return `<span class="muted no-jobs">${esc(why)}</span>`;
  }
  const pct = p.total ? (100 * p.done) / p.total : 0;
  const err = p.total ? (100 * p.counts.error) / p.total : 0;
  return `<div class="bar" title="${esc(p.done)}/${esc(p.total)}"><div class="ok" style="width:${esc(pct - err)}%"></div>` +
    `<div class="bad" style="width:${esc(err)}%"></div></div><span class="muted">${esc(p.done)}/${esc(p.total)}</span>`;
}

function context(s) {
  return `${esc(s.arch_full)} · ${esc(s.num_cu)} CU · ${esc(s.num_chiplets)} chiplet(s)<br>` +
    `<span class="muted">ROCm ${esc(s.rocm_v || "–")} · rocMLIR ${esc(s.mlir_v || "–")} · ${esc(s.tuning_space)} · ${esc(s.tuner)}</span>`;
}

// A session tuned on mlirtuna's stand-in build: its numbers are made up, and say so everywhere.
function standinBadge(s) {
  return s.standin ? `<span class="badge standin" title="tuned on mlirtuna's stand-in build: made-up numbers, never exported by arch">stand-in</span> ` : "";
}

// What a session tunes and when it was opened: tells the farm's rows apart (every value escaped).
function sessionWhat(p) {
  const s = p.session;
  const name = s.name ? `<b>${esc(s.name)}</b><br>` : "";
  const ops = (p.ops || []).map(esc).join(", ") || "–";
  const split = s.split ? ` · <span class="warn-text">split ${esc(s.split)}</span>` : "";
  return `${name}${standinBadge(s)}<span class="ops">${ops}</span> · ${timeHtml(s.created_at)}${split}`;
}

const SESSION_COLUMNS = [
  { label: "session", html: (p) => `<a href="/sessions/${esc(p.session.id)}">${esc(p.session.id)}</a>` },
  { label: "name · op · opened", html: sessionWhat, cls: "what" },
  { label: "context", html: (p) => context(p.session) },
  { label: "reason", html: (p) => `${esc(p.session.reason)}${p.session.ticket ? ` <span class="muted">${esc(p.session.ticket)}</span>` : ""}`, cls: "reason" },
  { label: "new", html: (p) => esc(p.counts.new), cls: "n" },
  { label: "waiting", html: (p) => esc(p.counts.waiting), cls: "n" },
  { label: "running", html: (p) => esc(p.counts.running), cls: "n" },
  { label: "completed", html: (p) => esc(p.counts.completed), cls: "n" },
  { label: "error", html: (p) => esc(p.counts.error), cls: "n" },
  { label: "cancelled", html: (p) => esc(p.counts.cancelled), cls: "n" },
  { label: "progress", html: progressBar, cls: "progress" },
  { label: "jobs/min", html: (p) => (p.active ? num(p.per_minute, 1) : ""), cls: "n" },
  { label: "ETA", html: (p) => (p.active ? duration(p.eta_s) : ""), cls: "n" },
];

const WORKER_COLUMNS = [
  { label: "machine", key: "machine_name" },
  { label: "GPU", html: (w) => esc(w.gpu_id >= 0 ? w.gpu_id : `cpu (pid ${w.pid})`) },
  { label: "GPU id", html: (w) => esc(w.gpu || "") },
  { label: "perf level", html: (w) => esc(w.gpu_perf || "") },
  { label: "session", html: (w) => `<a href="/sessions/${esc(w.session_id)}">${esc(w.session_id)}</a>` },
  { label: "problem", html: (w) => `<a href="/problems/${esc(w.problem_id)}?session=${esc(w.session_id)}">${esc(w.test_vector)}</a>`, cls: "vector" },
  { label: "running", html: (w) => duration(w.running_s), cls: "n" },
  { label: "heartbeat", html: (w) => `${num(w.heartbeat_age_s, 1)} s ago`, cls: "n" },
  { label: "status", html: (w) => (w.expired ? '<span class="bad-text">lease expired</span>'
    : w.stale ? '<span class="warn-text">stale heartbeat</span>' : "ok") },
];

function farmPage() {
  let offset = 0;
  const limit = 50;
  async function refresh() {
    try {
      const q = $("#farm-search").value.trim();
      const farm = await api(`/api/farm?offset=${offset}&limit=${limit}` + (q ? `&q=${encodeURIComponent(q)}` : ""));
      $("#sessions").dataset.total = farm.total_sessions;
      $("#clock").innerHTML = timeHtml(farm.now);
      table($("#sessions"), SESSION_COLUMNS, farm.sessions);
      table($("#workers"), WORKER_COLUMNS, farm.workers);
      $("#no-workers").hidden = farm.workers.length > 0;
      const last = Math.min(offset + limit, farm.total_sessions);
      $("#range").textContent = `sessions ${farm.total_sessions ? offset + 1 : 0}–${last} of ${farm.total_sessions}`;
      $("#prev").disabled = offset === 0;
      $("#next").disabled = last >= farm.total_sessions;
      document.body.dataset.updated = String(Number(document.body.dataset.updated || 0) + 1);
      $("#load-error")?.remove(); // the database is back
    } catch (err) {
      showError(err);
    }
  }
  $("#prev").onclick = () => { offset = Math.max(0, offset - limit); refresh(); };
  $("#next").onclick = () => { offset += limit; refresh(); };
  let typing = null;
  $("#farm-filter").addEventListener("submit", (ev) => ev.preventDefault());
  $("#farm-search").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { offset = 0; refresh(); }, 250);
  });
  refresh();
  setInterval(refresh, Number(document.body.dataset.pollMs) || 2000);
}

// A table sorted, filtered and paged on the server: header clicks sort (TFlops best first),
// the form filters (debounced), prev/next page; `state` is {sort: {key, desc}, offset, limit}.
function wirePaging(state, load, { table, form, prev, next }) {
  table.addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    const key = th.dataset.sort;
    state.sort = { key, desc: state.sort.key === key ? !state.sort.desc : key === "tflops" };
    state.offset = 0;
    load();
  });
  let typing = null;
  form.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.offset = 0; load(); }, 250);
  });
  form.addEventListener("submit", (ev) => ev.preventDefault());
  prev.onclick = () => { state.offset = Math.max(0, state.offset - state.limit); load(); };
  next.onclick = () => { state.offset += state.limit; load(); };
}

// ------------------------------------------------------------------ session

const WINNER_COLUMNS = [
  { label: "problem", sort: "test_vector", html: (r) => `<a href="/problems/${esc(r.problem_id)}?session=${esc(SESSION)}">${vectorHtml(r.test_vector)}</a>`, cls: "vector" },
  { label: "op", key: "op", sort: "op" },
  { label: "type", key: "data_type", sort: "data_type" },
  { label: "perf config", key: "perf_config", sort: "perf_config", cls: "config" },
  { label: "TFlops", html: (r) => sig(r.tflops), sort: "tflops", cls: "n" },
  { label: "time (µs)", html: (r) => num(r.kernel_time === null ? null : r.kernel_time / 1000, 2), sort: "kernel_time", cls: "n" },
  { label: "candidates", key: "candidates", sort: "candidates", cls: "n" },
  { label: "job", html: (r) => (r.job_id ? `<a href="/jobs/${esc(r.job_id)}">${esc(r.job_id)}</a>` : "") },
  { label: "margin", html: margin, cls: "n" },
];

// How far the winner is ahead of the runner-up; "(noise)" when within measurement noise.
function margin(r) {
  if (r.winner_margin === null || r.winner_margin === undefined) return "–";
  const text = `${r.winner_margin >= 0 ? "+" : ""}${(100 * r.winner_margin).toFixed(1)}%`;
  const noisy = r.winner_noise !== null && r.winner_noise !== undefined && r.winner_margin <= r.winner_noise;
  return noisy ? `${text} (noise)` : text;
}
let SESSION = null;

function sessionPage() {
  SESSION = document.body.dataset.session;
  const state = { sort: { key: "test_vector", desc: false }, offset: 0, limit: 50 };
  const form = $("#filters");
  async function loadWinners() {
    const params = new URLSearchParams(new FormData(form));
    for (const [k, v] of [...params]) if (!v) params.delete(k);
    params.set("sort", state.sort.key);
    params.set("desc", state.sort.desc);
    params.set("offset", state.offset);
    params.set("limit", state.limit);
    try {
      const page = await api(`/api/sessions/${SESSION}/winners?${params}`);
      table($("#winners"), WINNER_COLUMNS, page.rows, state.sort);
      const last = Math.min(state.offset + state.limit, page.total);
      $("#range").textContent = `winners ${page.total ? state.offset + 1 : 0}–${last} of ${page.total}`;
      $("#prev").disabled = state.offset === 0;
      $("#next").disabled = last >= page.total;
      $("#winners").dataset.total = page.total;
    } catch (err) {
      showError(err);
    }
  }
  wirePaging(state, loadWinners, { table: $("#winners"), form, prev: $("#prev"), next: $("#next") });

  api(`/api/sessions/${SESSION}/facets`).then((f) => {
    for (const [name, values] of [["op", f.ops], ["data_type", f.data_types], ["tag", f.tags]]) {
      const sel = form.elements[name];
      for (const v of values) sel.add(new Option(v, v));
    }
  }).catch(showError);
  api(`/api/sessions/${SESSION}`).then((p) => {
    const stages = Object.entries(p.stages || {}).map(([k, v]) => `${esc(k)} ${esc(v.done)}/${esc(v.total)}`);
    $("#progress").innerHTML = progressBar(p) +
      (p.active ? ` <span class="muted">${num(p.per_minute, 1)} jobs/min · ETA ${duration(p.eta_s)}</span>` : "") +
      (stages.length ? ` <span class="muted" id="stages">${stages.join(" · ")}</span>` : "");
  }).catch(showError);
  api(`/api/sessions/${SESSION}/tflops`).then((h) => histogram($("#tflops-plot"), h, "TFlops")).catch(showError);
  api(`/api/sessions/${SESSION}/job-times`).then((h) => {
    histogram($("#times-plot"), h, "seconds per job");
    $("#times-summary").textContent = h.count
      ? `${h.count} jobs · median ${num(h.median, 2)} s · mean ${num(h.mean, 2)} s · total ${duration(h.total)}` : "";
  }).catch(showError);
  api(`/api/sessions/${SESSION}/errors`).then((groups) => {
    table($("#errors"), [
      { label: "jobs", key: "count", cls: "n" },
      { label: "first line of the error", key: "first_line", cls: "vector" },
      { label: "job", html: (g) => g.job_ids.map((id) => `<a href="/jobs/${esc(id)}">${esc(id)}</a>`).join(" ") },
    ], groups);
    $("#no-errors").hidden = groups.length > 0;
  }).catch(showError);
  loadWinners();
  parallelPlot(SESSION);
  edfPlot(SESSION);
}

// The empirical distribution of TFlops / the problem's best over the session's valid
// candidates (optuna-dashboard's EDF): how close the search came to the winners.
function edfPlot(sid) {
  api(`/api/sessions/${sid}/edf`).then((e) => {
    const el = $("#edf-plot");
    el.dataset.count = e.sampled;
    $("#edf-count").textContent = e.total === e.sampled
      ? `${e.total} valid candidates` : `${e.sampled} of ${e.total} valid candidates (every k-th by id)`;
    Plotly.newPlot(el, [{ type: "scatter", mode: "lines", line: { shape: "hv" }, x: e.ratio, y: e.share,
      hovertemplate: "%{y:.0%} of candidates reach ≤ %{x:.2f} of the best<extra></extra>" }],
    { margin: { t: PLOT_TOP }, height: 300, xaxis: { title: { text: "TFlops / best of the problem" }, range: [0, 1.02] },
      yaxis: { title: { text: "share of candidates" }, range: [0, 1], tickformat: ".0%" } }, PLOT_CONFIG);
  }).catch(showError);
}

// A tuning's candidates in the order tried, with the best so far (optuna-dashboard's history).
async function historyPlot(problemId, sid) {
  const h = await api(`/api/problems/${encodeURIComponent(problemId)}/history?session=${encodeURIComponent(sid)}`);
  const el = $("#tried-plot");
  // At most HISTORY_POINTS of the candidates (every k-th and each that raised the best so far):
  // `index` is each drawn one's place in the order tried.
  const ok = h.index.map((_, j) => j).filter((j) => h.tflops[j] !== null);
  el.dataset.count = h.total;
  const drawn = h.index.length < h.total ? `${h.index.length} of ${h.total} drawn: every k-th and each new best; ` : "";
  Plotly.newPlot(el, [
    { type: "scatter", mode: "markers", name: "candidate", x: ok.map((j) => h.index[j]), y: ok.map((j) => h.tflops[j]),
      text: ok.map((j) => esc(h.perf_configs[j])), hovertemplate: "#%{x} %{text}<br>%{y:.3g} TFlops<extra></extra>" },
    { type: "scatter", mode: "lines", name: "best so far", x: h.index, y: h.best_so_far, line: { shape: "hv", color: "#c0392b" } },
  ], { margin: { t: PLOT_TOP }, height: 300, legend: { orientation: "h" },
    xaxis: { title: { text: `candidate, in the order tried (${drawn}${notDrawn(h)})` } },
    yaxis: { title: { text: "TFlops" } } }, PLOT_CONFIG);
}

// The drawn candidates without TFlops, as the candidate table names them: E4's "Discarded" ones
// were measured and dropped by the driver, not failed.
function notDrawn(h) {
  const none = h.index.map((_, j) => j).filter((j) => h.tflops[j] === null);
  const dropped = none.filter((j) => h.dropped[j]).length;
  const parts = [`${none.length - dropped} failed`];
  if (dropped) parts.push(`${dropped} dropped (discarded by the driver)`);
  return `${parts.join(", ")}, not drawn`;
}

// Fields with one value in every candidate: not drawn (an axis of one value gets an invented
// range), but counted, so nobody wonders where they went.
function constantNote(constant) {
  if (!constant.length) return "";
  const n = constant.length;
  return `${n} field${n === 1 ? "" : "s"} constant in all candidates, not drawn: ${constant.join(", ")}.`;
}

// A session's candidates of one op and data type: one axis per perf-config field, each line
// coloured by its TFlops over the best of its problem (1: the problem's fastest).
function parallelPlot(session) {
  const form = $("#parallel-choice");
  async function draw() {
    const params = new URLSearchParams(new FormData(form));
    if (!params.get("op")) return;
    try {
      const p = await api(`/api/sessions/${encodeURIComponent(session)}/parallel?${params}`);
      const dims = Object.entries(p.axes).map(([label, values]) => ({ label, values }));
      dims.push({ label: "TFlops / best", values: p.score, range: [0, 1] });
      Plotly.newPlot($("#parallel-plot"), [{
        type: "parcoords", dimensions: dims,
        line: { color: p.score, cmin: 0, cmax: 1, colorscale: "Viridis", showscale: true },
      }], { margin: { t: 40, l: 60, r: 60 }, height: 380 }, PLOT_CONFIG);
      $("#parallel-count").textContent = (p.score.length < p.total
        ? `${p.score.length} of ${p.total} candidates (the first by id)` : `${p.total} candidates`) +
        (p.constant.length ? `; ${constantNote(p.constant)}` : "");
      $("#parallel-plot").dataset.count = p.score.length;
    } catch (err) {
      showError(err);
    }
    importancePlot(session, params);
  }
  api(`/api/sessions/${encodeURIComponent(session)}/facets`).then((f) => {
    for (const v of f.ops) form.elements.op.add(new Option(v, v));
    for (const v of f.data_types) form.elements.data_type.add(new Option(v, v));
    draw();
  }).catch(showError);
  form.addEventListener("change", draw);
  form.addEventListener("submit", (ev) => ev.preventDefault());
}

// The same candidates' perf-config fields ranked by how much they explain TFlops over the best
// (a random forest's impurity importance, computed on the server): one bar per field.
async function importancePlot(session, params) {
  try {
    const imp = await api(`/api/sessions/${encodeURIComponent(session)}/importance?${params}`);
    const fields = [...imp.fields].reverse(), shares = [...imp.importance].reverse();
    Plotly.newPlot($("#importance-plot"), [{
      type: "bar", orientation: "h", x: shares, y: fields.map(esc),
      text: shares.map((v) => `${sig(100 * v, 2)} %`), textposition: "auto",
      hovertemplate: "%{y}: %{x:.3f}<extra></extra>", marker: { color: "#3b6ea5" },
    }], { margin: { t: 40, l: 140, r: 20 }, height: Math.max(200, 40 + 24 * fields.length),
      xaxis: { title: { text: "importance (share)" }, rangemode: "tozero" } }, PLOT_CONFIG);
    const flat = imp.importance.every((v) => v === 0);
    $("#importance-constant").textContent = constantNote(imp.constant);
    $("#importance-method").textContent = `${imp.rows} candidates fitted` +
      (imp.r2 === null ? "" : ` (R² ${sig(imp.r2, 2)})`) + `: ${imp.method}.` +
      (flat ? " No field explains anything here: TFlops over the best do not vary, or no field does." : "") +
      (imp.r2 !== null && imp.r2 < IMPORTANCE_R2_TRUSTED && !flat
        ? ` Caution: the fit explains little (R² ${sig(imp.r2, 2)} < ${IMPORTANCE_R2_TRUSTED}); these shares are not a reliable ranking.` : "");
    $("#importance-method").classList.toggle("warn-text", imp.r2 !== null && imp.r2 < IMPORTANCE_R2_TRUSTED && !flat);
    $("#importance-plot").dataset.count = imp.rows;
    $("#importance-plot").dataset.fields = imp.fields.join(",");
  } catch (err) {
    showError(err);
  }
}

// ------------------------------------------------------------------ problem

function problemPage() {
  const id = document.body.dataset.problem;
  api(`/api/problems/${id}/trend`).then((points) => {
    const byContext = new Map();
    for (const p of points) {
      if (!byContext.has(p.context)) byContext.set(p.context, []);
      byContext.get(p.context).push(p);
    }
    const traces = [...byContext].map(([ctx, ps]) => ({
      type: "scatter", mode: "lines+markers+text", name: esc(ctx),
      x: ps.map((p) => p.created_at), y: ps.map((p) => p.tflops),
      // Each point labelled with its session: which run a dot is, without hovering.
      text: ps.map((p) => `s${esc(p.session_id)}`), textposition: "top center",
      customdata: ps.map((p) => `session ${esc(p.session_id)}<br>rocMLIR ${esc(p.mlir_v || "?")}<br>${esc(p.perf_config)}`),
      hovertemplate: "%{y:.3g} TFlops<br>%{customdata}<extra></extra>",
    }));
    Plotly.newPlot($("#trend-plot"), traces, { margin: { t: PLOT_TOP }, height: 320, showlegend: true,
      legend: { orientation: "h" }, ...trendAxes(points) }, PLOT_CONFIG);
    table($("#history"), [
      { label: "session", html: (p) => `<a href="/sessions/${esc(p.session_id)}">${esc(p.session_id)}</a>` },
      { label: "opened", html: (p) => timeHtml(p.created_at), cls: "n" },
      { label: "context", key: "context" },
      { label: "ROCm", key: "rocm_v" },
      { label: "rocMLIR", key: "mlir_v" },
      { label: "perf config", key: "perf_config", cls: "vector" },
      { label: "TFlops", html: (p) => sig(p.tflops), cls: "n" },
    ], [...points].reverse());
  }).catch(showError);

  const choice = $("#session-choice");
  api(`/api/problems/${id}`).then((info) => {
    for (const sid of info.session_ids) choice.add(new Option(`${sid}`, sid));
    if (document.body.dataset.chosen) choice.value = document.body.dataset.chosen;
    if (choice.value) loadCandidates(choice.value);
  }).catch(showError);
  choice.onchange = () => loadCandidates(choice.value);
  const loadTable = candidateTable(id);

  async function loadCandidates(sid) {
    try {
      loadTable(sid);
      historyPlot(id, sid).catch(showError);
      const c = await api(`/api/problems/${id}/candidates?session=${sid}`);
      const isWinner = c.valid.map((v) => v.perf_config === c.winner && (v.remeasured || !c.valid.some((x) => x.remeasured)));
      Plotly.newPlot($("#candidates-plot"), [{
        type: "scatter", mode: "markers", name: "valid",
        x: c.valid.map((v) => v.perf_config), y: c.valid.map((v) => v.tflops),
        marker: { size: isWinner.map((w) => (w ? 12 : 7)), color: isWinner.map((w) => (w ? "#c0392b" : "#3b6ea5")),
          symbol: c.valid.map((v) => (v.remeasured ? "diamond" : "circle")) },
        customdata: c.valid.map((v) => `${esc(v.perf_config)}<br>${v.remeasured ? "re-measured" : "first pass"}<br>` +
          Object.entries(v.fields || {}).map(([k, x]) => `${esc(k)}=${esc(x)}`).join(" ")),
        hovertemplate: "%{customdata}<br>%{y:.3g} TFlops<extra></extra>",
      }], { margin: { t: PLOT_TOP, b: 40 }, height: 340, xaxis: { showticklabels: false, title: { text: `${c.valid.length < c.totals.valid ? `the best ${c.valid.length} of ${c.totals.valid}` : c.valid.length} valid perf configs, best first; ◆ re-measured (${c.valid.filter((v) => v.remeasured).length}), red: winner` } },
        yaxis: { title: { text: "TFlops" } } }, PLOT_CONFIG);
      table($("#invalid"), [
        { label: "perf config", key: "perf_config", cls: "vector" },
        { label: "why", key: "error", cls: "vector" },
      ], c.invalid);
      $("#no-invalid").hidden = c.invalid.length > 0;
      table($("#dropped"), [
        { label: "perf config", key: "perf_config", cls: "vector" },
        { label: "why", key: "error", cls: "vector" },
      ], c.dropped);
      $("#dropped-section").hidden = c.dropped.length === 0;
    } catch (err) {
      showError(err);
    }
  }
}

// The trend's axes: TFlops on a log axis (a CPU's 0.003 and a GPU's 4.2 on one plot), and a
// day either side of a single date rather than milliseconds.
function trendAxes(points) {
  const dates = [...new Set(points.map((p) => p.created_at))];
  const xaxis = { type: "date" };
  if (dates.length === 1) {
    const t = Date.parse(dates[0]), day = 86400000;
    xaxis.range = [new Date(t - day).toISOString(), new Date(t + day).toISOString()];
  }
  return { xaxis, yaxis: { type: "log", title: { text: "TFlops (log)" }, ...NUMBER_TICKS } };
}

// ------------------------------------------------------------------ the candidate table
// Built with textContent only: no value reaches innerHTML.

// A number with `digits` significant digits ("–" for none): 0.00312, 4.21, 1234.
function sig(v, digits = 3) {
  if (v === null || v === undefined || !Number.isFinite(Number(v))) return "–";
  const x = Number(v);
  if (x === 0) return "0";
  return Math.abs(x) >= 10 ** digits ? String(Math.round(x)) : String(Number(x.toPrecision(digits)));
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.textContent = text;
  row.append(td);
  return td;
}

function candidateRows(el, page, state, decided = false) {
  const us = (ns) => (ns === null || ns === undefined ? null : ns / 1000);
  const numbers = [
    ["TFlops", "tflops", (r) => sig(r.tflops), "n"],
    ["median µs", "kernel_time", (r) => sig(us(r.kernel_time)), "n"],
    ["min µs", "time_min", (r) => sig(us(r.time_min)), "n"],
    ["spread (IQR) µs", "time_iqr", (r) => sig(us(r.time_iqr)), "n"],
    ["samples", "samples", (r) => (r.samples ?? "–"), "n"],
    ["round", "search_round", (r) => (r.search_round ?? "–"), "n"],
  ];
  const cols = decided ? [
    ["perf config", null, (r) => r.perf_config, "config"],
    ...numbers.map(([label, , get, cls]) => [label, null, get, cls]),
    ["winner", null, (r) => (r.winner ? "winner" : ""), "mark"],
  ] : [
    // The measured numbers and marks next to the config (the config column stays in view),
    // then the config's fields (14-19 of them on real rocMLIR), then why it failed.
    ["perf config", "perf_config", (r) => r.perf_config, "config"],
    ...numbers,
    ["re-measured", "remeasured", (r) => (r.remeasured ? "re-measured" : r.dropped ? "dropped" : ""), "mark"],
    ["winner", null, (r) => (r.winner ? "winner" : ""), "mark"],
    ...page.columns.map((f) => [f, null, (r) => (f in r.fields ? String(r.fields[f]) : ""), "n"]),
    ["error", null, (r) => r.error || "", "why"],
  ];
  const thead = document.createElement("thead"), head = document.createElement("tr");
  for (const [label, key] of cols) {
    const th = document.createElement("th");
    th.textContent = label + (key && state.sort.key === key ? (state.sort.desc ? " ▼" : " ▲") : "");
    if (key) th.dataset.sort = key;
    head.append(th);
  }
  thead.append(head);
  const tbody = document.createElement("tbody");
  for (const r of decided ? page.decided_on : page.rows) {
    const tr = document.createElement("tr");
    if (r.winner) tr.classList.add("winner");
    if (r.remeasured) tr.classList.add("remeasured");
    for (const [, , text, cls] of cols) {
      const td = cell(tr, String(text(r)), cls);
      if (cls === "config" || cls === "why") td.title = td.textContent; // the full text on hover
    }
    tbody.append(tr);
  }
  el.replaceChildren(thead, tbody);
}

// "Why it won": the rule, then the numbers it decided on, side by side.
function winnerRule(page) {
  const line = $("#winner-rule");
  const code = document.createElement("code");
  code.textContent = page.winner ?? "none";
  const what = page.remeasured
    ? `The re-measured top ${page.decided_on.length}, fastest median first:`
    : `The search's fastest ${page.decided_on.length} by median:`;
  line.replaceChildren("Winner: ", code, `. Rule: ${page.rule}. ${what}`);
}

function candidateTable(problemId) {
  const state = { sid: null, sort: { key: "tflops", desc: true }, offset: 0, limit: 50 };
  const form = $("#cand-filters"), el = $("#candidates");
  async function load() {
    const params = new URLSearchParams(new FormData(form));
    for (const [k, v] of [...params]) if (!v) params.delete(k);
    params.set("sort", state.sort.key);
    params.set("desc", state.sort.desc);
    for (const k of ["offset", "limit"]) params.set(k, state[k]);
    params.set("session", state.sid);
    try {
      const page = await api(`/api/problems/${encodeURIComponent(problemId)}/table?${params}`);
      candidateRows(el, page, state);
      candidateRows($("#decided"), page, state, true);
      $("#candidates-csv").href = `/api/problems/${encodeURIComponent(problemId)}/candidates.csv?session=${encodeURIComponent(state.sid)}`;
      winnerRule(page);
      const last = Math.min(state.offset + state.limit, page.total);
      $("#cand-range").textContent = `candidates ${page.total ? state.offset + 1 : 0}–${last} of ${page.total}`;
      $("#cand-prev").disabled = state.offset === 0;
      $("#cand-next").disabled = last >= page.total;
      el.dataset.total = page.total;
    } catch (err) {
      showError(err);
    }
  }
  wirePaging(state, load, { table: el, form, prev: $("#cand-prev"), next: $("#cand-next") });
  return (sid) => { state.sid = sid; state.offset = 0; load(); };
}

// ------------------------------------------------------------------ compare
// The compare page's groups, as the CLI splits them; rows link to the problem pages.
function compareTable(el, rows, session, missing = false) {
  const cols = missing ? [
    ["problem", null], ["verdict", "verdict"], ["A perf config", "perf_config_a"], ["A TFlops", (r) => sig(r.tflops_a)],
  ] : [
    ["problem", null], ["verdict", "verdict"], ["A perf config", "perf_config_a"], ["B perf config", "perf_config_b"],
    ["A TFlops", (r) => sig(r.tflops_a)], ["B TFlops", (r) => sig(r.tflops_b)],
    ["B/A", (r) => sig(r.ratio)], ["noise", (r) => (r.noise === null ? "–" : `±${sig(100 * r.noise, 2)} %`)],
  ];
  const thead = document.createElement("thead"), head = document.createElement("tr");
  for (const [label] of cols) {
    const th = document.createElement("th");
    th.textContent = label;
    head.append(th);
  }
  thead.append(head);
  const tbody = document.createElement("tbody");
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.verdict = r.verdict;
    tr.dataset.vector = r.test_vector;
    const first = cell(tr, "", "vector");
    if (r.problem_id !== null) {
      const a = document.createElement("a");
      a.href = `/problems/${encodeURIComponent(r.problem_id)}?session=${encodeURIComponent(session)}`;
      a.textContent = r.label;
      first.append(a);
    } else {
      first.textContent = r.label;
    }
    for (const [, get] of cols.slice(1)) {
      const cls = typeof get === "function" ? "n" : get === "verdict" ? "verdict" : "vector";
      cell(tr, typeof get === "function" ? get(r) : String(r[get] ?? ""), cls);
    }
    tbody.append(tr);
  }
  el.replaceChildren(thead, tbody);
}

function compareGroups(c) {
  const a = document.body.dataset.a, b = document.body.dataset.b;
  const below = `below ${sig(100 * (1 - c.threshold))} %`;
  compareTable($("#regressions"), c.regressions_changed, b);
  compareTable($("#same-winner"), c.regressions_same, b);
  compareTable($("#within-noise"), c.within_noise, b);
  compareTable($("#missing"), c.missing, a, true);
  compareTable($("#improvements"), c.improvements, b);
  $("#count-changed").textContent = `${c.regressions_winner_changed} ${below}`;
  $("#count-same").textContent = `${c.regressions_same_winner} ${below}`;
  $("#count-noise").textContent = `${c.within_noise_total} ${below}, within the measurements' noise`;
  $("#count-missing").textContent = `${c.missing_total}`;
  $("#reg-count").textContent = `Regressions counted: ${c.regressions_total} (${c.regressions_winner_changed} regression, ` +
    `${c.regressions_same_winner} slower), ${below} and beyond noise; ${c.within_noise_total} noise not counted; ` +
    `${c.missing_total} missing from B.`;
  $("#gate").textContent = c.gate.fails
    ? `compare --fail-on-regression fails: ${c.gate.failing} findings (regression, slower, missing).`
    : "compare --fail-on-regression passes: no regression, slower or missing finding.";
  $("#gate").classList.toggle("warn-text", c.gate.fails);
  $("#imp-count").textContent = `${c.improvements_total} above ${sig(100 * (1 + c.threshold))} %`;
}


function comparePage() {
  const { a, b, threshold } = document.body.dataset;
  if (!a || !b) return;
  api(`/api/compare?a=${a}&b=${b}&threshold=${encodeURIComponent(threshold)}`).then((c) => {
    const rows = [
      ["A", c.a], ["B", c.b], ["common problems", c.common],
      ["same winner", c.same_winner_pct === null ? "–" : `${c.same_winner} (${num(c.same_winner_pct, 1)} %)`],
      ["geomean B/A", num(c.geomean_ratio)], ["min / max B/A", `${num(c.min_ratio)} / ${num(c.max_ratio)}`],
      ["only in A", c.only_a], ["only in B", c.only_b],
    ];
    $("#summary").innerHTML = rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join("");
    const all = c.points.tflops_a.concat(c.points.tflops_b);
    const lo = Math.min(...all), hi = Math.max(...all);
    Plotly.newPlot($("#compare-plot"), [
      { type: "scatter", mode: "markers", name: "problems", x: c.points.tflops_a, y: c.points.tflops_b,
        text: c.points.test_vector.map(esc), hovertemplate: "%{text}<br>A %{x:.3f} · B %{y:.3f}<extra></extra>" },
      { type: "scatter", mode: "lines", name: "B = A", x: [lo, hi], y: [lo, hi], line: { dash: "dot", color: "#888" }, hoverinfo: "skip" },
    ], { margin: { t: PLOT_TOP }, height: 480, xaxis: { type: "log", title: { text: "A TFlops" }, ...NUMBER_TICKS },
      yaxis: { type: "log", title: { text: "B TFlops" }, ...NUMBER_TICKS }, showlegend: false }, PLOT_CONFIG);
    compareGroups(c);
  }).catch(showError);
}

const PAGES = { farm: farmPage, session: sessionPage, problem: problemPage, compare: comparePage };
document.addEventListener("DOMContentLoaded", () => {
  localTimes();
  (PAGES[document.body.dataset.page] || (() => {}))();
});
