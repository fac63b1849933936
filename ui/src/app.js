// The cloakd workbench: one page, four steps (load a table and assign roles; sweep models and
// parameters; the frontier; one release). Talks only to the daemon's /api/v1 (same origin, bearer
// token in a header); builds every element through the DOM (no innerHTML of server data, no inline
// styles or scripts: the CSP forbids them). Performance marks (`wb-interactive`, `wb-sweep-start`,
// `wb-first-point`, `wb-sweep-done`) let a test read the page's own timings.
import { api, ApiError, download, hasToken, saveBlob, setToken } from "./api.js";
import { BrickellShmatikovChart, DistributionChart, FIELD_LABELS, FrontierChart, HistogramChart, LiLiChart, fmt } from "./charts.js";
import { buildJob, checkChoices, cliCommand, parseJob, parseList } from "./job.js";

const $ = (id) => document.getElementById(id);
const ROLES = [
  ["quasi", "quasi-identifier"],
  ["sensitive", "sensitive"],
  ["insensitive", "insensitive"],
  ["drop", "drop"],
];
const DEFAULTS = {
  k: "10,50,100,200,500,1000,2000,5000",
  l: "3,3.5,4,4.25,4.5,4.75,5,5.5",
  t: "0.075,0.1,0.15,0.2,0.25,0.3,0.35,0.4",
  delta: "1,1.2,1.4,1.5,1.7,1.9,2,2.1",
};
const POLL_MS = 200;
const FORBIDDEN = "This principal's role may not use the workbench (it needs an analyst or operator token).";

const state = {
  session: null,
  table: null,
  choices: null,
  sweep: null, // { id, total, request, points, state }
  release: null,
  poll: null,
};

let frontierChart;
let liliChart;
let bsChart;
let histogramChart;
let classChart;

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function show(id, visible = true) {
  $(id).hidden = !visible;
}

function status(text) {
  $("status").textContent = text;
}

function showError(id, error) {
  const node = $(id);
  if (!error) {
    node.hidden = true;
    node.textContent = "";
    return;
  }
  let text = error instanceof ApiError && error.status === 403 ? FORBIDDEN : error.message || String(error);
  if (error instanceof ApiError && error.field) text += ` (field: ${error.field})`;
  node.textContent = text;
  node.hidden = false;
  if (error instanceof ApiError && error.status === 401) needToken("The token was not accepted; enter it again.");
}

// ------------------------------------------------------------------------------------------------
// Session and token
// ------------------------------------------------------------------------------------------------

function needToken(message) {
  show("auth");
  for (const id of ["step-load", "step-sweep", "step-frontier", "step-release"]) show(id, false);
  if (message) {
    $("auth-error").textContent = message;
    $("auth-error").hidden = false;
  }
  document.body.dataset.auth = "required";
  status("Authentication required.");
  $("token").focus();
}

async function startSession() {
  let session;
  try {
    session = await api("/api/v1/session");
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      needToken(hasToken() ? "The token was not accepted." : null);
      return;
    }
    if (e instanceof ApiError && e.status === 403) {
      refuse();
      return;
    }
    $("fatal").textContent = `Cannot reach the workbench API: ${e.message}`;
    $("fatal").hidden = false;
    status("");
    return;
  }
  if (session.auth_required && !session.principal) {
    needToken(hasToken() ? "The token was not accepted." : null);
    return;
  }
  if (session.role && !["analyst", "operator"].includes(session.role)) {
    refuse();
    return;
  }
  state.session = session;
  show("auth", false);
  $("auth-error").hidden = true;
  document.body.dataset.auth = "ok";
  $("who").textContent = session.principal ? `${session.principal} (${session.role})` : "no authentication (loopback)";
  try {
    const examples = await api("/api/v1/examples");
    const box = $("examples");
    box.replaceChildren();
    for (const x of examples) {
      const title = x.name.charAt(0).toUpperCase() + x.name.slice(1);
      box.append(
        el("button", { type: "button", id: `example-${x.name}`, title: x.description || "", onclick: () => loadTable({ example: x.name }) }, `Load ${title} example`),
        el("span", { class: "note" }, `${x.description || ""} (${x.rows} rows)`),
      );
    }
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return refuse();
    showError("load-error", e);
  }
  if (session.limits) {
    $("upload-csv").title = `at most ${session.limits.max_rows} rows and ${session.limits.max_bytes} bytes`;
  }
  show("step-load");
  status("Load a table: an example or your own CSV.");
  document.body.dataset.ready = "1";
  performance.mark("wb-interactive");
}

function refuse() {
  needToken(FORBIDDEN);
  document.body.dataset.auth = "forbidden";
  status(FORBIDDEN);
}

// ------------------------------------------------------------------------------------------------
// Step 1: the table and its roles
// ------------------------------------------------------------------------------------------------

async function loadTable(body) {
  showError("load-error", null);
  status("Loading the table…");
  for (const b of document.querySelectorAll("#step-load button")) b.disabled = true;
  try {
    const table = await api("/api/v1/tables", { method: "POST", body });
    setTable(table);
    status(`Loaded ${table.name}: ${table.rows} rows. Check the roles, then run a sweep.`);
  } catch (e) {
    showError("load-error", e);
    status("The table was not loaded.");
  } finally {
    for (const b of document.querySelectorAll("#step-load button")) b.disabled = false;
  }
}

async function uploadTable(event) {
  event.preventDefault();
  const file = $("upload-csv").files[0];
  if (!file) {
    showError("load-error", new Error("choose a CSV file to upload"));
    return;
  }
  const limits = state.session && state.session.limits;
  if (limits && limits.max_bytes && file.size > limits.max_bytes) {
    showError("load-error", new Error(`${file.name} is ${file.size} bytes; the daemon takes at most ${limits.max_bytes}`));
    return;
  }
  const hierarchies = {};
  for (const h of $("upload-hierarchies").files) hierarchies[`hierarchies/${h.name}`] = await h.text();
  await loadTable({ name: file.name, csv: await file.text(), hierarchies });
}

function setTable(table) {
  state.table = table;
  const suggested = parseJob(table.job || "");
  const choices = { input: suggested.input || (table.files && table.files[0]) || table.name, delimiter: suggested.delimiter, columns: new Map() };
  for (const c of table.columns) {
    const s = suggested.columns.get(c.name);
    let role = "drop";
    let hierarchy = "";
    if (s) {
      role = s.role === "identifier" ? "drop" : s.role;
      hierarchy = s.hierarchy || "";
    }
    if (!hierarchy && c.kind !== "numeric" && c.hierarchies && c.hierarchies.length) hierarchy = c.hierarchies[0];
    choices.columns.set(c.name, { role, hierarchy });
  }
  state.choices = choices;
  $("table-summary").textContent = `${table.name}: ${table.rows} rows, ${table.columns.length} columns.`;
  const body = $("columns").querySelector("tbody");
  body.replaceChildren();
  table.columns.forEach((c, i) => {
    const choice = choices.columns.get(c.name);
    const role = el("select", { id: `role-${i}`, dataset: { column: c.name } });
    for (const [value, text] of ROLES) role.append(el("option", { value, selected: value === choice.role }, text));
    role.addEventListener("change", () => {
      choice.role = role.value;
      refreshJob();
    });
    const hierarchy = el("select", { id: `hierarchy-${i}`, dataset: { column: c.name } });
    const options = new Set(c.hierarchies || []);
    if (choice.hierarchy) options.add(choice.hierarchy);
    hierarchy.append(el("option", { value: "", selected: !choice.hierarchy }, c.kind === "numeric" ? "none (numeric intervals)" : "none"));
    for (const h of options) hierarchy.append(el("option", { value: h, selected: h === choice.hierarchy }, h));
    hierarchy.addEventListener("change", () => {
      choice.hierarchy = hierarchy.value;
      refreshJob();
    });
    body.append(
      el(
        "tr",
        { dataset: { column: c.name } },
        el("th", { scope: "row" }, c.name),
        el("td", {}, c.kind),
        el("td", { class: "num" }, String(c.distinct)),
        el("td", {}, el("label", { for: `role-${i}`, class: "visually-hidden" }, `Role of ${c.name}`), role),
        el("td", {}, el("label", { for: `hierarchy-${i}`, class: "visually-hidden" }, `Hierarchy of ${c.name}`), hierarchy),
      ),
    );
  });
  const workload = $("workload-attribute");
  workload.replaceChildren(el("option", { value: "" }, "none"));
  for (const c of table.columns) workload.append(el("option", { value: c.name }, c.name));
  show("table-info");
  show("step-sweep");
  show("step-frontier", false);
  show("step-release", false);
  refreshJob();
}

// ------------------------------------------------------------------------------------------------
// Step 2: the sweep
// ------------------------------------------------------------------------------------------------

function checked(prefix, values) {
  return values.filter((v) => $(`${prefix}-${v}`).checked);
}

/** The sweep request of the form (throws naming the field on bad input). */
function sweepRequest() {
  const attribute = $("workload-attribute").value;
  const request = {
    table: state.table.table,
    k: parseList($("sweep-k").value, "k"),
    l: parseList($("sweep-l").value, "l"),
    t: parseList($("sweep-t").value, "t"),
    delta: parseList($("sweep-delta").value, "delta"),
    methods: checked("method", ["generalization", "bucketization"]),
    algorithms: checked("algorithm", ["mondrian", "kaca", "ola"]),
    t_distance: $("sweep-t-distance").value,
    metric: $("sweep-metric").value,
    max_suppression: Number($("sweep-suppression").value || 0),
    seed: Number($("sweep-seed").value || 0),
    workload: null,
  };
  if (attribute) {
    request.workload = {
      attribute,
      classifiers: checked("classifier", ["j48", "rf", "nb"]),
      folds: Number($("workload-folds").value || 10),
      seed: Number($("workload-seed").value || 1),
    };
  }
  return request;
}

/** Rebuilds the job and the CLI command from the current choices; returns the job or null. */
function refreshJob() {
  if (!state.table) return null;
  const problem = checkChoices(state.table, state.choices);
  showError("roles-error", problem ? new Error(problem) : null);
  $("run").disabled = Boolean(problem) || Boolean(state.sweep && state.sweep.state === "running");
  let request;
  try {
    request = sweepRequest();
    showError("sweep-error", null);
  } catch (e) {
    showError("sweep-error", e);
    $("run").disabled = true;
    return null;
  }
  const job = buildJob(state.table, state.choices, request);
  $("cli-command").textContent = cliCommand(request);
  state.job = job;
  return problem ? null : job;
}

async function runSweep(event) {
  event.preventDefault();
  const job = refreshJob();
  if (!job) return;
  const request = { ...sweepRequest(), job };
  showError("sweep-error", null);
  $("run").disabled = true;
  performance.clearMarks("wb-sweep-start");
  performance.clearMarks("wb-first-point");
  performance.clearMarks("wb-sweep-done");
  performance.mark("wb-sweep-start");
  let started;
  try {
    started = await api("/api/v1/sweeps", { method: "POST", body: request });
  } catch (e) {
    showError("sweep-error", e);
    $("run").disabled = false;
    return;
  }
  state.sweep = { id: started.sweep, total: started.total, request, points: [], state: "running" };
  document.body.dataset.sweep = "running";
  $("progress").max = started.total;
  $("progress").value = 0;
  $("progress-text").textContent = `0 / ${started.total} releases`;
  $("cancel").disabled = false;
  $("releases").querySelector("tbody").replaceChildren();
  show("step-frontier");
  show("step-release", false);
  status(`Sweep ${started.sweep}: ${started.total} releases…`);
  pollSweep();
}

async function pollSweep() {
  const sweep = state.sweep;
  if (!sweep) return;
  let s;
  try {
    s = await api(`/api/v1/sweeps/${sweep.id}`);
  } catch (e) {
    showError("sweep-error", e);
    if (e instanceof ApiError && e.status >= 400 && e.status < 500) {
      // Gone (evicted), or the token no longer admits us: stop following this sweep.
      $("cancel").disabled = true;
      document.body.dataset.sweep = "failed";
      return;
    }
    state.poll = setTimeout(pollSweep, POLL_MS * 5);
    return;
  }
  if (state.sweep !== sweep) return;
  sweep.state = s.state;
  sweep.total = s.total;
  if (s.points.length > 0 && sweep.points.length === 0) performance.mark("wb-first-point");
  sweep.points = s.points;
  const leftOut = $("left-out");
  leftOut.replaceChildren(...(s.left_out || []).map((x) => el("li", {}, `Release #${x.release} left out: ${x.reason}`)));
  leftOut.hidden = leftOut.children.length === 0;
  $("progress").max = s.total || 1;
  $("progress").value = s.done;
  $("progress-text").textContent = `${s.done} / ${s.total} releases`;
  drawFrontier();
  if (s.state === "running") {
    state.poll = setTimeout(pollSweep, POLL_MS);
    return;
  }
  performance.mark("wb-sweep-done");
  $("cancel").disabled = true;
  document.body.dataset.sweep = s.state;
  refreshJob();
  if (s.state === "failed") showError("sweep-error", new Error(s.error || "the sweep failed"));
  status(`Sweep ${sweep.id} ${s.state}: ${s.points.length} releases measured. Pick one in the chart or the list.`);
}

async function cancelSweep() {
  if (!state.sweep) return;
  $("cancel").disabled = true;
  try {
    await api(`/api/v1/sweeps/${state.sweep.id}`, { method: "DELETE" });
    status("Cancelling…");
  } catch (e) {
    showError("sweep-error", e);
  }
}

function exportJob() {
  const job = refreshJob();
  if (!job) return;
  saveBlob(new Blob([job], { type: "application/toml" }), "job.toml");
}

// ------------------------------------------------------------------------------------------------
// Step 3: the frontier
// ------------------------------------------------------------------------------------------------

/** The best classifier's U_san − U_base of a point (the `gain_*` columns), or null. */
function gain(p) {
  let best = null;
  for (const [k, v] of Object.entries(p)) {
    if (k.startsWith("gain_") && typeof v === "number" && (best === null || v > best)) best = v;
  }
  return best;
}

function value(p, field) {
  const v = field === "gain" ? gain(p) : p[field];
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

function pointLabel(p) {
  return `#${p.release} ${p.model} ${p.parameter} ${p.method} ${p.algorithm}`;
}

function drawFrontier() {
  const points = state.sweep ? state.sweep.points : [];
  const x = $("axis-x").value;
  const y = $("axis-y").value;
  const placed = frontierChart.update(points, x, y, value, pointLabel);
  $("axis-note").textContent =
    points.length > 0 && placed < points.length
      ? `${points.length - placed} of ${points.length} releases have no ${FIELD_LABELS[y]} or ${FIELD_LABELS[x]} and are not plotted.`
      : "";
  liliChart.update(points, pointLabel);
  const anyGain = bsChart.update(points, (p) => `#${p.release} ${p.model} ${p.parameter}`, gain);
  $("bs-note").textContent = anyGain ? "" : "Run the sweep with a workload attribute to see U_san − U_base beside A_acc.";
  const body = $("releases").querySelector("tbody");
  const known = new Set([...body.children].map((r) => r.dataset.release));
  for (const p of points) {
    const row = known.has(String(p.release)) ? body.querySelector(`tr[data-release="${p.release}"]`) : null;
    if (row) {
      row.classList.toggle("efficient", Boolean(p.efficient));
      row.dataset.efficient = String(Boolean(p.efficient));
      row.querySelector("td.eff").textContent = p.efficient ? "★" : "";
      continue;
    }
    const data = { release: String(p.release), model: p.model, parameter: String(p.parameter), method: p.method, algorithm: p.algorithm, efficient: String(Boolean(p.efficient)) };
    for (const [k, v] of Object.entries(p)) if (typeof v === "number" && !(k in data)) data[k.replace(/_([a-z])/g, (_, c) => c.toUpperCase())] = String(v);
    const num = (v) => el("td", { class: "num" }, fmt(v));
    // In release order, whatever order the releases finish in.
    const next = [...body.children].find((r) => Number(r.dataset.release) > p.release) || null;
    body.insertBefore(
      el(
        "tr",
        { dataset: data, class: p.efficient ? "efficient" : "" },
        el("td", {}, el("button", { type: "button", class: "link", "aria-label": `Open release ${pointLabel(p)}`, onclick: () => openRelease(p.release) }, `#${p.release}`)),
        el("td", {}, p.model),
        el("td", { class: "num" }, String(p.parameter)),
        el("td", {}, p.method),
        el("td", {}, p.algorithm),
        num(p.ploss),
        num(p.uloss),
        num(p.a_know),
        num(p.a_acc),
        num(gain(p)),
        el("td", { class: "eff" }, p.efficient ? "★" : ""),
      ),
      next,
    );
  }
}

// ------------------------------------------------------------------------------------------------
// Step 4: one release
// ------------------------------------------------------------------------------------------------

function releasePath(n) {
  return `/api/v1/sweeps/${state.sweep.id}/releases/${n}`;
}

async function openRelease(n) {
  if (!state.sweep) return;
  showError("release-error", null);
  status(`Opening release #${n}…`);
  let r;
  try {
    r = await api(releasePath(n));
  } catch (e) {
    show("step-release");
    showError("release-error", e);
    return;
  }
  state.release = { n, ...r };
  for (const row of $("releases").querySelectorAll("tbody tr")) {
    const selected = row.dataset.release === String(n);
    row.classList.toggle("selected", selected);
    const b = row.querySelector("button");
    if (b) b.classList.toggle("selected", selected);
  }
  const point = state.sweep.points.find((p) => p.release === n);
  $("release-summary").textContent = point
    ? `Release #${n}: ${point.model} ${point.parameter}, ${point.method}, ${point.algorithm}; ${r.classes} classes.`
    : `Release #${n}: ${r.classes} classes.`;
  document.body.dataset.release = String(n);
  renderReport(r.report);
  histogramChart.update(r.class_sizes || []);
  $("class-pick").max = String(Math.max(0, r.classes - 1));
  $("class-pick").value = "0";
  renderPreview(r.preview);
  $("release-job").textContent = r.job;
  show("step-release");
  $("step-release").scrollIntoView({ block: "start" });
  status(`Release #${n} open.`);
  if (r.classes > 0) showClass(0);
}

function scalar(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmt(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (Array.isArray(v)) return v.map(scalar).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function renderReport(report) {
  const measures = $("measures").querySelector("tbody");
  const checks = $("checks").querySelector("tbody");
  measures.replaceChildren();
  checks.replaceChildren();
  const row = (key, v) => el("tr", { dataset: { key } }, el("th", { scope: "row" }, key), el("td", { class: "num" }, scalar(v)));
  for (const [key, v] of Object.entries(report || {})) {
    if (key === "class_sizes") continue;
    if (key === "models" && Array.isArray(v)) {
      for (const m of v) checks.append(row(`model ${m.model}: violating classes`, m.violating_classes));
    } else if (v && typeof v === "object" && !Array.isArray(v)) {
      const target = key === "attacks" ? checks : measures;
      for (const [k, x] of Object.entries(v)) {
        if (x && typeof x === "object" && !Array.isArray(x)) {
          for (const [k2, y] of Object.entries(x)) target.append(row(`${key}.${k}.${k2}`, y));
        } else target.append(row(`${key}.${k}`, x));
      }
    } else {
      measures.append(row(key, v));
    }
  }
}

function renderPreview(preview) {
  const table = $("preview");
  const head = table.querySelector("thead");
  const body = table.querySelector("tbody");
  head.replaceChildren();
  body.replaceChildren();
  if (!preview) return;
  head.append(el("tr", {}, ...preview.columns.map((c) => el("th", { scope: "col" }, c))));
  for (const r of preview.rows) body.append(el("tr", {}, ...r.map((v) => el("td", {}, String(v)))));
}

async function showClass(c) {
  if (!state.release) return;
  try {
    const cls = await api(`${releasePath(state.release.n)}/classes/${c}`);
    classChart.update(cls.sensitive);
    $("class-caption").textContent = `Class ${cls.class} (${cls.size} rows): its ${cls.sensitive.attribute} distribution against the whole table's`;
    showError("release-error", null);
  } catch (e) {
    showError("release-error", e);
  }
}

async function save(what, filename) {
  if (!state.release) return;
  try {
    await download(`${releasePath(state.release.n)}/${what}`, filename);
    status(`Saved ${filename}.`);
  } catch (e) {
    showError("release-error", e);
  }
}

// ------------------------------------------------------------------------------------------------
// Wiring
// ------------------------------------------------------------------------------------------------

function init() {
  for (const [k, v] of Object.entries(DEFAULTS)) $(`sweep-${k}`).value = v;
  frontierChart = new FrontierChart($("frontier-chart"), openRelease);
  liliChart = new LiLiChart($("lili-chart"), openRelease);
  bsChart = new BrickellShmatikovChart($("bs-chart"));
  histogramChart = new HistogramChart($("histogram-chart"));
  classChart = new DistributionChart($("class-chart"));
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken($("token").value.trim());
    $("token").value = "";
    $("auth-error").hidden = true;
    startSession();
  });
  $("upload-form").addEventListener("submit", uploadTable);
  $("sweep-form").addEventListener("submit", runSweep);
  $("sweep-form").addEventListener("input", refreshJob);
  $("sweep-form").addEventListener("change", refreshJob);
  $("cancel").addEventListener("click", cancelSweep);
  $("export-job").addEventListener("click", exportJob);
  $("axis-x").addEventListener("change", drawFrontier);
  $("axis-y").addEventListener("change", drawFrontier);
  $("class-form").addEventListener("submit", (e) => {
    e.preventDefault();
    showClass(Number($("class-pick").value || 0));
  });
  $("download-csv").addEventListener("click", () => save("release.csv", "release.csv"));
  $("download-report").addEventListener("click", () => save("report.json", "report.json"));
  $("download-job").addEventListener("click", () => save("job.toml", "job.toml"));
  startSession();
}

init();
