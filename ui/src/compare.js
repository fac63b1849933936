// Two releases side by side: their measures and risk, their class-size histograms and, for a chosen
// attribute, its distribution in the input against each release (ARX's summary view).
import { api } from "./api.js";
import { DistributionCompareChart, HistogramChart, color, fmt } from "./charts.js";
import { $, el, show } from "./dom.js";
import { prosecutorFromSizes } from "./findings.js";

/** Release A's and release B's colour in every chart of the comparison. */
const SIDE_COLORS = [color(0), color(1)];

/** The rows of the measures table: label and how to read it from a point and its release. */
const ROWS = [
  ["model", (p) => `${p.model} ${p.parameter}`],
  ["method · algorithm", (p) => `${p.method} · ${p.algorithm}`],
  ["Ploss", (p) => fmt(p.ploss)],
  ["Uloss", (p) => fmt(p.uloss)],
  ["A_know", (p) => fmt(p.a_know)],
  ["A_acc", (p) => fmt(p.a_acc)],
  ["equivalence classes", (_p, r) => String(r.classes)],
  ["smallest class", (_p, r) => String(Math.min(...(r.class_sizes || []).map((c) => c.size)))],
  ["prosecutor risk, highest", (_p, r) => risk(r, "highest")],
  ["prosecutor risk, average", (_p, r) => risk(r, "average")],
  ["records above the risk threshold", (_p, r) => risk(r, "records_at_risk")],
  ["homogeneous classes (records)", (_p, r) => attack(r, (a) => a.homogeneity && `${a.homogeneity.classes} (${a.homogeneity.records})`)],
];

function risk(release, key) {
  const p = (release.report && release.report.risk && release.report.risk.prosecutor) || prosecutorFromSizes(release.class_sizes);
  return p && typeof p[key] === "number" ? fmt(p[key]) : "–";
}

function attack(release, read) {
  const a = release.report && release.report.attacks;
  return (a && read(a)) || "–";
}

export class Comparison {
  /** `releasePath(n)`: the API path of release n of the current sweep; `columns()`: kept columns. */
  constructor(releasePath, columns) {
    this.releasePath = releasePath;
    this.columns = columns;
    this.chosen = [];
    this.releases = new Map();
    this.histA = new HistogramChart($("compare-hist-a"));
    this.histB = new HistogramChart($("compare-hist-b"));
    this.dist = new DistributionCompareChart($("compare-dist"));
    $("compare-attribute").addEventListener("change", () => this.drawDistribution());
    $("compare-clear").addEventListener("click", () => this.clear());
  }

  /** Forgets the choice (a new sweep or table). */
  clear() {
    this.chosen = [];
    this.releases.clear();
    for (const box of document.querySelectorAll("#releases input.compare")) box.checked = false;
    show("step-compare", false);
  }

  /** Ticks or unticks release `p` (the oldest of three is dropped); with two, shows them. */
  async toggle(p, on) {
    this.chosen = this.chosen.filter((x) => x.release !== p.release);
    if (on) this.chosen.push(p);
    if (this.chosen.length > 2) this.chosen.shift();
    for (const box of document.querySelectorAll("#releases input.compare")) {
      box.checked = this.chosen.some((x) => String(x.release) === box.dataset.release);
    }
    if (this.chosen.length < 2) {
      show("step-compare", false);
      return;
    }
    show("step-compare");
    $("compare-error").hidden = true;
    try {
      for (const x of this.chosen) {
        if (!this.releases.has(x.release)) this.releases.set(x.release, await api(this.releasePath(x.release)));
      }
    } catch (e) {
      $("compare-error").textContent = `The releases could not be read: ${e.message}`;
      $("compare-error").hidden = false;
      return;
    }
    this.draw();
    $("step-compare").scrollIntoView({ block: "start" });
  }

  draw() {
    const [a, b] = this.chosen;
    const [ra, rb] = [this.releases.get(a.release), this.releases.get(b.release)];
    const name = (p) => `#${p.release}`;
    $("compare-head-a").textContent = name(a);
    $("compare-head-b").textContent = name(b);
    $("compare-measures").querySelector("tbody").replaceChildren(
      ...ROWS.map(([label, read]) =>
        el("tr", { dataset: { row: label } }, el("th", { scope: "row" }, label), el("td", { class: "num" }, read(a, ra)), el("td", { class: "num" }, read(b, rb))),
      ),
    );
    $("compare-caption-a").textContent = `Class sizes of release ${name(a)} (${a.model} ${a.parameter}, ${a.method}, ${a.algorithm})`;
    $("compare-caption-b").textContent = `Class sizes of release ${name(b)} (${b.model} ${b.parameter}, ${b.method}, ${b.algorithm})`;
    this.histA.update(ra.class_sizes || [], SIDE_COLORS[0]);
    this.histB.update(rb.class_sizes || [], SIDE_COLORS[1]);
    const select = $("compare-attribute");
    const current = select.value;
    select.replaceChildren(...this.columns().map((c) => el("option", { value: c, selected: c === current }, c)));
    this.drawDistribution();
  }

  async drawDistribution() {
    if (this.chosen.length < 2) return;
    const column = $("compare-attribute").value;
    if (!column) return;
    try {
      const [da, db] = await Promise.all(this.chosen.map((x) => api(`${this.releasePath(x.release)}/distribution/${encodeURIComponent(column)}`)));
      this.dist.update(column, da.input, [
        [`#${this.chosen[0].release}`, da.release, SIDE_COLORS[0]],
        [`#${this.chosen[1].release}`, db.release, SIDE_COLORS[1]],
      ]);
      document.body.dataset.compared = `${this.chosen[0].release},${this.chosen[1].release}:${column}`;
    } catch (e) {
      $("compare-error").textContent = `The distributions could not be read: ${e.message}`;
      $("compare-error").hidden = false;
    }
  }
}
