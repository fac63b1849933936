// The hierarchy builder: generalization hierarchies in ARX's format built from a column's distinct
// values, as ARX's interval, masking and grouping builders do. Pure: values in, lines out; the page
// previews them, downloads them and adds them to the table.

/**
 * Intervals for numeric values: level 1 cuts the line into intervals of `width` from the first
 * multiple of `width` at or below the smallest value, each further level joins `fanout` intervals
 * of the level below, up to `levels` levels; then `*`. Labels are `[lo, hi)`.
 */
export function intervalHierarchy(values, width, fanout, levels) {
  if (!(width > 0)) throw new Error("the interval width must be a number above 0");
  if (!(Number.isInteger(fanout) && fanout >= 2)) throw new Error("the fan-out must be a whole number of at least 2");
  if (!(Number.isInteger(levels) && levels >= 1 && levels <= 12)) throw new Error("the levels must be a whole number from 1 to 12");
  const numbers = values.map((v) => [v, Number(v)]);
  const bad = numbers.find(([, n]) => !Number.isFinite(n));
  if (bad) throw new Error(`${JSON.stringify(bad[0])} is not a number: build intervals only for a numeric column`);
  const base = Math.floor(Math.min(...numbers.map(([, n]) => n)) / width) * width;
  const label = (lo, hi) => `[${+lo.toPrecision(12)}, ${+hi.toPrecision(12)})`;
  return numbers.map(([raw, n]) => {
    const line = [raw];
    for (let i = 0; i < levels; i++) {
      const w = width * fanout ** i;
      const lo = base + Math.floor((n - base) / w) * w;
      line.push(label(lo, lo + w));
    }
    line.push("*");
    return line;
  });
}

/** Masking for codes such as ZIP: level i replaces the last i characters by `*`; then `*`. */
export function maskHierarchy(values, levels) {
  const longest = Math.max(...values.map((v) => v.length));
  if (!(Number.isInteger(levels) && levels >= 1 && levels <= longest)) throw new Error(`the levels must be a whole number from 1 to ${longest} (the longest value's length)`);
  return values.map((v) => {
    const line = [v];
    for (let i = 1; i <= levels; i++) {
      const kept = Math.max(0, v.length - i);
      line.push(v.slice(0, kept) + "*".repeat(v.length - kept));
    }
    line.push("*");
    return line;
  });
}

/**
 * Groups for categorical values: one group per line of `text`, `name: value, value, ...`; values no
 * line names go to the group `other`. Returns the lines and the values put in `other`.
 */
export function groupHierarchy(values, text) {
  const groupOf = new Map();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line) return;
    const colon = line.indexOf(":");
    if (colon <= 0) throw new Error(`line ${i + 1}: write a group as "name: value, value, ..."`);
    const group = line.slice(0, colon).trim();
    for (const v of line.slice(colon + 1).split(",").map((x) => x.trim()).filter(Boolean)) {
      if (groupOf.has(v) && groupOf.get(v) !== group) throw new Error(`line ${i + 1}: ${JSON.stringify(v)} is already in group ${JSON.stringify(groupOf.get(v))}`);
      groupOf.set(v, group);
    }
  });
  const other = values.filter((v) => !groupOf.has(v));
  return { lines: values.map((v) => [v, groupOf.get(v) || "other", "*"]), other };
}

/** The hierarchy file's text: `;` between levels, or `,` when a label holds a `;` (and none a `,`). */
export function hierarchyText(lines) {
  const has = (c) => lines.some((l) => l.some((x) => x.includes(c)));
  const sep = has(";") ? "," : ";";
  if (sep === "," && has(",")) throw new Error("values hold both ';' and ',': this hierarchy cannot be written in ARX's format");
  return `${lines.map((l) => l.join(sep)).join("\n")}\n`;
}
