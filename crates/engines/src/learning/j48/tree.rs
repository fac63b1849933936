//! Growing, collapsing and pruning the tree, as Weka 3.6's `C45PruneableClassifierTree` does:
//! grow with [`split`]'s choices until a node is pure or too small, `collapse` subtrees that do not
//! reduce the training errors, then prune bottom-up by the pessimistic error estimate
//! ([`stats::add_errs`]), replacing a subtree by a leaf or by its largest branch ("subtree raising",
//! which re-sorts the node's training rows through the raised branch).
//!
//! Invariants: nodes live in one arena (no deep recursive ownership, so dropping a deep tree cannot
//! overflow the stack); every node covers a range of one shared row buffer, its training rows
//! (Weka's `m_train`), and an operation only permutes rows within the range of the node it works
//! on, so a node's range always holds exactly its rows, in some order (nothing depends on the
//! order). A node's distribution is a bag x class count table: one bag for a leaf, one bag per
//! branch for a test.
use super::split::{
    self, Candidate, Entropy, NodeStats, NumericColumn, Scratch, cell, eq, gr, gr_or_eq, sm,
    sm_or_eq,
};
use super::stats::add_errs;
use crate::learning::Dataset;

/// The test at an inner node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Test {
    /// One branch per value of nominal attribute `attribute`.
    Nominal { attribute: usize, values: usize },
    /// Branch 0 for values `<= point` (within 1e-6), branch 1 for the others.
    Numeric { attribute: usize, point: f64 },
}

impl Test {
    pub fn branches(&self) -> usize {
        match self {
            Test::Nominal { values, .. } => *values,
            Test::Numeric { .. } => 2,
        }
    }

    /// Weka's `whichSubset`.
    pub fn branch(&self, data: &Dataset, row: u32) -> usize {
        match *self {
            Test::Nominal { attribute, .. } => data.nominal_codes(attribute)[row as usize] as usize,
            Test::Numeric { attribute, point } => usize::from(!sm_or_eq(
                data.numeric_values(attribute)[row as usize],
                point,
            )),
        }
    }

    /// [`Test::branch`] of each of `rows`, into `out`.
    fn branches_of(&self, data: &Dataset, rows: &[u32], out: &mut Vec<u32>) {
        out.clear();
        match *self {
            Test::Nominal { attribute, .. } => {
                let codes = data.nominal_codes(attribute);
                out.extend(rows.iter().map(|&r| codes[r as usize]));
            }
            Test::Numeric { attribute, point } => {
                let values = data.numeric_values(attribute);
                out.extend(
                    rows.iter()
                        .map(|&r| u32::from(!sm_or_eq(values[r as usize], point))),
                );
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    /// `None` for a leaf.
    pub test: Option<Test>,
    pub children: Vec<usize>,
    /// Bag x class counts.
    pub dist: Vec<u32>,
    pub lo: usize,
    pub hi: usize,
    /// Grown from no rows (Weka's `m_isEmpty`): its parent's branch distribution predicts.
    pub empty: bool,
}

/// An attribute as the learner sees it.
pub enum Column<'a> {
    Nominal {
        attribute: usize,
        codes: &'a [u32],
        values: usize,
    },
    Numeric {
        attribute: usize,
        column: NumericColumn,
    },
}

/// One fit in progress.
pub struct Grower<'a> {
    pub data: &'a Dataset,
    pub labels: &'a [u32],
    pub classes: usize,
    pub columns: Vec<Column<'a>>,
    pub min_leaf: f64,
    pub confidence: f64,
    /// Weka's `multiVal`: every attribute is nominal with at least 0.3 x N values.
    pub multi_val: bool,
    pub all_rows: f64,
    pub entropy: Entropy,
    pub rows: Vec<u32>,
    pub nodes: Vec<Node>,
    /// While growing: per column of `columns`, the cell ([`cell`]) of the row at each position of
    /// `rows`, in two buffers. A node at even depth finds its columns in buffer 0, at odd depth in
    /// buffer 1; splitting it moves its range, stably by branch, into the other buffer at the same
    /// positions, which no node still to be grown uses (their ranges are disjoint from it).
    cells: [Vec<u32>; 2],
    scratch: Scratch,
    buffer: Vec<u32>,
    moved: Vec<u32>,
    counts: Vec<u32>,
    /// While growing: per column, whether the node or an ancestor splits on it (nominal columns
    /// only). Such a column is neither evaluated nor moved below the split: its cells there are
    /// stale.
    fixed: Vec<bool>,
    candidates: Vec<Option<Candidate>>,
}

impl<'a> Grower<'a> {
    pub fn new(
        data: &'a Dataset,
        class: usize,
        rows: &[u32],
        min_leaf: f64,
        confidence: f64,
    ) -> Grower<'a> {
        let labels = data.nominal_codes(class);
        let all = rows.len();
        let columns: Vec<Column> = (0..data.attributes().len())
            .filter(|&a| a != class)
            .map(|a| {
                let attribute = data.attribute(a);
                if attribute.is_nominal() {
                    Column::Nominal {
                        attribute: a,
                        codes: data.nominal_codes(a),
                        values: attribute.values(),
                    }
                } else {
                    Column::Numeric {
                        attribute: a,
                        column: NumericColumn::new(data.numeric_values(a), rows),
                    }
                }
            })
            .collect();
        let width = columns.len();
        let mut cells = Vec::with_capacity(width * all);
        for column in &columns {
            match column {
                Column::Nominal { codes, .. } => cells.extend(rows.iter().map(|&r| {
                    cell(
                        codes[r as usize],
                        labels[r as usize],
                        data.attribute(class).values(),
                    )
                })),
                Column::Numeric { column, .. } => cells.extend(rows.iter().map(|&r| {
                    cell(
                        column.rank[r as usize],
                        labels[r as usize],
                        data.attribute(class).values(),
                    )
                })),
            }
        }
        let multi_val = columns.iter().all(|c| match c {
            Column::Nominal { values, .. } => !sm(*values as f64, 0.3 * all as f64),
            Column::Numeric { .. } => false,
        });
        Grower {
            data,
            labels,
            classes: data.attribute(class).values(),
            columns,
            min_leaf,
            confidence,
            multi_val,
            all_rows: all as f64,
            entropy: Entropy::new(all),
            rows: rows.to_vec(),
            nodes: Vec::new(),
            cells: {
                let other = vec![0; cells.len()];
                [cells, other]
            },
            scratch: Scratch::default(),
            buffer: Vec::new(),
            moved: Vec::new(),
            counts: Vec::new(),
            fixed: vec![false; width],
            candidates: Vec::new(),
        }
    }

    /// The class counts of the rows in `lo..hi`.
    fn class_counts(&self, lo: usize, hi: usize) -> Vec<u32> {
        let mut counts = vec![0u32; self.classes];
        for &row in &self.rows[lo..hi] {
            counts[self.labels[row as usize] as usize] += 1;
        }
        counts
    }

    /// Sorts the rows in `lo..hi` by branch of `test` (stably) and returns the branch bounds and
    /// the bag x class counts.
    fn partition(&mut self, test: &Test, lo: usize, hi: usize) -> (Vec<usize>, Vec<u32>) {
        test.branches_of(self.data, &self.rows[lo..hi], &mut self.buffer);
        self.place(test.branches(), lo, hi)
    }

    /// Sorts the rows in `lo..hi` (stably) by their branches, in `buffer`, and returns the branch
    /// bounds and the bag x class counts; `buffer` is left holding each row's new position in the
    /// range.
    fn place(&mut self, branches: usize, lo: usize, hi: usize) -> (Vec<usize>, Vec<u32>) {
        let classes = self.classes;
        let mut dist = vec![0u32; branches * classes];
        let mut starts = vec![0usize; branches + 1];
        for (&b, &row) in self.buffer.iter().zip(&self.rows[lo..hi]) {
            starts[b as usize + 1] += 1;
            dist[b as usize * classes + self.labels[row as usize] as usize] += 1;
        }
        for b in 0..branches {
            starts[b + 1] += starts[b];
        }
        let mut next: Vec<usize> = starts[..branches].to_vec();
        for b in self.buffer.iter_mut() {
            let slot = &mut next[*b as usize];
            *b = *slot as u32;
            *slot += 1;
        }
        self.moved.clear();
        self.moved.resize(hi - lo, 0);
        for (&p, &row) in self.buffer.iter().zip(&self.rows[lo..hi]) {
            self.moved[p as usize] = row;
        }
        self.rows[lo..hi].copy_from_slice(&self.moved);
        let bounds = starts.iter().map(|s| lo + s).collect();
        (bounds, dist)
    }

    /// `C45ModelSelection.selectModel`: the test for the rows in `lo..hi`, if any.
    fn select(
        &mut self,
        lo: usize,
        hi: usize,
        parity: usize,
        class_counts: &[u32],
    ) -> Option<(Test, usize)> {
        let total = (hi - lo) as u32;
        let max = class_counts.iter().copied().max().unwrap_or(0);
        if sm(f64::from(total), 2.0 * self.min_leaf) || eq(f64::from(total), f64::from(max)) {
            return None;
        }
        let node = NodeStats {
            class_counts,
            total,
            old_ent: self.entropy.old_ent(class_counts, total),
            min_leaf: self.min_leaf,
        };
        let n = self.rows.len();
        self.candidates.clear();
        let mut sum = 0.0;
        let mut valid = 0usize;
        for (j, column) in self.columns.iter().enumerate() {
            let cells = &self.cells[parity][j * n + lo..j * n + hi];
            let candidate = match column {
                // An ancestor splits on it: every row has the same value, no two branches get rows.
                Column::Nominal { .. } if self.fixed[j] => None,
                Column::Nominal { values, .. } => {
                    split::nominal(&self.entropy, &node, cells, *values, &mut self.scratch)
                }
                Column::Numeric { column, .. } => {
                    split::numeric(&self.entropy, &node, cells, column, &mut self.scratch)
                }
            };
            if let Some(c) = candidate {
                let counts = match column {
                    Column::Numeric { .. } => true,
                    Column::Nominal { values, .. } => {
                        self.multi_val || sm(*values as f64, 0.3 * self.all_rows)
                    }
                };
                if counts {
                    sum += c.info_gain;
                    valid += 1;
                }
            }
            self.candidates.push(candidate);
        }
        if valid == 0 {
            return None;
        }
        let average = sum / valid as f64;
        let mut best: Option<usize> = None;
        let mut best_ratio = 0.0;
        for (i, candidate) in self.candidates.iter().enumerate() {
            let Some(c) = candidate else { continue };
            if c.info_gain >= average - 1e-3 && gr(c.gain_ratio, best_ratio) {
                best = Some(i);
                best_ratio = c.gain_ratio;
            }
        }
        if eq(best_ratio, 0.0) {
            return None;
        }
        let i = best?;
        let candidate = self.candidates[i].expect("the best is a candidate");
        let test = match &self.columns[i] {
            Column::Nominal {
                attribute, values, ..
            } => Test::Nominal {
                attribute: *attribute,
                values: *values,
            },
            Column::Numeric { attribute, column } => Test::Numeric {
                attribute: *attribute,
                point: column.actual_split_point(candidate.split_point),
            },
        };
        Some((test, i))
    }

    /// [`Grower::partition`] while growing, by the cells of column `j` (the test's) in buffer
    /// `parity`, every column's range moved into the other buffer alike.
    fn split_rows(
        &mut self,
        test: &Test,
        j: usize,
        lo: usize,
        hi: usize,
        parity: usize,
    ) -> (Vec<usize>, Vec<u32>) {
        let n = self.rows.len();
        let classes = self.classes;
        let cells = &self.cells[parity][j * n + lo..j * n + hi];
        self.buffer.clear();
        match (test, &self.columns[j]) {
            (Test::Numeric { point, .. }, Column::Numeric { column, .. }) => {
                self.buffer.extend(cells.iter().map(|&c| {
                    let value = column.distinct[c as usize / classes];
                    u32::from(!sm_or_eq(value, *point))
                }))
            }
            _ => self
                .buffer
                .extend(cells.iter().map(|&c| c / classes as u32)),
        }
        let (bounds, dist) = self.place(test.branches(), lo, hi);
        let [zero, one] = &mut self.cells;
        let (from, to) = if parity == 0 {
            (&*zero, one)
        } else {
            (&*one, zero)
        };
        for column in 0..self.columns.len() {
            if self.fixed[column] {
                continue;
            }
            let offset = column * n + lo;
            let to = &mut to[offset..offset + (hi - lo)];
            for (&p, &c) in self.buffer.iter().zip(&from[offset..offset + (hi - lo)]) {
                to[p as usize] = c;
            }
        }
        (bounds, dist)
    }

    /// Grows the tree over the rows in `lo..hi` (`buildTree`) and returns its root.
    pub fn grow(&mut self, lo: usize, hi: usize) -> usize {
        let class_counts = self.class_counts(lo, hi);
        let root = self.grow_at(lo, hi, 0, class_counts);
        self.cells = [Vec::new(), Vec::new()];
        root
    }

    /// [`Grower::grow`] for a node whose columns are in buffer `parity` and whose rows have the
    /// class counts `class_counts`.
    fn grow_at(&mut self, lo: usize, hi: usize, parity: usize, class_counts: Vec<u32>) -> usize {
        let id = self.nodes.len();
        self.nodes.push(Node {
            test: None,
            children: Vec::new(),
            dist: class_counts.clone(),
            lo,
            hi,
            empty: hi == lo,
        });
        if let Some((test, j)) = self.select(lo, hi, parity, &class_counts) {
            let was_fixed =
                std::mem::replace(&mut self.fixed[j], matches!(test, Test::Nominal { .. }));
            let (bounds, dist) = self.split_rows(&test, j, lo, hi, parity);
            let children = (0..test.branches())
                .map(|b| {
                    let counts = dist[b * self.classes..(b + 1) * self.classes].to_vec();
                    self.grow_at(bounds[b], bounds[b + 1], 1 - parity, counts)
                })
                .collect();
            self.fixed[j] = was_fixed;
            let node = &mut self.nodes[id];
            node.test = Some(test);
            node.dist = dist;
            node.children = children;
        }
        id
    }

    /// `numIncorrect` of a bag x class table: its rows not of its (first) majority class.
    fn incorrect(&self, dist: &[u32]) -> (f64, f64) {
        let classes = self.classes;
        let mut total = 0u32;
        let mut best = 0u32;
        for j in 0..classes {
            let c: u32 = dist.iter().skip(j).step_by(classes).sum();
            total += c;
            if gr(f64::from(c), f64::from(best)) {
                best = c;
            }
        }
        (f64::from(total), f64::from(total - best))
    }

    /// The training errors of every node's subtree (its leaves' errors, summed), into `errors`.
    fn training_errors(&self, id: usize, errors: &mut [f64]) {
        let node = &self.nodes[id];
        errors[id] = if node.test.is_none() {
            self.incorrect(&node.dist).1
        } else {
            for &c in &node.children {
                self.training_errors(c, errors);
            }
            node.children.iter().map(|&c| errors[c]).sum()
        };
    }

    fn make_leaf(&mut self, id: usize) {
        let merged = merge(&self.nodes[id].dist, self.classes);
        let node = &mut self.nodes[id];
        node.test = None;
        node.children = Vec::new();
        node.dist = merged;
    }

    /// `collapse`: a subtree that does not make fewer training errors than its root becomes a leaf.
    /// Top-down, so a subtree's training errors are those of the grown tree when it is visited.
    pub fn collapse(&mut self, id: usize) {
        let mut errors = vec![0.0; self.nodes.len()];
        self.training_errors(id, &mut errors);
        self.collapse_by(id, &errors);
    }

    fn collapse_by(&mut self, id: usize, errors: &[f64]) {
        if self.nodes[id].test.is_none() {
            return;
        }
        let tree = self.incorrect(&self.nodes[id].dist).1;
        if errors[id] >= tree - 1e-3 {
            self.make_leaf(id);
        } else {
            for c in self.nodes[id].children.clone() {
                self.collapse_by(c, errors);
            }
        }
    }

    /// `getEstimatedErrorsForDistribution`.
    fn estimated_for(&self, dist: &[u32]) -> f64 {
        let (total, incorrect) = self.incorrect(dist);
        if eq(total, 0.0) {
            0.0
        } else {
            incorrect + add_errs(total, incorrect, self.confidence)
        }
    }

    /// `getEstimatedErrors`: the leaves' estimates, summed.
    fn estimated(&self, id: usize) -> f64 {
        let node = &self.nodes[id];
        if node.test.is_none() {
            self.estimated_for(&node.dist)
        } else {
            node.children.iter().map(|&c| self.estimated(c)).sum()
        }
    }

    /// `getEstimatedErrorsForBranch`: the estimate if the rows in `lo..hi` went down subtree `id`.
    fn estimated_for_branch(&mut self, id: usize, lo: usize, hi: usize) -> f64 {
        match self.nodes[id].test {
            None => {
                let mut counts = std::mem::take(&mut self.counts);
                counts.clear();
                counts.resize(self.classes, 0);
                for &row in &self.rows[lo..hi] {
                    counts[self.labels[row as usize] as usize] += 1;
                }
                let estimate = self.estimated_for(&counts);
                self.counts = counts;
                estimate
            }
            Some(test) => {
                let (bounds, _) = self.partition(&test, lo, hi);
                (0..test.branches())
                    .map(|b| {
                        let child = self.nodes[id].children[b];
                        self.estimated_for_branch(child, bounds[b], bounds[b + 1])
                    })
                    .sum()
            }
        }
    }

    /// `newDistribution`: subtree `id` re-learns its distributions from the rows in `lo..hi`.
    fn redistribute(&mut self, id: usize, lo: usize, hi: usize) {
        match self.nodes[id].test {
            None => {
                let counts = self.class_counts(lo, hi);
                let node = &mut self.nodes[id];
                node.dist = counts;
                node.lo = lo;
                node.hi = hi;
                if hi > lo {
                    node.empty = false;
                }
            }
            Some(test) => {
                let (bounds, dist) = self.partition(&test, lo, hi);
                let node = &mut self.nodes[id];
                node.dist = dist;
                node.lo = lo;
                node.hi = hi;
                let children = node.children.clone();
                for (b, c) in children.into_iter().enumerate() {
                    self.redistribute(c, bounds[b], bounds[b + 1]);
                }
            }
        }
    }

    /// `prune`: bottom-up, a subtree becomes a leaf or its largest branch where that is not
    /// estimated to err more (within 0.1 error).
    pub fn prune(&mut self, id: usize) {
        if self.nodes[id].test.is_none() {
            return;
        }
        for c in self.nodes[id].children.clone() {
            self.prune(c);
        }
        let largest = max_bag(&self.nodes[id].dist, self.classes);
        let (lo, hi) = (self.nodes[id].lo, self.nodes[id].hi);
        let branch = self.nodes[id].children[largest];
        let errors_largest = self.estimated_for_branch(branch, lo, hi);
        let errors_leaf = self.estimated_for(&self.nodes[id].dist);
        let errors_tree = self.estimated(id);
        if sm_or_eq(errors_leaf, errors_tree + 0.1) && sm_or_eq(errors_leaf, errors_largest + 0.1) {
            self.make_leaf(id);
            return;
        }
        if sm_or_eq(errors_largest, errors_tree + 0.1) {
            let raised = self.nodes[branch].clone();
            let node = &mut self.nodes[id];
            node.test = raised.test;
            node.children = raised.children;
            node.dist = raised.dist;
            self.redistribute(id, lo, hi);
            self.prune(id);
        }
    }
}

/// The class totals of a bag x class table.
pub fn merge(dist: &[u32], classes: usize) -> Vec<u32> {
    let mut merged = vec![0u32; classes];
    for bag in dist.chunks(classes) {
        for (m, c) in merged.iter_mut().zip(bag) {
            *m += c;
        }
    }
    merged
}

/// `Distribution.maxBag`: the last of the bags with the most rows.
fn max_bag(dist: &[u32], classes: usize) -> usize {
    let mut max = 0.0;
    let mut index = 0;
    for (b, bag) in dist.chunks(classes).enumerate() {
        let total = f64::from(bag.iter().sum::<u32>());
        if gr_or_eq(total, max) {
            max = total;
            index = b;
        }
    }
    index
}
