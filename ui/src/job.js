// The job TOML the page builds from the analyst's choices (the format of examples/adult.toml and
// crates/engines/src/relational/job.rs), reading back the server's suggested job, and the equivalent CLI command.

const BARE_KEY = /^[A-Za-z0-9_-]+$/;

/** A TOML string (basic string, escaped). */
export function tomlString(s) {
  return `"${String(s).replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/[\u0000-\u001f\u007f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}"`;
}

function tomlKey(s) {
  return BARE_KEY.test(s) ? s : tomlString(s);
}

function unquote(s) {
  s = s.trim();
  if (s.startsWith('"') && s.endsWith('"')) {
    return s.slice(1, -1).replace(/\\u([0-9a-fA-F]{4})/g, (_, h) => String.fromCharCode(parseInt(h, 16))).replace(/\\(["\\])/g, "$1");
  }
  if (s.startsWith("'") && s.endsWith("'")) return s.slice(1, -1);
  return s;
}

/**
 * Reads what the page needs from a job in the format the server suggests: the top-level `input`
 * and `delimiter`, and each `[columns]` entry's role, kind and hierarchy (inline tables, one per line).
 * Entries commented out under `[columns]` (`# name = { role = ... }`, how the server proposes roles
 * for an upload) are read into `proposals`.
 */
export function parseJob(text) {
  const job = { input: null, delimiter: null, columns: new Map(), proposals: new Map(), sweep: null };
  let section = "";
  for (const raw of text.split(/\r?\n/)) {
    let line = raw.replace(/^\s+/, "");
    let proposal = false;
    if (section === "columns" && /^#\s*\S+\s*=\s*\{/.test(line)) {
      line = line.replace(/^#\s*/, "");
      proposal = true;
    }
    if (!line || line.startsWith("#")) continue;
    const header = line.match(/^\[([^\]]+)\]/);
    if (header) {
      section = header[1].trim();
      continue;
    }
    const kv = line.match(/^("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=\s*(.*)$/);
    if (!kv) continue;
    const key = unquote(kv[1]);
    const value = kv[2];
    if (section === "") {
      const s = value.match(/^("(?:[^"\\]|\\.)*"|'[^']*')/);
      if (s && key === "input") job.input = unquote(s[1]);
      if (s && key === "delimiter") job.delimiter = unquote(s[1]);
    } else if (section === "sweep" || section === "sweep.workload") {
      let parsed;
      try {
        parsed = JSON.parse(value.replace(/\s+#.*$/, ""));
      } catch {
        continue;
      }
      job.sweep = job.sweep || {};
      if (section === "sweep") job.sweep[key] = parsed;
      else (job.sweep.workload = job.sweep.workload || {})[key] = parsed;
    } else if (section === "columns") {
      const inline = value.match(/^\{(.*)\}/);
      if (!inline) continue;
      const spec = {};
      for (const m of inline[1].matchAll(/([A-Za-z_]+)\s*=\s*("(?:[^"\\]|\\.)*"|'[^']*')/g)) {
        spec[m[1]] = unquote(m[2]);
      }
      (proposal ? job.proposals : job.columns).set(key, spec);
    }
  }
  return job;
}

/** A comma-separated list of numbers; throws naming the field on a value that is not one. */
export function parseList(text, field) {
  const items = text.split(",").map((s) => s.trim()).filter((s) => s !== "");
  return items.map((s) => {
    const n = Number(s);
    if (!Number.isFinite(n)) throw new Error(`${field}: ${JSON.stringify(s)} is not a number`);
    return n;
  });
}

/**
 * The job TOML: `input` (and `delimiter`) from the table, `unlisted = "drop"`, one `[columns]` line per
 * column that is not dropped, `[privacy]` from the first value of the sweep's first listed model, and
 * `[release]` from its first method and algorithm and the seed: `cloakd table anonymize` on this job
 * yields the sweep's first release, and `cloakd table frontier` on it the whole sweep.
 */
export function buildJob(table, choices, sweep) {
  const lines = [];
  lines.push(`# Built by the cloakd workbench for table ${tomlString(table.name)} (${table.rows} rows).`);
  lines.push(`input = ${tomlString(choices.input)}`);
  if (choices.delimiter) lines.push(`delimiter = ${tomlString(choices.delimiter)}`);
  lines.push('unlisted = "drop"', "", "[columns]");
  for (const column of table.columns) {
    const c = choices.columns.get(column.name);
    if (!c || c.role === "drop") continue;
    const parts = [`role = ${tomlString(c.role)}`];
    if (c.role === "quasi") {
      if (c.hierarchy) parts.push(`hierarchy = ${tomlString(c.hierarchy)}`);
      else parts.push('kind = "numeric"');
    } else if (c.role === "sensitive" && column.kind === "numeric") {
      parts.push('kind = "numeric"');
    }
    lines.push(`${tomlKey(column.name)} = { ${parts.join(", ")} }`);
  }
  lines.push("", "[privacy]");
  const first = [
    ["k", sweep.k, (v) => String(Math.max(1, Math.round(v)))],
    ["l", sweep.l, (v) => tomlString(`probabilistic:${v}`)],
    ["t", sweep.t, (v) => tomlString(`${sweep.t_distance || "js"}:${v}`)],
    ["delta", sweep.delta, (v) => String(v)],
  ].find(([, values]) => values.length > 0);
  if (first) lines.push(`${first[0]} = ${first[2](first[1][0])}`);
  else lines.push("k = 10");
  lines.push("", "[release]");
  lines.push(`method = ${tomlString(sweep.methods[0] || "generalization")}`);
  lines.push(`algorithm = ${tomlString(sweep.algorithms[0] || "mondrian")}`);
  if ((sweep.algorithms[0] || "mondrian") === "ola") {
    lines.push(`metric = ${tomlString(sweep.metric)}`);
    lines.push(`max_suppression = ${sweep.max_suppression}`);
  }
  lines.push(`seed = ${sweep.seed}`);
  lines.push(...sweepSection(sweep));
  return `${lines.join("\n")}\n`;
}

/**
 * The job's `[sweep]` section: the sweep's settings, which `cloakd table frontier` reads as the
 * defaults of its flags and the page restores a project from.
 */
export function sweepSection(sweep) {
  const numbers = (values) => `[${values.map((v) => String(v)).join(", ")}]`;
  const strings = (values) => `[${values.map(tomlString).join(", ")}]`;
  const lines = ["", "[sweep]"];
  lines.push(`k = ${numbers(sweep.k)}`, `l = ${numbers(sweep.l)}`, `t = ${numbers(sweep.t)}`, `delta = ${numbers(sweep.delta)}`);
  lines.push(`t_distance = ${tomlString(sweep.t_distance || "js")}`);
  lines.push(`methods = ${strings(sweep.methods)}`, `algorithms = ${strings(sweep.algorithms)}`);
  lines.push(`metric = ${tomlString(sweep.metric)}`, `max_suppression = ${sweep.max_suppression}`, `seed = ${sweep.seed}`);
  if (sweep.workload) {
    lines.push("", "[sweep.workload]", `attribute = ${tomlString(sweep.workload.attribute)}`);
    lines.push(`classifiers = ${strings(sweep.workload.classifiers)}`, `folds = ${sweep.workload.folds}`, `seed = ${sweep.workload.seed}`);
  }
  return lines;
}

/** Which roles the job needs: exactly one sensitive column, a quasi-identifier, hierarchies. */
export function checkChoices(table, choices) {
  const roles = table.columns.map((c) => [c, choices.columns.get(c.name)]);
  const sensitive = roles.filter(([, c]) => c.role === "sensitive");
  if (sensitive.length !== 1) return `choose exactly one sensitive column (now ${sensitive.length})`;
  if (!roles.some(([, c]) => c.role === "quasi")) return "choose at least one quasi-identifier";
  for (const [column, c] of roles) {
    if (c.role === "quasi" && !c.hierarchy && column.kind !== "numeric") {
      return `column ${JSON.stringify(column.name)}: a categorical quasi-identifier needs a hierarchy`;
    }
  }
  return null;
}

/** `cloakd table frontier` with the flags of this sweep (an empty list is a bare flag). */
export function cliCommand(sweep, jobFile = "job.toml") {
  const list = (flag, values) => (values.length ? `--${flag} ${values.join(",")}` : `--${flag}`);
  const parts = [
    "cloakd table frontier",
    jobFile,
    "--out frontier",
    list("k", sweep.k),
    list("l", sweep.l),
    list("t", sweep.t),
    list("delta", sweep.delta),
    `--t-distance ${sweep.t_distance || "js"}`,
    `--methods ${sweep.methods.join(",")}`,
    `--algorithms ${sweep.algorithms.join(",")}`,
    `--metric ${sweep.metric}`,
    `--max-suppression ${sweep.max_suppression}`,
    `--seed ${sweep.seed}`,
  ];
  if (sweep.workload) {
    parts.push(
      `--workload ${sweep.workload.attribute}`,
      `--classifiers ${sweep.workload.classifiers.join(",")}`,
      `--folds ${sweep.workload.folds}`,
      `--learning-seed ${sweep.workload.seed}`,
    );
  }
  return parts.join(" ");
}
