// The workbench's charts, all drawn by Chart.js (bundled from npm): the frontier scatter, Li & Li's
// Uloss-against-Ploss view, Brickell & Shmatikov's A_acc beside U_san − U_base, the class-size histogram,
// the record-risk histogram and a class's sensitive distribution against the table's. Pure presentation: the points come from
// the API; only the Pareto set of the chosen axes is computed here (what the chart marks).
import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  ScatterController,
  Tooltip,
} from "chart.js";

Chart.register(ScatterController, LineController, BarController, PointElement, LineElement, BarElement, LinearScale, CategoryScale, Tooltip, Legend);
Chart.defaults.animation = false;
Chart.defaults.maintainAspectRatio = false;
Chart.defaults.font.family = "system-ui, 'DejaVu Sans', sans-serif";

const PALETTE = ["#1a5fb4", "#c64600", "#26a269", "#9141ac", "#a51d2d", "#986a44", "#3d9fd4", "#e5a50a", "#613583", "#2ec27e"];

export function color(i) {
  return PALETTE[i % PALETTE.length];
}

const STYLES = ["circle", "triangle", "rect", "rectRot", "star"];
const seriesLook = new Map();

/**
 * The colour and point style of a series, the same in every chart for the page's life: a series
 * (model · method · algorithm) keeps the look it was first given, and no two series share one.
 */
export function look(series) {
  if (!seriesLook.has(series)) {
    const i = seriesLook.size;
    seriesLook.set(series, { color: color(i), pointStyle: STYLES[Math.floor(i / PALETTE.length) % STYLES.length] });
  }
  return seriesLook.get(series);
}

/** A release's series name: the same key in the frontier chart and in Li & Li's view. */
export function seriesOf(p) {
  return `${p.model} · ${p.method} · ${p.algorithm}`;
}

/** Axis label of a point field. */
export const FIELD_LABELS = {
  ploss: "Ploss",
  a_know: "A_know",
  a_acc: "A_acc",
  risk_highest: "highest re-identification risk",
  risk_average: "average re-identification risk",
  uloss: "Uloss",
  whd: "WHD",
  dm: "DM",
  gain: "workload gain (U_san − U_base)",
};

/** Higher is better for the workload gain; lower for every loss. */
export function lowerIsBetter(field) {
  return field !== "gain";
}

/**
 * For each (x, y): whether no other point dominates it, that is is at least as good on both axes
 * (lower x; lower y, or higher y when `yLower` is false) and better on one. Equal points do not
 * dominate each other. Quadratic: a sweep has tens to hundreds of releases.
 */
export function paretoSet(points, yLower) {
  const yBetter = (a, b) => (yLower ? a.y < b.y : a.y > b.y);
  const dominates = (a, b) => a.x <= b.x && !yBetter(b, a) && (a.x < b.x || yBetter(a, b));
  return points.map((p) => !points.some((q) => q !== p && dominates(q, p)));
}

/** The ring drawn around the chosen release, the same in every chart. */
function chosenDataset(data) {
  return {
    label: "chosen release",
    data,
    borderColor: "#e66100",
    backgroundColor: "rgba(230,97,0,0.15)",
    borderWidth: 3,
    pointRadius: 11,
    pointHoverRadius: 12,
    pointStyle: "circle",
  };
}

function scatter(canvas, onPick) {
  return new Chart(canvas, {
    type: "scatter",
    data: { datasets: [] },
    options: {
      parsing: false,
      plugins: {
        legend: { position: "bottom", labels: { usePointStyle: true, boxWidth: 10, font: { size: 11 } } },
        tooltip: {
          callbacks: {
            label: (ctx) => {
              const d = ctx.raw;
              return d && d.label ? `${d.label}: (${fmt(d.x)}, ${fmt(d.y)})` : `(${fmt(ctx.parsed.x)}, ${fmt(ctx.parsed.y)})`;
            },
          },
        },
      },
      scales: { x: { title: { display: true, text: "" } }, y: { title: { display: true, text: "" } } },
      onClick: (_event, elements, chart) => {
        if (!onPick || elements.length === 0) return;
        const e = elements[0];
        const d = chart.data.datasets[e.datasetIndex].data[e.index];
        if (d && d.release !== undefined) onPick(d.release);
      },
    },
  });
}

export function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toFixed(4);
}

/** The frontier scatter: one series per algorithm and method, the Pareto set of the axes ringed. */
export class FrontierChart {
  constructor(canvas, onPick) {
    this.chart = scatter(canvas, onPick);
    this.chosen = null;
    this.placed = [];
  }

  /** Marks release `n` (or none) with the chosen-release ring. */
  select(n) {
    this.chosen = n;
    const ds = this.chart.data.datasets.find((d) => d.label === "chosen release");
    if (ds) ds.data = this.placed.filter((d) => d.release === n);
    this.chart.update("none");
  }

  update(points, xField, yField, value, label) {
    const series = new Map();
    const placed = [];
    for (const p of points) {
      const x = value(p, xField);
      const y = value(p, yField);
      if (x === null || y === null) continue;
      const key = seriesOf(p);
      if (!series.has(key)) series.set(key, []);
      const d = { x, y, release: p.release, label: label(p) };
      series.get(key).push(d);
      placed.push(d);
    }
    const efficient = paretoSet(placed, lowerIsBetter(yField));
    this.placed = placed;
    const datasets = [...series.entries()].map(([name, data]) => ({
      label: name,
      data,
      backgroundColor: look(name).color,
      borderColor: look(name).color,
      pointStyle: look(name).pointStyle,
      pointRadius: 4,
      pointHoverRadius: 6,
    }));
    datasets.push({
      label: "Pareto-efficient on these axes",
      data: placed.filter((_, i) => efficient[i]).sort((a, b) => a.x - b.x),
      showLine: true,
      borderDash: [6, 4],
      borderColor: "#000",
      backgroundColor: "rgba(0,0,0,0)",
      pointRadius: 8,
      pointBorderWidth: 2,
      pointHoverRadius: 9,
    });
    datasets.push(chosenDataset(placed.filter((d) => d.release === this.chosen)));
    this.chart.data.datasets = datasets;
    this.chart.options.scales.x.title.text = FIELD_LABELS[xField] || xField;
    this.chart.options.scales.y.title.text = FIELD_LABELS[yField] || yField;
    this.chart.update("none");
    return placed.length;
  }
}

/** Li & Li's view: Uloss against Ploss, one line per model, method and algorithm, efficient frontier dashed. */
export class LiLiChart {
  constructor(canvas, onPick) {
    this.chart = scatter(canvas, onPick);
    this.chart.options.scales.x.title.text = "Ploss";
    this.chart.options.scales.y.title.text = "Uloss";
    this.chosen = null;
    this.placed = [];
  }

  /** Marks release `n` (or none) with the chosen-release ring. */
  select(n) {
    this.chosen = n;
    const ds = this.chart.data.datasets.find((d) => d.label === "chosen release");
    if (ds) ds.data = this.placed.filter((d) => d.release === n);
    this.chart.update("none");
  }

  update(points, label) {
    const series = new Map();
    for (const p of points) {
      if (typeof p.ploss !== "number" || typeof p.uloss !== "number") continue;
      const key = seriesOf(p);
      if (!series.has(key)) series.set(key, []);
      series.get(key).push({ x: p.ploss, y: p.uloss, release: p.release, label: label(p), parameter: p.parameter });
    }
    this.placed = [...series.values()].flat();
    const datasets = [...series.entries()].map(([name, data]) => ({
      label: name,
      data: data.sort((a, b) => a.parameter - b.parameter),
      showLine: true,
      borderColor: look(name).color,
      backgroundColor: look(name).color,
      pointStyle: look(name).pointStyle,
      pointRadius: 3,
    }));
    datasets.push({
      label: "efficient frontier",
      data: points
        .filter((p) => p.efficient)
        .map((p) => ({ x: p.ploss, y: p.uloss, release: p.release, label: label(p) }))
        .sort((a, b) => a.x - b.x),
      showLine: true,
      borderDash: [6, 4],
      borderColor: "#000",
      backgroundColor: "rgba(0,0,0,0)",
      pointRadius: 0,
      pointHitRadius: 6,
    });
    datasets.push(chosenDataset(this.placed.filter((d) => d.release === this.chosen)));
    this.chart.data.datasets = datasets;
    this.chart.update("none");
  }
}

function bars(canvas, indexAxis = "x") {
  return new Chart(canvas, {
    type: "bar",
    data: { labels: [], datasets: [] },
    options: {
      indexAxis,
      plugins: { legend: { position: "bottom" } },
      scales: { x: { title: { display: true, text: "" } }, y: { title: { display: true, text: "" } } },
    },
  });
}

/** Brickell & Shmatikov's view: per release, the adversary's A_acc beside the researcher's gain. */
export class BrickellShmatikovChart {
  constructor(canvas) {
    this.chart = bars(canvas);
    this.chart.options.scales.y.title.text = "accuracy gain";
  }

  /** Returns whether any point carried a workload gain. */
  update(points, label, gain) {
    const shown = points.filter((p) => typeof p.a_acc === "number");
    const gains = shown.map((p) => gain(p));
    this.chart.data.labels = shown.map(label);
    this.chart.data.datasets = [{ label: "A_acc (adversary)", data: shown.map((p) => p.a_acc), backgroundColor: color(4) }];
    const any = gains.some((g) => g !== null);
    if (any) this.chart.data.datasets.push({ label: "U_san − U_base (researcher, best classifier)", data: gains, backgroundColor: color(2) });
    this.chart.update("none");
    return any;
  }
}

export class HistogramChart {
  constructor(canvas) {
    this.chart = bars(canvas);
    this.chart.options.scales.x.title.text = "class size (rows)";
    this.chart.options.scales.y.title.text = "classes";
    this.chart.options.plugins.legend.display = false;
  }

  /**
   * Class sizes on a linear axis: sizes are binned into at most 40 equal-width bins from the
   * smallest to the largest class, each bar the number of classes in its bin.
   */
  update(classSizes, fill = color(0)) {
    const bins = sizeBins(classSizes, 40);
    this.chart.data.labels = [];
    this.chart.data.datasets = [{ label: "classes", data: bins.map((b) => ({ x: b.mid, y: b.count })), backgroundColor: fill, barPercentage: 1, categoryPercentage: 1 }];
    const lo = bins.length ? bins[0].lo : 0;
    const hi = bins.length ? bins[bins.length - 1].hi : 1;
    this.chart.options.scales.x = { type: "linear", min: lo, max: hi, offset: false, title: { display: true, text: "class size (rows)" } };
    this.chart.update("none");
  }
}

/** A record-risk bin's label: its class sizes and the risk of its records (`1/3–1/4`). */
export function riskBinLabel(b) {
  const sizes = b.max_size === null ? `${b.min_size}+` : b.max_size === b.min_size ? `${b.min_size}` : `${b.min_size}–${b.max_size}`;
  const risk = b.max_size === null ? `≤1/${b.min_size}` : b.max_size === b.min_size ? `1/${b.min_size}` : `1/${b.min_size}–1/${b.max_size}`;
  return `${sizes} (${risk})`;
}

/**
 * The record-risk histogram (the API's `record_risk.bins`, computed by the daemon from the class
 * sizes): records per class-size bin, the bins whose records are above the risk threshold in red.
 */
export class RiskChart {
  constructor(canvas) {
    this.chart = bars(canvas);
    this.chart.options.scales.x.title.text = "class size (risk of each record = 1 / class size)";
    this.chart.options.scales.y.title.text = "records";
    this.chart.options.plugins.legend.display = false;
    this.canvas = canvas;
  }

  update(recordRisk) {
    const bins = (recordRisk && recordRisk.bins) || [];
    const threshold = recordRisk ? recordRisk.threshold : 0.2;
    this.chart.data.labels = bins.map(riskBinLabel);
    this.chart.data.datasets = [
      {
        label: "records",
        data: bins.map((b) => b.records),
        backgroundColor: bins.map((b) => (b.highest_risk > threshold ? "#a51d2d" : color(0))),
      },
    ];
    // What the chart shows, for a test or an assistive reader: records per bin.
    this.canvas.dataset.records = bins.map((b) => b.records).join(",");
    this.canvas.dataset.classes = bins.map((b) => b.classes).join(",");
    this.chart.update("none");
  }
}

/** Equal-width bins of class sizes (`{size, count}` pairs): `{lo, hi, mid, count}` each. */
export function sizeBins(classSizes, most) {
  if (classSizes.length === 0) return [];
  const sizes = classSizes.map((c) => c.size);
  const min = Math.min(...sizes);
  const max = Math.max(...sizes);
  const span = max - min + 1;
  const n = Math.max(1, Math.min(most, span));
  const width = span / n;
  const bins = Array.from({ length: n }, (_, i) => ({ lo: min - 0.5 + i * width, hi: min - 0.5 + (i + 1) * width, count: 0 }));
  for (const c of classSizes) bins[Math.min(n - 1, Math.floor((c.size - min) / width))].count += c.count;
  for (const b of bins) b.mid = (b.lo + b.hi) / 2;
  return bins;
}

/** A class's sensitive distribution (shares) against the table's. */
export class DistributionChart {
  constructor(canvas) {
    this.chart = bars(canvas, "y");
    this.chart.options.scales.x.title.text = "share of rows";
    this.chart.options.scales.y.ticks = { autoSkip: false };
  }

  update(sensitive) {
    const total = (m) => Object.values(m).reduce((a, b) => a + b, 0) || 1;
    const values = Object.keys(sensitive.table).sort((a, b) => sensitive.table[b] - sensitive.table[a]);
    for (const v of Object.keys(sensitive.class)) if (!values.includes(v)) values.push(v);
    const ct = total(sensitive.class);
    const tt = total(sensitive.table);
    this.chart.data.labels = values;
    this.chart.data.datasets = [
      { label: "this class", data: values.map((v) => (sensitive.class[v] || 0) / ct), backgroundColor: color(1) },
      { label: "whole table", data: values.map((v) => (sensitive.table[v] || 0) / tt), backgroundColor: color(0) },
    ];
    this.chart.options.scales.y.title.text = sensitive.attribute;
    this.chart.update("none");
  }
}

/**
 * One attribute's distribution (shares of rows) in the input against releases: `input` and each
 * release's side are `{values: [{value, count}], other}` (null when a release does not publish the
 * attribute). Labels: the input's values, then each release's (generalized values are labels of
 * their own, as in ARX's summary).
 */
export class DistributionCompareChart {
  constructor(canvas) {
    this.chart = bars(canvas, "y");
    this.chart.options.scales.x.title.text = "share of rows";
    this.chart.options.scales.y.ticks = { autoSkip: false };
  }

  update(attribute, input, releases) {
    const shares = (side) => {
      const m = new Map();
      if (!side) return m;
      const total = side.values.reduce((a, v) => a + v.count, side.other) || 1;
      for (const v of side.values) m.set(v.value, v.count / total);
      return m;
    };
    const sides = [["input", shares(input), "#77767b"], ...releases.map(([name, side, c]) => [name, shares(side), c])];
    // At most 24 labels: those with the largest share on any side, in the input's order first.
    const labels = [];
    for (const [, m] of sides) for (const v of m.keys()) if (!labels.includes(v)) labels.push(v);
    const top = (v) => Math.max(...sides.map(([, m]) => m.get(v) || 0));
    const keep = new Set([...labels].sort((a, b) => top(b) - top(a)).slice(0, 24));
    const shown = labels.filter((v) => keep.has(v));
    this.chart.data.labels = shown;
    this.chart.data.datasets = sides.map(([name, m, c]) => ({ label: name, data: shown.map((v) => m.get(v) || 0), backgroundColor: c }));
    this.chart.options.scales.y.title.text = attribute;
    this.chart.update("none");
  }
}
