// The release's model and attack checks read as findings: each with a verdict in words, the records
// it concerns and what would remove it. Built from the report's `models`, `attacks` and `risk`
// (see docs/workbench.md); pure: returns plain objects the page renders.

/**
 * Prosecutor risk from a release's class sizes (`[{size, count}]`: `count` classes of `size` records):
 * each record's risk is 1/|its class|; highest, average, and the share of records whose risk exceeds
 * `threshold` (0.2, the risk engine's default). What `report.risk.prosecutor` says when the report
 * carries it.
 */
export function prosecutorFromSizes(classSizes, threshold = 0.2) {
  const sizes = (classSizes || []).filter((c) => c.size > 0 && c.count > 0);
  if (sizes.length === 0) return null;
  const records = sizes.reduce((a, c) => a + c.size * c.count, 0);
  const classes = sizes.reduce((a, c) => a + c.count, 0);
  const atRisk = sizes.filter((c) => 1 / c.size > threshold).reduce((a, c) => a + c.size * c.count, 0);
  return { highest: 1 / Math.min(...sizes.map((c) => c.size)), average: classes / records, records_at_risk: atRisk / records };
}

const pct = (x) => `${(100 * x).toFixed(x < 0.01 && x > 0 ? 2 : 1)} %`;

/**
 * The findings of a report: `{ id, title, verdict: "ok" | "warn" | "bad", text, fix }`, worst first.
 * `sensitive` names the sensitive attribute (for the words), `rows` the release's rows.
 */
export function findings(report, { sensitive = "the sensitive attribute", rows = null, classSizes = null } = {}) {
  const out = [];
  if (!report) return out;
  for (const m of report.models || []) {
    const n = m.violating_classes || 0;
    out.push({
      id: `model-${m.model}`,
      title: `Privacy model ${m.model}`,
      verdict: n > 0 ? "bad" : "ok",
      text: n > 0 ? `Not met: ${n} classes violate it.` : "Met by every class of the release.",
      fix: n > 0 ? "Use a stricter parameter or another algorithm; a release that misses its model should not be published." : "",
    });
  }
  const a = report.attacks || {};
  const h = a.homogeneity;
  if (h) {
    const bad = h.classes > 0;
    out.push({
      id: "homogeneity",
      title: "Homogeneity attack",
      verdict: bad ? "bad" : "ok",
      text: bad
        ? `${h.classes} classes (${h.records} records, ${pct(h.share_of_records || 0)}) hold a single ${sensitive} value: anyone who can place a person in one of them learns that person's ${sensitive}.`
        : `Every class holds at least two ${sensitive} values: placing a person in a class does not disclose it.`,
      fix: bad ? "Add l-diversity (l >= 2) or t-closeness, or choose a release of those models." : "",
    });
  }
  const b = a.background_knowledge;
  if (b) {
    const certain = b.certain_classes > 0;
    const rise = typeof b.posterior === "number" && typeof b.prior === "number" ? ` An adversary's best guess rises from ${pct(b.prior)} to ${pct(b.posterior)} once they know one value a person does not have.` : "";
    out.push({
      id: "background",
      title: "Background-knowledge attack",
      verdict: certain ? "bad" : b.posterior >= 0.5 ? "warn" : "ok",
      text: certain
        ? `In ${b.certain_classes} classes (${b.certain_records} records) knowing one ${sensitive} value a person lacks reveals theirs.${rise}`
        : `No class becomes certain with one excluded value.${rise}`,
      fix: certain || b.posterior >= 0.5 ? "Raise l (l >= 3 leaves at least two candidates after one exclusion) or use delta-disclosure, which bounds this guess." : "",
    });
  }
  const u = a.unsorted_matching;
  if (u) {
    const bad = typeof u.p_value === "number" && u.p_value < 0.01;
    out.push({
      id: "unsorted",
      title: "Unsorted-matching attack",
      verdict: bad ? "bad" : "ok",
      text: bad
        ? `The release's row order follows the input's (${u.rows_at_input_position} rows at their input position, p = ${u.p_value.toPrecision(2)}): two releases can be joined by position.`
        : `The row order tells nothing about the input's (${u.rows_at_input_position} of ${u.rows} rows at their input position, as chance gives).`,
      fix: bad ? "Release with a fresh seed (rows are reordered from the seed and the content)." : "",
    });
  }
  const p = (report.risk && report.risk.prosecutor) || prosecutorFromSizes(classSizes || report.class_sizes);
  if (p) {
    const atRisk = typeof p.records_at_risk === "number" ? p.records_at_risk : null;
    const bad = typeof p.highest === "number" && p.highest > 0.5;
    const warn = atRisk !== null && atRisk > 0;
    out.push({
      id: "risk",
      title: "Re-identification risk (prosecutor)",
      verdict: bad ? "bad" : warn ? "warn" : "ok",
      text:
        `Highest ${pct(p.highest)}, average ${pct(p.average)}` +
        (atRisk !== null ? `; ${pct(atRisk)} of records above the risk threshold.` : ".") +
        (rows ? ` (${rows} rows)` : ""),
      fix: bad || warn ? "Raise k, or generalize the riskiest quasi-identifiers further." : "",
    });
  }
  const rank = { bad: 0, warn: 1, ok: 2 };
  return out.sort((x, y) => rank[x.verdict] - rank[y.verdict]);
}
