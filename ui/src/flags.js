// Settings the page can judge before Run: each flag names the control it concerns, says in words
// what would happen, and offers the fix when there is one. Pure: returns plain objects; the page
// shows them beside the sweep form and applies a fix through `fix`.

/**
 * The flags of the current choices and sweep request:
 * `{ id, control, text, blocking, fix: { label, apply(choices, request) } | null }`.
 * `blocking` flags make the sweep fail at once, so Run waits for them.
 */
export function sweepFlags(table, choices, request) {
  const flags = [];
  if (!table || !choices || !request) return flags;
  const columns = table.columns;
  const hierarchyFiles = (table.files || []).filter((f) => f !== choices.input);
  const wantsHierarchy = request.algorithms.filter((a) => a === "kaca" || a === "ola");
  if (wantsHierarchy.length > 0 && request.methods.includes("generalization")) {
    const names = wantsHierarchy.map((a) => a.toUpperCase()).join(" and ");
    for (const c of columns) {
      const choice = choices.columns.get(c.name);
      if (!choice || choice.role !== "quasi" || choice.hierarchy) continue;
      const own = (c.hierarchies && c.hierarchies[0]) || hierarchyFiles.find((f) => baseName(f) === c.name) || null;
      flags.push({
        id: `hierarchy-${c.name}`,
        control: `hierarchy-${columns.indexOf(c)}`,
        text: `${names} need a hierarchy for every quasi-identifier; ${c.name} has none, so their releases would be left out.`,
        blocking: false,
        fix: own ? { label: `Use ${own} for ${c.name}`, apply: (ch) => (ch.columns.get(c.name).hierarchy = own) } : null,
      });
    }
  }
  if (request.workload) {
    const attr = request.workload.attribute;
    const choice = choices.columns.get(attr);
    if (choice && choice.role === "drop") {
      flags.push({
        id: "workload-dropped",
        control: "workload-attribute",
        text: `The attribute to learn, ${attr}, is dropped from the release, so it cannot be learnt from it.`,
        blocking: true,
        fix: { label: `Keep ${attr} as insensitive`, apply: (ch) => (ch.columns.get(attr).role = "insensitive") },
      });
    }
  }
  const tooBig = request.k.filter((k) => k > table.rows);
  if (tooBig.length > 0) {
    flags.push({
      id: "k-above-rows",
      control: "sweep-k",
      text: `k = ${tooBig.join(", ")} ${tooBig.length > 1 ? "are" : "is"} more than the table's ${table.rows} rows: no release can have a class that large.`,
      blocking: false,
      fix: { label: `Remove k above ${table.rows}`, apply: (_ch, req) => (req.k = req.k.filter((k) => k <= table.rows)) },
    });
  }
  const sensitive = columns.find((c) => (choices.columns.get(c.name) || {}).role === "sensitive");
  if (sensitive) {
    const highL = request.l.filter((l) => l > sensitive.distinct);
    if (highL.length > 0) {
      flags.push({
        id: "l-above-values",
        control: "sweep-l",
        text: `l = ${highL.join(", ")} ${highL.length > 1 ? "are" : "is"} more than the ${sensitive.distinct} values ${sensitive.name} takes: no class can be that diverse.`,
        blocking: false,
        fix: { label: `Remove l above ${sensitive.distinct}`, apply: (_ch, req) => (req.l = req.l.filter((l) => l <= sensitive.distinct)) },
      });
    }
  }
  return flags;
}

function baseName(path) {
  const file = path.split("/").pop();
  return file.replace(/\.[^.]*$/, "");
}

/**
 * Roles for a table from the server's suggested job: its `[columns]` entries, else its proposals
 * (the commented entries of an upload's suggestion), with at most one sensitive column (the first
 * proposed; others become insensitive) and a categorical column unique on every row (an identifier)
 * dropped. Returns Map name -> { role, hierarchy }.
 */
export function proposedRoles(table, suggested) {
  const roles = new Map();
  let sensitiveTaken = false;
  for (const c of table.columns) {
    const s = suggested.columns.get(c.name) || suggested.proposals.get(c.name);
    let role = "drop";
    let hierarchy = "";
    if (s) {
      role = s.role === "identifier" ? "drop" : s.role || "drop";
      hierarchy = s.hierarchy || "";
    }
    if (!suggested.columns.has(c.name)) {
      if (c.kind !== "numeric" && table.rows > 1 && c.distinct >= table.rows) role = "drop";
      else if (role === "sensitive" && sensitiveTaken) role = "insensitive";
    }
    if (role === "sensitive") sensitiveTaken = true;
    if (!hierarchy && c.kind !== "numeric" && c.hierarchies && c.hierarchies.length) hierarchy = c.hierarchies[0];
    roles.set(c.name, { role, hierarchy });
  }
  return roles;
}
