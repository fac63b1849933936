// The cloakd workbench: one page, five steps (load a table, assign roles and see its
// re-identification risk; sweep models and parameters; the frontier; one release with its record-risk
// histogram; two releases side by side). Talks only to the daemon's /api/v1 (same origin, bearer
// token in a header); builds every element through the DOM (no innerHTML of server data, no inline
// styles or scripts: the CSP forbids them). Performance marks (`wb-interactive`, `wb-sweep-start`,
// `wb-first-point`, `wb-sweep-done`) let a test read the page's own timings.
import { api, ApiError, download, hasToken, saveBlob, setToken } from "./api.js";
import { BrickellShmatikovChart, DistributionChart, FIELD_LABELS, FrontierChart, HistogramChart, LiLiChart, RiskChart, fmt } from "./charts.js";
import { $, el, show } from "./dom.js";
import { Comparison } from "./compare.js";
import { findings } from "./findings.js";
import { proposedRoles, sweepFlags } from "./flags.js";
import { groupHierarchy, hierarchyText, intervalHierarchy, maskHierarchy } from "./hierarchy.js";
import { buildJob, checkChoices, cliCommand, parseJob, parseList } from "./job.js";

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
  sweeps: [], // every sweep started since the page was opened: { id, table, request, state, total, done, points }
  release: null,
  poll: null,
  tableRisk: null, // { key, table }: the quasi-identifiers and table version the shown risk was measured on
};

let frontierChart;
let liliChart;
let bsChart;
let histogramChart;
let riskChart;
let tableRiskChart;
let classChart;
let comparison;

function status(text) {
  $("status").textContent = text;
}

/** An Error from whatever failed: an Error, an API error body (`{code, message, field}`) or text. */
function asError(e) {
  if (e instanceof Error) return e;
  if (e && typeof e === "object") return new ApiError(0, e.code || "error", e.message || JSON.stringify(e), e.field);
  return new Error(String(e));
}

/** What to change, for the fields whose fix the page knows. */
const FIXES = {
  "workload.attribute": "Give the attribute to learn a role other than drop, or pick another one.",
  hierarchies: "Hierarchy files are CSV (',' or ';' between levels), one row per value, from the value to the most general level.",
  csv: "Upload a text table with a header row; choose its delimiter if it is not detected.",
  "tables.max_job_bytes": "Use fewer quasi-identifiers or a smaller table, or ask the operator to raise tables.max_job_bytes.",
};

/** An error in words: the message, the field it concerns and, where known, what to change. */
function errorText(error) {
  const e = asError(error);
  if (e instanceof ApiError && e.status === 403) return FORBIDDEN;
  let text = e.message || String(e);
  if (e instanceof ApiError && e.field) {
    text += ` (field: ${e.field})`;
    const fix = FIXES[e.field];
    if (fix) text += ` ${fix}`;
  }
  return text;
}

function showError(id, error) {
  const node = $(id);
  if (!error) {
    node.hidden = true;
    node.textContent = "";
    return;
  }
  const e = asError(error);
  node.textContent = errorText(e);
  node.hidden = false;
  if (e instanceof ApiError && e.status === 401) needToken("The token was not accepted; enter it again.");
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
    status(`Loaded ${table.name}. Check the roles, then run a sweep.`);
    await measureTableRisk();
  } catch (e) {
    showError("load-error", e);
    status(`The table was not loaded: ${errorText(e)}`);
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
  const body = { name: file.name, csv: await file.text(), hierarchies };
  if ($("upload-delimiter").value) body.delimiter = $("upload-delimiter").value;
  await loadTable(body);
}

function setTable(table, restored = null) {
  stopSweep();
  state.table = table;
  const suggested = parseJob(table.job || "");
  const input = suggested.input || (table.files && table.files[0]) || table.name;
  const choices = { input, delimiter: suggested.delimiter, columns: restored || proposedRoles(table, suggested) };
  state.choices = choices;
  // Every hierarchy file of the table is offered for every column: assigned by choice, not by name.
  const hierarchyFiles = (table.files || []).filter((f) => f !== input);
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
    const options = new Set([...(c.hierarchies || []), ...hierarchyFiles]);
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
        el("td", {}, el("button", { type: "button", class: "link", id: `build-${i}`, "aria-label": `Build a hierarchy for ${c.name}`, onclick: () => openBuilder(c) }, "Build…")),
      ),
    );
  });
  show("builder", false);
  const workload = $("workload-attribute");
  workload.replaceChildren(el("option", { value: "" }, "none"));
  for (const c of table.columns) workload.append(el("option", { value: c.name }, c.name));
  $("progress").max = 1;
  $("progress").value = 0;
  $("progress-text").textContent = "";
  showError("sweep-error", null);
  show("table-info");
  show("step-sweep");
  show("step-frontier", false);
  show("step-release", false);
  if (!state.tableRisk || state.tableRisk.table !== table.table) clearTableRisk();
  refreshJob();
}

/** Forgets the sweep and release shown (a new table starts clean). */
function stopSweep() {
  if (comparison) comparison.clear();
  if (state.poll) clearTimeout(state.poll);
  state.poll = null;
  state.sweep = null;
  state.release = null;
  delete document.body.dataset.sweep;
  delete document.body.dataset.release;
  showOutcome(null);
}

// ------------------------------------------------------------------------------------------------
// The hierarchy builder
// ------------------------------------------------------------------------------------------------

const builder = { column: null, values: [], lines: null, text: null };

/** Opens the builder for `column`: fetches its distinct values, picks the kind that fits it. */
async function openBuilder(column) {
  showError("builder-error", null);
  builder.column = column;
  builder.lines = null;
  builder.text = null;
  $("builder-title").textContent = `Build a hierarchy for ${column.name}`;
  $("builder-table").querySelector("tbody").replaceChildren();
  $("builder-use").disabled = true;
  $("builder-download").disabled = true;
  show("builder");
  $("builder").scrollIntoView({ block: "nearest" });
  try {
    const r = await api(`/api/v1/tables/${state.table.table}/columns/${encodeURIComponent(column.name)}/values`);
    builder.values = r.values.map((v) => v.value);
  } catch (e) {
    showError("builder-error", e);
    return;
  }
  $("builder-mode").value = column.kind === "numeric" ? "intervals" : "groups";
  const longest = Math.max(1, ...builder.values.map((v) => v.length));
  $("builder-mask-levels").max = String(longest);
  $("builder-mask-levels").value = String(Math.min(longest, Math.max(1, longest - 1)));
  if (column.kind === "numeric") {
    const numbers = builder.values.map(Number);
    const span = Math.max(...numbers) - Math.min(...numbers);
    const width = span > 0 ? 10 ** Math.floor(Math.log10(span / 4)) : 1;
    $("builder-width").value = String(width);
  }
  $("builder-note").textContent = `${column.name}: ${builder.values.length} distinct values.`;
  builderMode();
  previewHierarchy();
}

function builderMode() {
  const mode = $("builder-mode").value;
  for (const [cls, m] of [["builder-intervals", "intervals"], ["builder-mask", "mask"], ["builder-groups", "groups"]]) {
    for (const node of document.getElementsByClassName(cls)) node.hidden = mode !== m;
  }
}

/** Builds the hierarchy of the builder's settings and previews its first lines. */
function previewHierarchy(event) {
  if (event) event.preventDefault();
  showError("builder-error", null);
  builder.lines = null;
  builder.text = null;
  $("builder-use").disabled = true;
  $("builder-download").disabled = true;
  let lines;
  let note = `${builder.column.name}: ${builder.values.length} distinct values.`;
  try {
    const mode = $("builder-mode").value;
    if (mode === "intervals") {
      lines = intervalHierarchy(builder.values, Number($("builder-width").value), Number($("builder-fanout").value), Number($("builder-levels").value));
    } else if (mode === "mask") {
      lines = maskHierarchy(builder.values, Number($("builder-mask-levels").value));
    } else {
      const g = groupHierarchy(builder.values, $("builder-groups").value);
      lines = g.lines;
      if (g.other.length) note += ` ${g.other.length} values are in no group and go to "other".`;
    }
    builder.text = hierarchyText(lines);
  } catch (e) {
    showError("builder-error", e);
    return;
  }
  builder.lines = lines;
  $("builder-note").textContent = note;
  $("builder-table").querySelector("tbody").replaceChildren(...lines.slice(0, 20).map((l) => el("tr", {}, ...l.map((x) => el("td", {}, x)))));
  $("builder-use").disabled = false;
  $("builder-download").disabled = false;
}

/** Adds the built hierarchy to the table and assigns it to the column (a quasi-identifier). */
async function useHierarchy() {
  if (!builder.text) return;
  const column = builder.column;
  const path = `hierarchies/${column.name}-built.csv`;
  let table;
  try {
    table = await api(`/api/v1/tables/${state.table.table}/hierarchies`, { method: "POST", body: { path, text: builder.text, column: column.name } });
  } catch (e) {
    showError("builder-error", e);
    return;
  }
  const roles = state.choices.columns;
  roles.set(column.name, { role: "quasi", hierarchy: path });
  setTable(table, roles);
  status(`Added ${path} to the table and assigned it to ${column.name}.`);
}

function downloadHierarchy() {
  if (!builder.text) return;
  saveBlob(new Blob([builder.text], { type: "text/csv" }), `${builder.column.name}.csv`);
  status(`Saved ${builder.column.name}.csv (ARX's format): name it as a hierarchy in a cloakd table job.`);
}

// ------------------------------------------------------------------------------------------------
// Step 1: the table's re-identification risk, before anonymization
// ------------------------------------------------------------------------------------------------

/** The sweep settings of the job the risk is measured with (the risk reads its roles only). */
const RISK_SWEEP = { k: [10], l: [], t: [], delta: [], t_distance: "js", methods: ["generalization"], algorithms: ["mondrian"], metric: "dm", max_suppression: 0, seed: 7, workload: null };

/** What the table's risk depends on: the quasi-identifiers chosen. */
function riskKey() {
  return state.table.columns
    .filter((c) => (state.choices.columns.get(c.name) || {}).role === "quasi")
    .map((c) => c.name)
    .join("\u0000");
}

function clearTableRisk() {
  state.tableRisk = null;
  showError("table-risk-error", null);
  show("table-risk-result", false);
  $("table-risk-figures").querySelector("tbody").replaceChildren();
  $("table-risk-note").textContent = "";
  $("table-risk").classList.remove("stale");
  delete document.body.dataset.tableRisk;
}

/** Says when the roles changed since the risk shown was measured (or what it still waits for). */
function markTableRisk() {
  if (!state.tableRisk) {
    if (document.body.dataset.tableRisk !== "waiting") return;
    const problem = checkChoices(state.table, state.choices);
    $("table-risk-note").textContent = problem ? `To measure the table's risk, ${problem}.` : "Measure the table's risk on these roles (the button above).";
    return;
  }
  const stale = state.tableRisk.key !== riskKey();
  $("table-risk").classList.toggle("stale", stale);
  document.body.dataset.tableRisk = stale ? "stale" : "measured";
  $("table-risk-note").textContent = stale
    ? "The quasi-identifiers changed since this was measured: measure again."
    : `Measured on ${state.tableRisk.quasi.join(", ")}.`;
}

/** Measures the loaded table's risk on the chosen quasi-identifiers (POST /api/v1/tables/{id}/risk). */
async function measureTableRisk(event) {
  if (event) event.preventDefault();
  if (!state.table) return;
  showError("table-risk-error", null);
  const problem = checkChoices(state.table, state.choices);
  if (problem) {
    $("table-risk-note").textContent = `To measure the table's risk, ${problem}.`;
    document.body.dataset.tableRisk = "waiting";
    return;
  }
  const body = { job: buildJob(state.table, state.choices, RISK_SWEEP) };
  const population = $("risk-population").value.trim();
  if (population) body.population = Number(population);
  if ($("risk-suda").value) body.suda_max_size = Number($("risk-suda").value);
  const key = riskKey();
  const table = state.table;
  $("risk-measure").disabled = true;
  $("table-risk-note").textContent = "Measuring the table's risk…";
  document.body.dataset.tableRisk = "measuring";
  try {
    const r = await api(`/api/v1/tables/${table.table}/risk`, { method: "POST", body });
    if (state.table !== table) return;
    state.tableRisk = { key, table: table.table, quasi: r.risk.quasi_identifiers };
    renderTableRisk(r);
    markTableRisk();
  } catch (e) {
    showError("table-risk-error", e);
    $("table-risk-note").textContent = "";
    document.body.dataset.tableRisk = "failed";
  } finally {
    $("risk-measure").disabled = false;
  }
}

/** A measure's value, or why there is none. */
function measured(m, pick) {
  if (!m) return "–";
  if (typeof m.unavailable === "string") return `unavailable: ${m.unavailable}`;
  return pick(m);
}

function pct(v) {
  return `${(100 * v).toFixed(2)} %`;
}

function renderTableRisk(r) {
  const risk = r.risk;
  const rows = [
    ["records", "records (outliers apart)", String(risk.records), risk.records],
    ["classes", "equivalence classes", String(risk.classes), risk.classes],
    ["highest", "prosecutor risk, highest", measured(risk.prosecutor, (p) => fmt(p.highest)), risk.prosecutor.highest],
    ["average", "prosecutor risk, average", measured(risk.prosecutor, (p) => fmt(p.average)), risk.prosecutor.average],
    ["at-risk", `records above the risk threshold ${fmt(risk.threshold)}`, measured(risk.prosecutor, (p) => pct(p.records_at_risk)), risk.prosecutor.records_at_risk],
    ["uniques", "sample uniques (records alone in their class)", measured(risk.sample_uniqueness, (u) => `${u.unique_records} (${pct(u.share)})`), risk.sample_uniqueness.unique_records],
    [
      "population",
      "population uniques (Dankar et al.'s model)",
      measured(risk.population_uniqueness, (u) =>
        u.dankar && typeof u.dankar.uniques === "number" ? `${fmt(u.dankar.uniques)} (${pct(u.dankar.share)}, ${u.dankar.model}) of ${fmt(u.population_size)}` : `unavailable: ${(u.dankar && u.dankar.unavailable) || "no model converged"}`,
      ),
      risk.population_uniqueness.population_size,
    ],
    ["suda", "SUDA: records with a minimal sample unique", measured(risk.suda, (s) => `${s.records_with_msu} (MSUs by size: ${s.msus_by_size.join(", ")})`), risk.suda.records_with_msu],
  ];
  $("table-risk-figures")
    .querySelector("tbody")
    .replaceChildren(
      ...rows.map(([key, label, text, value]) =>
        el("tr", { dataset: { key, value: typeof value === "number" ? String(value) : "" } }, el("th", { scope: "row" }, label), el("td", { class: "num" }, text)),
      ),
    );
  tableRiskChart.update(r.record_risk);
  show("table-risk-result");
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
  markTableRisk();
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
    renderFlags([]);
    return null;
  }
  const flags = sweepFlags(state.table, state.choices, request);
  renderFlags(flags);
  if (flags.some((f) => f.blocking)) $("run").disabled = true;
  const job = buildJob(state.table, state.choices, request);
  $("cli-command").textContent = cliCommand(request);
  state.job = job;
  return problem ? null : job;
}

/** Shows the flags beside the sweep form, each with its fix; marks the controls they concern. */
function renderFlags(flags) {
  for (const node of document.querySelectorAll("[data-flagged]")) {
    node.removeAttribute("data-flagged");
    node.removeAttribute("aria-invalid");
  }
  const list = $("sweep-flags");
  list.replaceChildren(
    ...flags.map((f) => {
      const control = $(f.control);
      if (control) {
        control.dataset.flagged = f.blocking ? "blocking" : "warning";
        control.setAttribute("aria-invalid", "true");
      }
      const item = el("li", { dataset: { flag: f.id }, class: f.blocking ? "blocking" : "" }, f.text);
      if (f.fix) {
        item.append(
          " ",
          el("button", { type: "button", class: "fix", dataset: { fix: f.id }, onclick: () => applyFix(f) }, f.fix.label),
        );
      }
      return item;
    }),
  );
  list.hidden = flags.length === 0;
}

/** Applies a flag's fix to the choices and the form, then rebuilds the job. */
function applyFix(flag) {
  const request = sweepRequest();
  flag.fix.apply(state.choices, request);
  state.table.columns.forEach((c, i) => {
    const choice = state.choices.columns.get(c.name);
    $(`role-${i}`).value = choice.role;
    const h = $(`hierarchy-${i}`);
    if (choice.hierarchy && ![...h.options].some((o) => o.value === choice.hierarchy)) h.append(el("option", { value: choice.hierarchy }, choice.hierarchy));
    h.value = choice.hierarchy;
  });
  $("sweep-k").value = request.k.join(",");
  $("sweep-l").value = request.l.join(",");
  refreshJob();
  status(`Applied: ${flag.fix.label}.`);
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
  state.sweeps.unshift({ id: started.sweep, table: state.table.name, tableId: state.table.table, request, state: "running", total: started.total, done: 0, points: 0 });
  renderSweeps();
  document.body.dataset.sweep = "running";
  $("progress").max = started.total;
  $("progress").value = 0;
  $("progress-text").textContent = `0 / ${started.total} releases`;
  $("cancel").disabled = false;
  $("releases").querySelector("tbody").replaceChildren();
  showOutcome(null);
  comparison.clear();
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
  const entry = state.sweeps.find((x) => x.id === sweep.id);
  if (entry) {
    Object.assign(entry, { state: s.state, total: s.total, done: s.done, points: s.points.length });
    renderSweeps();
  }
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
  const outcome = sweepOutcome(s);
  showOutcome(outcome);
  if (s.state === "failed") showError("sweep-error", s.error || "the sweep failed");
  status(outcome ? outcome.text : `Sweep ${sweep.id} ${s.state}: ${s.points.length} releases measured. Pick one in the chart or the list.`);
}

/** The sweeps run since the page was opened, newest first; each can be shown again. */
function renderSweeps() {
  const body = $("sweeps").querySelector("tbody");
  body.replaceChildren(
    ...state.sweeps.map((x) => {
      const r = x.request;
      const models = ["k", "l", "t", "delta"].filter((m) => r[m].length).map((m) => `${m} ${r[m].join(",")}`).join("; ");
      const current = state.sweep && state.sweep.id === x.id;
      return el(
        "tr",
        { dataset: { sweep: x.id }, class: current ? "selected" : "" },
        el("td", {}, el("button", { type: "button", class: "link", disabled: current || x.tableId !== (state.table && state.table.table), onclick: () => showSweep(x) }, x.id.slice(0, 8))),
        el("td", {}, x.table),
        el("td", {}, models || "–"),
        el("td", {}, `${r.methods.join(", ")} · ${r.algorithms.join(", ")}`),
        el("td", {}, x.state),
        el("td", { class: "num" }, `${x.points} / ${x.total}`),
      );
    }),
  );
  show("sweeps-box", state.sweeps.length > 0);
}

/** Shows an earlier sweep of this table again: its points, releases and outcome. */
function showSweep(entry) {
  if (state.poll) clearTimeout(state.poll);
  state.sweep = { id: entry.id, total: entry.total, request: entry.request, points: [], state: "running" };
  state.release = null;
  $("releases").querySelector("tbody").replaceChildren();
  showOutcome(null);
  comparison.clear();
  show("step-frontier");
  show("step-release", false);
  renderSweeps();
  status(`Sweep ${entry.id.slice(0, 8)}…`);
  pollSweep();
}

/** What the finished sweep's results need said at their top (failure, nothing released), or null. */
function sweepOutcome(s) {
  const leftOut = s.left_out || [];
  if (s.state === "failed") {
    return { kind: "bad", text: `The sweep failed: ${errorText(s.error || "no reason given")}` };
  }
  if (s.points.length > 0) {
    if (leftOut.length === 0) return null;
    return { kind: "warn", text: `${s.points.length} releases measured; ${leftOut.length} left out (listed below the chart). Pick one in the chart or the list.` };
  }
  if (s.state === "cancelled") return { kind: "warn", text: "The sweep was cancelled before any release was measured." };
  const reasons = [...new Set(leftOut.map((x) => x.reason))];
  const why = reasons.length ? ` Why: ${reasons.slice(0, 3).join("; ")}${reasons.length > 3 ? "; …" : ""}.` : "";
  return { kind: "bad", text: `No release was produced: all ${s.total} were left out.${why} Change the settings flagged above the Run button and run again.` };
}

function showOutcome(outcome) {
  const node = $("sweep-outcome");
  node.hidden = !outcome;
  node.textContent = outcome ? outcome.text : "";
  node.className = outcome ? `outcome ${outcome.kind}` : "outcome";
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
  status("Saved job.toml: restore it after a reload (step 1), or run it with cloakd table frontier.");
}

/**
 * Restores a saved job onto the loaded table: each column's role and hierarchy (columns the job
 * does not list are dropped, as `unlisted = "drop"` says) and, from its `[sweep]`, every sweep setting.
 */
async function restoreJob(event) {
  event.preventDefault();
  showError("restore-error", null);
  const file = $("restore-job").files[0];
  if (!file) return showError("restore-error", new Error("choose a job file (.toml) saved by the workbench"));
  const job = parseJob(await file.text());
  if (job.columns.size === 0) return showError("restore-error", new Error(`${file.name} has no [columns]: it is not a job file`));
  if (!state.table) return showError("restore-error", new Error(`load the table first (${job.input || "the job's input"}), then restore the job onto it`));
  if (job.input && job.input !== state.choices.input) {
    return showError("restore-error", new Error(`this job is for ${job.input}, but ${state.choices.input} is loaded: load ${job.input} first, then restore`));
  }
  const unknown = [...job.columns.keys()].filter((name) => !state.table.columns.some((c) => c.name === name));
  if (unknown.length) return showError("restore-error", new Error(`the job names columns this table lacks: ${unknown.join(", ")}`));
  const roles = new Map();
  for (const c of state.table.columns) {
    const spec = job.columns.get(c.name);
    const role = spec ? (spec.role === "identifier" ? "drop" : spec.role) : "drop";
    roles.set(c.name, { role, hierarchy: (spec && spec.hierarchy) || "" });
  }
  setTable(state.table, roles);
  if (job.delimiter) state.choices.delimiter = job.delimiter;
  const sw = job.sweep || {};
  for (const key of ["k", "l", "t", "delta"]) if (Array.isArray(sw[key])) $(`sweep-${key}`).value = sw[key].join(",");
  if (sw.t_distance) $("sweep-t-distance").value = sw.t_distance;
  if (Array.isArray(sw.methods)) for (const m of ["generalization", "bucketization"]) $(`method-${m}`).checked = sw.methods.includes(m);
  if (Array.isArray(sw.algorithms)) for (const a of ["mondrian", "kaca", "ola"]) $(`algorithm-${a}`).checked = sw.algorithms.includes(a);
  if (sw.metric) $("sweep-metric").value = sw.metric;
  if (typeof sw.max_suppression === "number") $("sweep-suppression").value = String(sw.max_suppression);
  if (typeof sw.seed === "number") $("sweep-seed").value = String(sw.seed);
  const w = sw.workload;
  $("workload-attribute").value = w && w.attribute ? w.attribute : "";
  if (w && Array.isArray(w.classifiers)) for (const c of ["j48", "rf", "nb"]) $(`classifier-${c}`).checked = w.classifiers.includes(c);
  if (w && typeof w.folds === "number") $("workload-folds").value = String(w.folds);
  if (w && typeof w.seed === "number") $("workload-seed").value = String(w.seed);
  refreshJob();
  const files = new Set(state.table.files || []);
  const missing = [...roles.values()].filter((c) => c.role === "quasi" && c.hierarchy && !files.has(c.hierarchy)).map((c) => c.hierarchy);
  if (missing.length) {
    showError("restore-error", new Error(`restored, but this table lacks the hierarchies ${missing.join(", ")}: upload them with the table, or build them again (Build…)`));
  }
  document.body.dataset.restored = file.name;
  status(`Restored ${file.name}: roles${job.sweep ? " and sweep settings" : ""} applied to ${state.table.name}.`);
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
        el(
          "td",
          {},
          el("input", {
            type: "checkbox",
            class: "compare",
            dataset: { release: String(p.release) },
            "aria-label": `Compare release #${p.release}`,
            onchange: (e) => comparison.toggle(p, e.target.checked),
          }),
        ),
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
  frontierChart.select(n);
  liliChart.select(n);
  const sensitiveColumn = state.table && state.table.columns.find((c) => (state.choices.columns.get(c.name) || {}).role === "sensitive");
  renderReport(r.report, { sensitive: sensitiveColumn ? sensitiveColumn.name : undefined, rows: state.table ? state.table.rows : null, classSizes: r.class_sizes });
  histogramChart.update(r.class_sizes || []);
  renderRecordRisk(r.record_risk);
  $("class-pick").max = String(Math.max(0, r.classes - 1));
  $("class-pick").value = "0";
  renderPreview("preview", r.preview);
  const bucketized = r.method === "bucketization";
  show("download-sensitive", bucketized);
  show("sensitive-preview-box", bucketized);
  renderPreview("sensitive-preview", bucketized ? r.sensitive_preview : null);
  $("release-job").textContent = r.job;
  show("step-release");
  $("step-release").scrollIntoView({ block: "start" });
  status(`Release #${n} open.`);
  if (r.classes > 0) showClass(0);
}

/** The release's record-risk histogram and its riskiest classes (sizes only, never values). */
function renderRecordRisk(recordRisk) {
  riskChart.update(recordRisk);
  const rows = (recordRisk && recordRisk.riskiest_classes) || [];
  $("riskiest")
    .querySelector("tbody")
    .replaceChildren(
      ...rows.map((c) =>
        el(
          "tr",
          { dataset: { size: String(c.size), classes: String(c.classes), records: String(c.records) }, class: recordRisk && c.risk > recordRisk.threshold ? "at-risk" : "" },
          el("td", { class: "num" }, String(c.size)),
          el("td", { class: "num" }, String(c.classes)),
          el("td", { class: "num" }, String(c.records)),
          el("td", { class: "num" }, `${fmt(c.risk)} (1/${c.size})`),
        ),
      ),
    );
}

function scalar(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmt(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (Array.isArray(v)) return v.map(scalar).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function renderFindings(report, context) {
  const list = $("findings");
  list.replaceChildren(
    ...findings(report, context).map((f) =>
      el(
        "li",
        { class: `finding ${f.verdict}`, dataset: { finding: f.id, verdict: f.verdict } },
        el("strong", {}, `${f.title}: ${f.verdict === "ok" ? "no finding" : f.verdict === "warn" ? "worth a look" : "found"}. `),
        f.text,
        f.fix ? el("span", { class: "fix-text" }, ` What would remove it: ${f.fix}`) : null,
      ),
    ),
  );
}

function renderReport(report, context = {}) {
  renderFindings(report, context);
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

function renderPreview(id, preview) {
  const table = $(id);
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
  riskChart = new RiskChart($("risk-chart"));
  tableRiskChart = new RiskChart($("table-risk-chart"));
  classChart = new DistributionChart($("class-chart"));
  comparison = new Comparison(
    (n) => releasePath(n),
    () => (state.table ? state.table.columns.map((c) => c.name).filter((name) => (state.choices.columns.get(name) || {}).role !== "drop") : []),
  );
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken($("token").value.trim());
    $("token").value = "";
    $("auth-error").hidden = true;
    startSession();
  });
  $("upload-form").addEventListener("submit", uploadTable);
  $("risk-form").addEventListener("submit", measureTableRisk);
  $("sweep-form").addEventListener("submit", runSweep);
  $("sweep-form").addEventListener("input", refreshJob);
  $("sweep-form").addEventListener("change", refreshJob);
  $("cancel").addEventListener("click", cancelSweep);
  $("export-job").addEventListener("click", exportJob);
  $("restore-form").addEventListener("submit", restoreJob);
  $("builder-form").addEventListener("submit", previewHierarchy);
  $("builder-mode").addEventListener("change", () => {
    builderMode();
    previewHierarchy();
  });
  $("builder-use").addEventListener("click", useHierarchy);
  $("builder-download").addEventListener("click", downloadHierarchy);
  $("builder-close").addEventListener("click", () => show("builder", false));
  $("axis-x").addEventListener("change", drawFrontier);
  $("axis-y").addEventListener("change", drawFrontier);
  $("class-form").addEventListener("submit", (e) => {
    e.preventDefault();
    showClass(Number($("class-pick").value || 0));
  });
  $("download-csv").addEventListener("click", () => save("release.csv", "release.csv"));
  $("download-report").addEventListener("click", () => save("report.json", "report.json"));
  $("download-job").addEventListener("click", () => save("job.toml", "job.toml"));
  $("download-sensitive").addEventListener("click", () => save("sensitive.csv", "sensitive.csv"));
  startSession();
}

init();
