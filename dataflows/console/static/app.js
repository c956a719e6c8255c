"use strict";
// trainguard console: fetches JSON from the API, re-renders on each server-sent "update".
let me = null;
let currentJob = null;

async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  return node;
}

// One clock everywhere: UTC, labelled. Event times (detections, decisions) and wall times (when the
// audit log recorded an entry) are both UTC; the column headers say which is which.
function when(ts) {
  return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "-";
}

let auditOffset = 0;
const AUDIT_PAGE = 50;

function renderOverview(o) {
  const cards = document.getElementById("cards");
  const kinds = Object.entries(o.anomalies_last_hour).map(([k, n]) => `${k} ${n}`).join(", ") || "none";
  cards.replaceChildren(
    el("div", { class: "card" }, el("b", {}, o.anomalies_total), "anomalies"),
    el("div", { class: "card" }, el("b", {}, kinds), "last hour, by kind"),
    o.scheduler && !o.scheduler.error
      ? el("div", { class: "card" }, el("b", {}, o.scheduler.jobs_running), "jobs running")
      : el("div", { class: "card" }, el("b", {}, o.jobs.length), "jobs seen"),
    o.scheduler && !o.scheduler.error
      ? el("div", { class: "card" }, el("b", {}, `${o.scheduler.nodes_unavailable}/${o.scheduler.nodes}`), "nodes unavailable")
      : "",
    el("div", { class: "card" }, el("b", {}, o.drained_by_trainguard.length), "nodes drained by trainguard"),
    el("div", { class: "card", id: "pending-count" }, el("b", {}, o.pending), "pending recommendations"),
  );
  const breaker = document.getElementById("breaker");
  breaker.textContent = o.breaker.open ? `breaker OPEN: ${o.breaker.reason}` : "breaker closed";
  breaker.className = o.breaker.open ? "badge open" : "badge";
}

function renderFeed(anomalies) {
  document.getElementById("feed").replaceChildren(
    ...anomalies.map((a) =>
      el(
        "li",
        { class: a.layer || "unknown", "data-anomaly": a.anomaly_id },
        el("strong", {}, `${a.kind}/${a.category}`),
        ` ${a.layer}${a.transient === false ? ", persistent" : a.transient ? ", transient" : ""} · `,
        a.job_id ? el("a", { class: "job", href: `#job/${encodeURIComponent(a.job_id)}` }, `job ${a.job_id}`) : "no job",
        ` · ${(a.nodes || []).join(", ") || "-"} · detected ${when(a.detected_at)} (event time)`,
        el(
          "span",
          { class: a.resolved_at ? "status resolved" : "status open" },
          a.resolved_at ? ` · resolved ${when(a.resolved_at)}: ${a.resolution}` : " · open",
        ),
        el("div", { class: "evidence" }, (a.evidence || []).slice(0, 3).join("\n")),
        renderStacks(a),
      ),
    ),
  );
}

// A hang's ranks grouped by their Python stacks (collect-stacks): each group, its ranks, a few frames.
function renderStacks(a) {
  const groups = a.stack_groups || [];
  if (!groups.length) return "";
  const total = groups.reduce((n, g) => n + (g.processes || 0), 0);
  return el(
    "div",
    { class: "stacks" },
    el("b", {}, `stacks: ${total} processes in ${groups.length} groups${a.localisation ? ` (named by ${a.localisation})` : ""}`),
    ...groups.map((g) =>
      el(
        "div",
        { class: g.outlier ? "stack-group outlier" : "stack-group" },
        `${g.outlier ? "outlier: " : ""}${(g.ranks || []).length ? `ranks ${g.ranks.join(", ")}` : `${g.processes} processes`}` +
          ` on ${(g.nodes || []).join(", ")}${g.state ? ` ${g.state}` : ""} in ${g.where}`,
        el("pre", {}, (g.frames || []).slice(0, 4).join("\n")),
      ),
    ),
  );
}

async function decide(actionId, verb, reason) {
  const done = await api(`/api/actions/${encodeURIComponent(actionId)}/${verb}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": me.csrf },
    body: JSON.stringify(verb === "reject" ? { reason } : {}),
  });
  return `${done.action} ${done.target}: ${done.status} — ${done.reason}`;
}

// What an action does, in words an on-call engineer confirms.
function describeAction(a) {
  const exclude = a.params && a.params.exclude ? ` (excluding ${a.params.exclude})` : "";
  return {
    drain_node: `drain node ${a.target}: no new job lands there`,
    resume_node: `return node ${a.target} to service`,
    requeue_job: `requeue job ${a.target}${exclude}`,
    hold_job: `hold job ${a.target}`,
    release_job: `release job ${a.target}`,
    cancel_job: `cancel job ${a.target}`,
    diagnose: `dump the stacks of job ${a.target}`,
  }[a.action] || `${a.action} ${a.target}`;
}

// One decision for a whole incident: every action of it, after a confirmation that names them.
function askThenDecide(incident, verb) {
  const dialog = document.getElementById("confirm");
  const nodes = incident.actions.filter((a) => a.action === "drain_node").map((a) => a.target);
  document.getElementById("confirm-title").textContent = verb === "approve"
    ? `Approve for ${incident.kind}/${incident.category}${nodes.length ? ` — node ${nodes.join(", ")}` : ""}?`
    : `Reject every action of ${incident.kind}/${incident.category}?`;
  document.getElementById("confirm-actions").replaceChildren(...incident.actions.map((a) => el("li", {}, describeAction(a))));
  document.getElementById("confirm-reason-label").hidden = verb !== "reject";
  document.getElementById("confirm-note").textContent = verb === "approve"
    ? `Carried out through the ${me.driver} driver, checked against the scheduler's inventory and the breaker first.`
    : "Nothing is carried out; the reason goes to the audit log.";
  const reason = document.getElementById("confirm-reason");
  reason.value = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "confirm") return;
    if (verb === "reject" && !reason.value.trim()) {
      document.getElementById("decision-result").textContent = "a rejection needs a reason: nothing was rejected";
      return;
    }
    const lines = [];
    for (const a of incident.actions) {  // in the policy's order: a drain before the requeue that avoids the node
      try {
        lines.push(await decide(a.action_id, verb, reason.value.trim()));
      } catch (error) {
        lines.push(`${a.action} ${a.target}: refused — ${error.message}`);
      }
    }
    document.getElementById("decision-result").textContent = lines.join("; ");
    refresh();
  };
  dialog.showModal();
}

function incidents(rows) {
  const byAnomaly = new Map();
  for (const a of rows) {
    const key = a.anomaly_id || a.action_id;
    if (!byAnomaly.has(key)) byAnomaly.set(key, { ...a, actions: [] });
    byAnomaly.get(key).actions.push(a);
  }
  return [...byAnomaly.values()];
}

function renderPending(rows) {
  document.getElementById("pending-empty").hidden = rows.length > 0;
  const operator = me && me.role === "operator";
  document.getElementById("pending").replaceChildren(
    ...incidents(rows).map((i) =>
      el(
        "article",
        { class: `decision ${i.layer || "unknown"}`, "data-anomaly": i.anomaly_id },
        el("header", {}, el("strong", {}, `${i.kind}/${i.category}`), ` · ${i.layer || "unknown"} · `,
          i.job_id ? `job ${i.job_id}` : "no job", ` · ${(i.nodes || []).join(", ") || "-"}`,
          el("span", { class: "muted" }, ` · detected ${when(i.detected_at)} (event time)`)),
        el("div", { class: "evidence" }, (i.evidence || []).slice(0, 3).join("\n")),
        el("p", { class: "muted" }, `policy: ${i.reason}`),
        el("ul", { class: "actions" }, ...i.actions.map((a) => el("li", { "data-action": a.action_id }, describeAction(a)))),
        operator
          ? el("div", {}, el("button", { class: "approve", onclick: () => askThenDecide(i, "approve") }, "Approve…"),
              el("button", { class: "reject", onclick: () => askThenDecide(i, "reject") }, "Reject…"))
          : el("span", { class: "muted" }, "operators decide"),
      ),
    ),
  );
}

function renderNodes(nodes) {
  document.querySelector("#nodes tbody").replaceChildren(
    ...nodes.map((n) => el("tr", {}, el("td", {}, n.node),
      el("td", {}, Object.entries(n.anomalies).map(([k, c]) => `${k} ${c}`).join(", ")), el("td", {}, n.drained ? "yes" : ""))),
  );
}

// Who carried an entry out: the scheduler driver, a dry run (nothing ran), or nobody (a recommendation).
function ranBy(e) {
  if (e.driver === "dry-run") return "dry run (nothing ran)";
  if (e.driver) return e.noop ? `${e.driver} (already so)` : e.driver;
  return e.event === "recommended" ? "— (recommendation)" : "—";
}

function renderAudit(page) {
  document.querySelector("#audit tbody").replaceChildren(
    ...page.rows.map((e) => el("tr", {}, el("td", {}, when(e.recorded_at)), el("td", {}, e.event), el("td", {}, e.action || "-"),
      el("td", {}, e.target || "-"), el("td", {}, e.mode || "-"), el("td", {}, ranBy(e)), el("td", {}, e.user || ""),
      el("td", {}, e.reason || ""))),
  );
  const first = page.total ? page.offset + 1 : 0;
  const last = Math.min(page.total, page.offset + page.rows.length);
  document.getElementById("audit-page").textContent = `${first}–${last} of ${page.total}, newest first`;
  document.getElementById("audit-newer").disabled = page.offset === 0;
  document.getElementById("audit-older").disabled = last >= page.total;
}

async function pageAudit(step) {
  auditOffset = Math.max(0, auditOffset + step * AUDIT_PAGE);
  renderAudit(await api(`/api/audit?offset=${auditOffset}&limit=${AUDIT_PAGE}`));
}

function renderSilences(silences) {
  const operator = me && me.role === "operator";
  document.getElementById("silence-form").hidden = !operator;
  document.querySelector("#silences tbody").replaceChildren(
    ...silences.filter((s) => s.active).map((s) => {
      const matches = ["node", "job", "kind", "partition"].filter((k) => s[k]).map((k) => `${k} ${s[k]}`).join(", ");
      const expire = operator ? el("button", { class: "expire", onclick: () => expireSilence(s.silence_id) }, "Expire") : "";
      return el("tr", { "data-silence": s.silence_id }, el("td", {}, s.silence_id), el("td", {}, matches),
        el("td", {}, when(s.ends_at)), el("td", {}, s.created_by), el("td", {}, s.reason), el("td", {}, expire));
    }),
  );
}

async function silencePost(path, body) {
  const result = document.getElementById("silence-result");
  try {
    const done = await api(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": me.csrf },
      body: JSON.stringify(body),
    });
    result.textContent = `${done.expired_at ? "expired" : "silenced"} ${done.silence_id}: ${done.reason}`;
  } catch (error) {
    result.textContent = `refused: ${error.message}`;
  }
  refresh();
}

function expireSilence(silenceId) {
  return silencePost(`/api/silences/${encodeURIComponent(silenceId)}/expire`, {});
}

// A job's page (#job/ID): steps per second against event time (UTC), with axes and units, pauses
// (no step for 30 s or more between steps) shaded, and each anomaly a marked line inside the plot.
let jobChart = null;
let jobLanes = null;

function pauses(points) {
  const out = [];
  let start = null;
  points.forEach(([t, rate], i) => {
    if (rate === 0 && start === null) start = i > 0 ? points[i - 1][0] + 10 : t;
    if (rate > 0 && start !== null) { if (t - start >= 30) out.push([start, t]); start = null; }
  });
  return out;
}

function filled(points) {
  // Buckets with no step are gaps in the series: make them zeros, so a pause reads as one.
  const out = [];
  for (const [t, rate] of points) {
    while (out.length && t - out[out.length - 1][0] > 10) out.push([out[out.length - 1][0] + 10, 0]);
    out.push([t, rate]);
  }
  return out;
}

async function showJob(jobId) {
  currentJob = jobId;
  const job = await api(`/api/jobs/${encodeURIComponent(jobId)}`);
  document.getElementById("job-title").textContent = `job ${jobId}`;
  const box = document.getElementById("job-chart");
  const points = filled(job.progress);
  const shaded = pauses(points);
  const markers = job.anomalies.filter((a) => a.detected_at);
  const times = points.map((p) => p[0]).concat(markers.map((a) => a.detected_at));
  if (jobChart) jobChart.destroy();
  box.replaceChildren();
  box.dataset.markers = String(markers.length);
  box.dataset.pauses = String(shaded.length);
  if (!times.length) {
    box.append(el("p", { class: "muted" }, "no progress and no anomaly for this job yet"));
  } else {
    const t0 = Math.min(...times) - 30, t1 = Math.max(...times) + 30;
    const draw = (u) => {
      const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
      ctx.save();
      ctx.fillStyle = "rgba(107, 118, 130, 0.15)";
      for (const [from, to] of shaded) {
        const x0 = u.valToPos(from, "x", true), x1 = u.valToPos(to, "x", true);
        ctx.fillRect(x0, top, x1 - x0, height);
      }
      ctx.strokeStyle = "#c62828"; ctx.fillStyle = "#c62828"; ctx.lineWidth = 2; ctx.font = `${12 * devicePixelRatio}px system-ui`;
      for (const a of markers) {
        const x = u.valToPos(a.detected_at, "x", true);
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
        ctx.fillText(` ${a.kind}`, x, top + 14 * devicePixelRatio);
      }
      ctx.restore();
    };
    jobChart = new uPlot(
      {
        width: Math.max(320, box.clientWidth || 560),
        height: 220,
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        scales: { x: { time: true, range: [t0, t1] }, y: { range: (u, lo, hi) => [0, Math.max(0.1, hi * 1.15)] } },
        axes: [{ label: "event time (UTC)" }, { label: "steps/s", size: 60 }],
        series: [{}, { label: "steps/s", stroke: "#1565c0", width: 1.5, points: { show: false } }],
        hooks: { draw: [draw] },
      },
      [points.map((p) => p[0]), points.map((p) => p[1])],
      box,
    );
  }
  // GPU lanes: each of the job's nodes, the mean utilisation of its GPUs per minute, on the same time axis.
  const lanesBox = document.getElementById("job-lanes");
  if (jobLanes) jobLanes.destroy();
  jobLanes = null;
  lanesBox.replaceChildren();
  const lanes = Object.entries(job.lanes || {});
  lanesBox.dataset.nodes = String(lanes.length);
  if (lanes.length && times.length) {
    const stamps = [...new Set(lanes.flatMap(([, rows]) => rows.map((r) => r[0])))].sort((a, b) => a - b);
    const column = (rows, i) => {
      const at = new Map(rows.map((r) => [r[0], r[i]]));
      return stamps.map((t) => (at.has(t) ? at.get(t) : null));
    };
    const series = [...lanes.map(([, rows]) => column(rows, 1)), ...lanes.map(([, rows]) => column(rows, 2))];
    const t0 = Math.min(...times) - 30, t1 = Math.max(...times) + 30;
    jobLanes = new uPlot(
      {
        title: "GPU utilisation (solid) and power (dashed) per node, mean of its GPUs",
        width: Math.max(320, lanesBox.clientWidth || 560),
        height: 160,
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        scales: { x: { time: true, range: [t0, t1] }, y: { range: [0, 100] }, W: { range: (u, lo, hi) => [0, Math.max(100, hi * 1.1)] } },
        axes: [{ label: "event time (UTC)" }, { label: "util %", size: 60 }, { scale: "W", side: 1, label: "power W", size: 60, grid: { show: false } }],
        series: [
          {},
          ...lanes.map(([node], i) => ({ label: `${node} util`, stroke: PALETTE[i % PALETTE.length], width: 1.2, points: { show: false } })),
          ...lanes.map(([node], i) => ({ label: `${node} W`, scale: "W", stroke: PALETTE[i % PALETTE.length], dash: [4, 3], width: 1, points: { show: false } })),
        ],
      },
      [stamps, ...series],
      lanesBox,
    );
  }
  document.getElementById("job-events").replaceChildren(
    ...job.anomalies.map((a) => el("li", {}, `${when(a.detected_at)} (event time) ${a.kind}/${a.category} on ${(a.nodes || []).join(", ")}`,
      a.log && a.log.length
        ? el("pre", { class: "log" }, a.log.map(([t, line]) => `${when(t).slice(11, 19)} ${t <= a.detected_at ? " " : "+"} ${line}`).join("\n"))
        : "")),
    ...job.actions.map((a) => el("li", {}, `${when(a.recorded_at)} (wall clock) ${a.event}: ${a.action} ${a.target}`)),
  );
}

// The cluster map: a row per node, a cell per GPU, coloured by health (see ConsoleData.gpu_health).
function fixed(value, unit) {
  return value === null || value === undefined ? "-" : `${Math.round(value)}${unit}`;
}

function gpuTitle(node, g) {
  const metrics = g.util_pct === undefined ? "no telemetry" : `util ${fixed(g.util_pct, " %")}, ${fixed(g.power_w, " W")}, ${fixed(g.temp_c, " °C")}`;
  return `${node} GPU ${g.gpu}: ${g.health}${g.why ? ` — ${g.why}` : ""}; ${metrics}`;
}

function renderCluster(map) {
  document.getElementById("cluster").replaceChildren(
    ...map.nodes.map((n) =>
      el(
        "div",
        { class: "map-row", "data-node": n.node },
        el("a", { class: "node", href: `#node/${encodeURIComponent(n.node)}`,
          title: n.scheduler_state ? `${n.node}: ${map.scheduler.driver} says ${n.scheduler_state}` : n.node }, n.node),
        ...n.gpus.map((g) => el("span", { class: `gpu ${g.health}`, title: gpuTitle(n.node, g), "aria-label": gpuTitle(n.node, g) }, g.gpu)),
      ),
    ),
  );
  const source = !map.scheduler ? "scheduler state: unknown (no driver)"
    : map.scheduler.error ? `scheduler state: unknown (${map.scheduler.error})` : `scheduler state from ${map.scheduler.driver}: hover a node`;
  document.getElementById("cluster-legend").replaceChildren(
    ...map.levels.map((level) => el("span", { class: `gpu ${level}` }, level)),
    el("span", { class: "muted" }, source),
  );
}

// A node's own view (its URL: #node/NAME): GPUs with their latest telemetry, its anomalies and actions.
async function showNode(name) {
  const node = await api(`/api/nodes/${encodeURIComponent(name)}`);
  const panel = document.getElementById("node-view");
  panel.hidden = false;
  document.getElementById("node-title").textContent = `${name}${node.drained ? " — drained" : ""}`;
  document.querySelector("#node-gpus tbody").replaceChildren(
    ...(node.gpus || []).map((g) => el("tr", { class: g.health }, el("td", {}, g.gpu), el("td", {}, el("span", { class: `gpu ${g.health}` }, g.health)),
      el("td", {}, fixed(g.util_pct, " %")), el("td", {}, fixed(g.power_w, " W")), el("td", {}, fixed(g.temp_c, " °C")),
      el("td", {}, fixed(g.sm_clock_mhz, " MHz")), el("td", {}, [g.ecc_sbe_total, g.ecc_dbe_total].map((v) => v ?? "-").join(" / ")),
      el("td", {}, g.pcie_replay_total ?? "-"), el("td", {}, g.nvlink_crc_total ?? "-"), el("td", {}, g.why || ""))),
  );
  document.getElementById("node-events").replaceChildren(
    ...node.anomalies.map((a) => el("li", {}, `${when(a.detected_at)} (event time) ${a.kind}/${a.category}${a.resolved_at ? `, resolved: ${a.resolution}` : ", open"}`)),
    ...node.actions.map((a) => el("li", {}, `${a.action} ${a.target}: ${a.event} (${ranBy(a)})`)),
  );
  panel.scrollIntoView({ block: "start" });
}

// The incident list: filters and a time range (event time, back from the newest event), paged.
let incidentOffset = 0;
const INCIDENT_PAGE = 25;
let newestEvent = 0;

function ago(ts, newest) {
  const s = Math.max(0, newest - ts);
  const text = s < 90 ? `${Math.round(s)} s` : s < 5400 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
  return `${text} before the newest event`;
}

async function loadIncidents() {
  const form = new FormData(document.getElementById("incident-filters"));
  const params = new URLSearchParams({ offset: incidentOffset, limit: INCIDENT_PAGE });
  for (const key of ["kind", "layer", "status", "node", "job"]) if (form.get(key)) params.set(key, form.get(key).trim());
  if (form.get("range") && newestEvent) params.set("since", newestEvent - Number(form.get("range")));
  const page = await api(`/api/incidents?${params}`);
  newestEvent = page.newest;
  for (const [name, values] of [["kind", page.kinds], ["layer", page.layers]]) {
    const select = document.querySelector(`#incident-filters [name=${name}]`);
    const chosen = select.value;
    select.replaceChildren(select.options[0], ...values.map((v) => el("option", { value: v }, v)));
    select.value = chosen;
  }
  document.querySelector("#incidents tbody").replaceChildren(
    ...page.rows.map((a) =>
      el(
        "tr",
        { "data-anomaly": a.anomaly_id, class: a.resolved_at ? "resolved" : "open" },
        el("td", {}, el("strong", {}, a.kind), ` ${a.category}`),
        el("td", {}, a.job_id ? el("a", { href: `#job/${encodeURIComponent(a.job_id)}` }, `job ${a.job_id}`) : "no job", " ",
          ...(a.nodes || []).map((n) => el("a", { href: `#node/${encodeURIComponent(n)}`, class: "node" }, n))),
        el("td", { title: `${when(a.detected_at)} (event time)` }, ago(a.detected_at, page.newest)),
        el("td", {}, a.layer || "unknown"),
        el("td", {}, a.severity || "-"),
        el("td", { class: "evidence" }, (a.evidence || [])[0] || ""),
        el("td", {}, a.resolved_at ? `resolved: ${a.resolution}` : "open"),
        el("td", {}, a.actions.map((x) => `${x.action} ${x.event}`).join(", ") || "-"),
      ),
    ),
  );
  const first = page.total ? page.offset + 1 : 0;
  const last = Math.min(page.total, page.offset + page.rows.length);
  document.getElementById("incidents-page").textContent = `${first}–${last} of ${page.total}`;
  document.getElementById("incidents-newer").disabled = page.offset === 0;
  document.getElementById("incidents-older").disabled = last >= page.total;
}

// The trend row: anomalies opened per kind, actions per state, time to detect — over the range
// the incident list's time range picks (event time).
const trendCharts = {};
const PALETTE = ["#c62828", "#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#6b7682", "#ad1457"];

function trendChart(id, title, t, series, unit, scatter = false) {
  const box = document.getElementById(id);
  if (trendCharts[id]) trendCharts[id].destroy();
  box.replaceChildren();
  const names = Object.keys(series);
  if (!t.length || !names.length) {
    box.append(el("p", { class: "muted" }, `${title}: nothing in this range`));
    return;
  }
  const bars = uPlot.paths.bars({ size: [0.8, 40] });
  trendCharts[id] = new uPlot(
    {
      title,
      width: Math.max(260, box.clientWidth || 300),
      height: 170,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      scales: { x: { time: true }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } },
      axes: [{ label: "event time (UTC)" }, { label: unit, size: 50 }],
      series: [{}, ...names.map((name, i) => ({
        label: name, stroke: PALETTE[i % PALETTE.length], fill: scatter ? undefined : `${PALETTE[i % PALETTE.length]}55`,
        paths: scatter ? () => null : bars, points: scatter ? { show: true, size: 6 } : { show: false },
      }))],
    },
    [t, ...names.map((n) => series[n])],
    box,
  );
}

async function loadTrends() {
  const range = new FormData(document.getElementById("incident-filters")).get("range");
  const trends = await api(`/api/trends${range && newestEvent ? `?since=${newestEvent - Number(range)}` : ""}`);
  trendChart("trend-anomalies", "anomalies opened, by kind", trends.t, trends.anomalies, "count");
  trendChart("trend-actions", "actions, by state", trends.t, trends.actions, "count");
  const kinds = [...new Set(trends.detect.map((d) => d[2]))];
  const times = trends.detect.map((d) => d[0]);
  const detect = Object.fromEntries(kinds.map((k) => [k, trends.detect.map((d) => (d[2] === k ? d[1] : null))]));
  trendChart("trend-detect", "time to detect, by kind", times, detect, "seconds", true);
}

function route() {
  const [view, arg] = decodeURIComponent(location.hash.slice(1)).split("/");
  if (view === "node" && arg) showNode(arg);
  else if (view === "job" && arg) showJob(arg);
  else document.getElementById("node-view").hidden = true;
}

async function refresh() {
  const [overview, feed, pending, nodes, audit, silences, cluster] = await Promise.all(
    ["/api/overview", "/api/anomalies", "/api/pending", "/api/nodes", `/api/audit?offset=${auditOffset}&limit=${AUDIT_PAGE}`,
      "/api/silences", "/api/cluster"].map((p) => api(p)),
  );
  renderCluster(cluster);
  loadIncidents().then(loadTrends);
  renderSilences(silences);
  renderOverview(overview);
  renderFeed(feed);
  renderPending(pending);
  renderNodes(nodes);
  renderAudit(audit);
  if (currentJob) showJob(currentJob);
  else if (feed.length && feed[0].job_id) showJob(feed[0].job_id);
}

async function start() {
  me = await api("/api/me");
  document.getElementById("who").textContent = `${me.user} (${me.role})`;
  document.getElementById("modes").textContent = me.modes.map((m) => `${m.scope}: ${m.mode}`).join(" · ") + ` · driver ${me.driver}`;
  document.getElementById("audit-newer").addEventListener("click", () => pageAudit(-1));
  document.getElementById("audit-older").addEventListener("click", () => pageAudit(1));
  document.getElementById("silence-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = new FormData(event.target);
    silencePost("/api/silences", Object.fromEntries(form.entries()));
    event.target.reset();
  });
  await refresh();
  window.addEventListener("hashchange", route);
  const filters = document.getElementById("incident-filters");
  filters.addEventListener("change", () => { incidentOffset = 0; loadIncidents().then(loadTrends); });
  filters.addEventListener("submit", (event) => { event.preventDefault(); incidentOffset = 0; loadIncidents(); });
  document.getElementById("incidents-newer").addEventListener("click", () => { incidentOffset = Math.max(0, incidentOffset - INCIDENT_PAGE); loadIncidents(); });
  document.getElementById("incidents-older").addEventListener("click", () => { incidentOffset += INCIDENT_PAGE; loadIncidents(); });
  route();
  // The connection's state in three colours: live (a message within 15 s), stale, connecting.
  const live = document.getElementById("live");
  let heard = 0;
  const state = (text, cls) => { live.textContent = text; live.className = `badge ${cls}`; };
  const events = new EventSource("/api/events");
  events.addEventListener("update", () => { heard = Date.now(); state("live", ""); refresh(); });
  events.addEventListener("tick", () => { heard = Date.now(); state("live", ""); });
  events.onerror = () => state("connecting…", "off");
  setInterval(() => { if (heard && Date.now() - heard > 15000 && events.readyState === EventSource.OPEN) state("stale", "stale"); }, 2000);
}

start();
