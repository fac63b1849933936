//! C4.5's choice of a test at one node, as Weka 3.6's `C45ModelSelection` and `C45Split` make it:
//! information gain and gain ratio from class counts, nominal attributes split multiway, numeric ones
//! binary at a threshold chosen by information gain less the MDL correction `log2(candidates) / N`.
//!
//! Invariants: every quantity is computed from integer class counts in the same order of
//! floating-point operations as Weka's `EntropyBasedSplitCrit` (through [`Entropy`], a table of
//! Weka's `logFunc` over the counts), and compared with Weka's tolerances ([`gr`], [`eq`], ... at
//! 1e-6), so a tie between attributes or thresholds is broken where Weka breaks it: the first
//! attribute (in dataset order) whose gain ratio is more than 1e-6 above the others', the first
//! threshold whose gain is more than 1e-6 above the earlier ones'. A node's rows are seen as cells
//! ([`cell`]), one attribute at a time, in node order: a numeric attribute is scanned through a
//! per-node histogram over its distinct training values (or a sort of the node's cells when the node
//! has fewer rows than distinct values).

/// Weka's `Utils.SMALL`.
const SMALL: f64 = 1e-6;

/// `a > b` beyond Weka's tolerance.
pub fn gr(a: f64, b: f64) -> bool {
    a - b > SMALL
}

/// `a >= b` within Weka's tolerance.
pub fn gr_or_eq(a: f64, b: f64) -> bool {
    b - a < SMALL
}

/// `a < b` beyond Weka's tolerance.
pub fn sm(a: f64, b: f64) -> bool {
    b - a > SMALL
}

/// `a <= b` within Weka's tolerance.
pub fn sm_or_eq(a: f64, b: f64) -> bool {
    a - b < SMALL
}

/// `a == b` within Weka's tolerance.
pub fn eq(a: f64, b: f64) -> bool {
    a == b || ((a - b < SMALL) && (b - a < SMALL))
}

/// Weka's `logFunc(n) = n log2 n` (0 below 1e-6) for the counts `0..=rows`, tabulated.
pub struct Entropy {
    table: Vec<f64>,
}

impl Entropy {
    pub fn new(rows: usize) -> Entropy {
        let log2 = 2f64.ln();
        let table = (0..=rows)
            .map(|n| {
                let n = n as f64;
                if n < 1e-6 { 0.0 } else { n * n.ln() / log2 }
            })
            .collect();
        Entropy { table }
    }

    fn f(&self, count: u32) -> f64 {
        self.table[count as usize]
    }

    /// `oldEnt`: the entropy (times the total) of the class counts before a split.
    pub fn old_ent(&self, class_counts: &[u32], total: u32) -> f64 {
        let sum = class_counts.iter().fold(0.0, |s, &c| s + self.f(c));
        self.f(total) - sum
    }

    /// `newEnt`: the entropy (times the total) after a split into `bags` (row-major bag x class).
    fn new_ent(&self, bags: &[u32], bag_totals: &[u32], classes: usize) -> f64 {
        let mut value = 0.0;
        for (bag, &total) in bag_totals.iter().enumerate() {
            for &count in &bags[bag * classes..(bag + 1) * classes] {
                value += self.f(count);
            }
            value -= self.f(total);
        }
        -value
    }

    /// `InfoGainSplitCrit.splitCritValue` (no unknown values): the gain per row, 0 below 1e-6.
    pub fn info_gain(
        &self,
        old_ent: f64,
        bags: &[u32],
        bag_totals: &[u32],
        classes: usize,
        total: u32,
    ) -> f64 {
        let numerator = old_ent - self.new_ent(bags, bag_totals, classes);
        if eq(numerator, 0.0) {
            0.0
        } else {
            numerator / f64::from(total)
        }
    }

    /// `GainRatioSplitCrit.splitCritValue` for gain `gain` (0 for a trivial split).
    pub fn gain_ratio(&self, gain: f64, bag_totals: &[u32], total: u32) -> f64 {
        let mut split = 0.0;
        if gr(f64::from(total), 0.0) {
            for &bag in bag_totals {
                split -= self.f(bag);
            }
            split -= self.f(0);
            split += self.f(total);
        }
        if eq(split, 0.0) {
            return 0.0;
        }
        gain / (split / f64::from(total))
    }
}

/// The outcome of evaluating one attribute at one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub info_gain: f64,
    pub gain_ratio: f64,
    /// The threshold (numeric attributes; before Weka's `setSplitPoint`).
    pub split_point: f64,
}

/// The scratch buffers the evaluations at every node reuse.
#[derive(Default)]
pub struct Scratch {
    pub counts: Vec<u32>,
    pub totals: Vec<u32>,
    pub pairs: Vec<u64>,
    pub left: Vec<u32>,
    pub groups: Vec<(u32, usize)>,
    /// Four partial histograms (see [`histogram`]).
    pub wide: Vec<u32>,
    /// A numeric split's two bags.
    pub bags: Vec<u32>,
}

/// The number of each cell below `width` among `cells`, into `counts`. Consecutive equal cells
/// would make each increment wait for the last; a long run of cells is counted into four partial
/// histograms, summed at the end (whole numbers, so the counts are the same).
pub fn histogram(cells: &[u32], width: usize, counts: &mut Vec<u32>, wide: &mut Vec<u32>) {
    counts.clear();
    counts.resize(width, 0);
    if cells.len() < 8 * width.max(8) {
        for &cell in cells {
            counts[cell as usize] += 1;
        }
        return;
    }
    wide.clear();
    wide.resize(4 * width, 0);
    let (parts, rest) = wide.split_at_mut(3 * width);
    let (one, parts) = parts.split_at_mut(width);
    let (two, three) = parts.split_at_mut(width);
    let four = &mut rest[..width];
    let mut quads = cells.chunks_exact(4);
    for quad in &mut quads {
        one[quad[0] as usize] += 1;
        two[quad[1] as usize] += 1;
        three[quad[2] as usize] += 1;
        four[quad[3] as usize] += 1;
    }
    for &cell in quads.remainder() {
        one[cell as usize] += 1;
    }
    for (i, count) in counts.iter_mut().enumerate() {
        *count = one[i] + two[i] + three[i] + four[i];
    }
}

/// What an evaluation needs to know about the node.
pub struct NodeStats<'a> {
    pub class_counts: &'a [u32],
    pub total: u32,
    pub old_ent: f64,
    pub min_leaf: f64,
}

/// `C45Split.handleEnumeratedAttribute`: a multiway split on a nominal attribute with `values`
/// values; `None` unless at least two branches get `min_leaf` rows.
pub fn nominal(
    entropy: &Entropy,
    node: &NodeStats,
    cells: &[u32],
    values: usize,
    scratch: &mut Scratch,
) -> Option<Candidate> {
    let classes = node.class_counts.len();
    let counts = &mut scratch.counts;
    histogram(cells, values * classes, counts, &mut scratch.wide);
    let totals = &mut scratch.totals;
    totals.clear();
    totals.extend(
        counts
            .chunks_exact(classes)
            .map(|bag| bag.iter().sum::<u32>()),
    );
    let big = totals
        .iter()
        .filter(|&&t| gr_or_eq(f64::from(t), node.min_leaf))
        .count();
    if big <= 1 {
        return None;
    }
    let info_gain = entropy.info_gain(node.old_ent, counts, totals, classes, node.total);
    let gain_ratio = entropy.gain_ratio(info_gain, totals, node.total);
    Some(Candidate {
        info_gain,
        gain_ratio,
        split_point: f64::MAX,
    })
}

/// A row's cell in a value x class table: its value's code (nominal) or rank (numeric) times the
/// number of classes, plus its class. A node's rows are scanned as cells.
pub fn cell(value: u32, class: u32, classes: usize) -> u32 {
    value * classes as u32 + class
}

/// A numeric attribute's training values: distinct, ascending, and each row's rank among them.
pub struct NumericColumn {
    pub distinct: Vec<f64>,
    /// The rank of each dataset row's value in `distinct` (meaningful for training rows only).
    pub rank: Vec<u32>,
}

impl NumericColumn {
    pub fn new(values: &[f64], rows: &[u32]) -> NumericColumn {
        let mut order: Vec<u32> = rows.to_vec();
        order.sort_unstable_by(|&a, &b| values[a as usize].total_cmp(&values[b as usize]));
        let mut rank = vec![0u32; values.len()];
        let mut distinct: Vec<f64> = Vec::new();
        for &row in &order {
            let v = values[row as usize];
            if distinct.last() != Some(&v) {
                distinct.push(v);
            }
            rank[row as usize] = (distinct.len() - 1) as u32;
        }
        NumericColumn { distinct, rank }
    }

    /// Weka's `setSplitPoint`: the greatest training value not above `point` (within 1e-6).
    pub fn actual_split_point(&self, point: f64) -> f64 {
        let below = self.distinct.partition_point(|&v| sm_or_eq(v, point));
        if below == 0 {
            -f64::MAX
        } else {
            self.distinct[below - 1]
        }
    }
}

/// `C45Split.handleNumericAttribute`: the best binary split of a numeric attribute, its gain less
/// the MDL correction; `None` when no threshold leaves enough rows on both sides or the corrected
/// gain is not positive.
pub fn numeric(
    entropy: &Entropy,
    node: &NodeStats,
    cells: &[u32],
    column: &NumericColumn,
    scratch: &mut Scratch,
) -> Option<Candidate> {
    let classes = node.class_counts.len();
    let total = f64::from(node.total);
    let mut min_split = 0.1 * total / classes as f64;
    if sm_or_eq(min_split, node.min_leaf) {
        min_split = node.min_leaf;
    } else if gr(min_split, 25.0) {
        min_split = 25.0;
    }
    if sm(total, 2.0 * min_split) {
        return None;
    }
    // The node's (value, class) counts in value order: a histogram over the distinct training
    // values when they are few, else a sort of the node's (rank, class) pairs.
    let distinct = column.distinct.len();
    let Scratch {
        counts,
        pairs,
        left,
        groups,
        wide,
        bags,
        ..
    } = scratch;
    left.clear();
    left.resize(classes, 0);
    // (rank, offset of its class counts in `counts`), ascending.
    groups.clear();
    if distinct <= cells.len() * 2 {
        histogram(cells, distinct * classes, counts, wide);
        for r in 0..distinct {
            let group = &counts[r * classes..(r + 1) * classes];
            if group.iter().any(|&c| c > 0) {
                groups.push((r as u32, r * classes));
            }
        }
    } else {
        pairs.clear();
        pairs.extend(cells.iter().map(|&cell| u64::from(cell)));
        pairs.sort_unstable();
        counts.clear();
        let mut previous = u32::MAX;
        for &cell in pairs.iter() {
            let r = (cell / classes as u64) as u32;
            if r != previous {
                groups.push((r, counts.len()));
                counts.resize(counts.len() + classes, 0);
                previous = r;
            }
            let offset = groups.last().expect("pushed above").1;
            counts[offset + (cell % classes as u64) as usize] += 1;
        }
    }

    bags.clear();
    bags.resize(2 * classes, 0);
    let mut bag_totals = [0u32; 2];
    let mut left_total = 0u32;
    let mut best_gain = 0.0;
    let mut best: Option<usize> = None;
    let mut best_left_total = 0u32;
    let mut candidates = 0u32;
    for g in 0..groups.len().saturating_sub(1) {
        let (rank, offset) = groups[g];
        for (j, l) in left.iter_mut().enumerate() {
            *l += counts[offset + j];
            left_total += counts[offset + j];
        }
        let here = column.distinct[rank as usize];
        let next = column.distinct[groups[g + 1].0 as usize];
        if here + 1e-5 >= next {
            continue;
        }
        let right_total = node.total - left_total;
        if !(gr_or_eq(f64::from(left_total), min_split)
            && gr_or_eq(f64::from(right_total), min_split))
        {
            continue;
        }
        let (low, high) = bags.split_at_mut(classes);
        for (((l, h), &count), &all) in low
            .iter_mut()
            .zip(high)
            .zip(left.iter())
            .zip(node.class_counts)
        {
            *l = count;
            *h = all - count;
        }
        bag_totals[0] = left_total;
        bag_totals[1] = right_total;
        let gain = entropy.info_gain(node.old_ent, bags, &bag_totals, classes, node.total);
        if gr(gain, best_gain) {
            best_gain = gain;
            best = Some(g);
            best_left_total = left_total;
        }
        candidates += 1;
    }
    if candidates == 0 {
        return None;
    }
    let info_gain = best_gain - f64::from(candidates).ln() / 2f64.ln() / total;
    if sm_or_eq(info_gain, 0.0) {
        return None;
    }
    let g = best?;
    let low = column.distinct[groups[g].0 as usize];
    let high = column.distinct[groups[g + 1].0 as usize];
    let mut split_point = (high + low) / 2.0;
    if split_point == high {
        split_point = low;
    }
    let gain_ratio = entropy.gain_ratio(
        info_gain,
        &[best_left_total, node.total - best_left_total],
        node.total,
    );
    Some(Candidate {
        info_gain,
        gain_ratio,
        split_point,
    })
}
