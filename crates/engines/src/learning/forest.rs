//! Random Forest as Weka 3.6's `weka.classifiers.trees.RandomForest` with its defaults: 10 bagged,
//! unpruned `RandomTree`s (bags of 100 % of the training rows drawn with replacement), each node
//! choosing among K random attributes with K = int(log2(number of attributes, the class counted)) +
//! 1, as 3.6 computes it; information gain; nominal attributes split multiway, numeric ones at the
//! midpoint between two successive distinct values; a node becomes a leaf below 2 instances (a
//! minimum of 1 per leaf), when pure, or when no examined attribute gains more than 1e-6 bits.
//!
//! Invariants: the forest is determined by the training rows, their order and the seed. It draws
//! with `java.util.Random` as Weka does (the bagging generator seeded with the seed gives each tree's
//! seed; bag `i` is drawn by a generator seeded with seed + i) but is not Weka's forest bit for bit
//! (Weka seeds each tree from a hash of a row's text): accuracies agree within the spread of
//! seeds, not exactly. Like Weka, an attribute window is shared by a tree's nodes and unchosen
//! attributes are examined past K until one gains; a row whose branch saw no training rows is
//! predicted by the deepest node that did. Trees are built without recursion (any depth is safe),
//! and a node keeps only the branches that saw rows, so a tree has fewer nodes than twice its rows.
//! Every weight is a whole count (a bag's draws), so class counts are integers, exact in any order
//! of summation, and every entropy is computed from them in Weka's order of operations.
use super::dataset::Column;
use super::java_random::JavaRandom;
use super::naive_bayes::max_index;
use super::{Dataset, Learner, Model};

/// Weka's `Utils.SMALL`.
const SMALL: f64 = 1e-6;

/// Weka's RandomForest; `Default` is Weka 3.6's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomForest {
    /// Number of trees (Weka `-I`, default 10).
    pub trees: usize,
    /// Attributes examined per node; 0 means Weka's rule int(log2(#attributes)) + 1 (`-K 0`).
    pub features: usize,
    /// Maximum depth; 0 means unlimited (`-depth 0`).
    pub max_depth: usize,
}

impl Default for RandomForest {
    fn default() -> RandomForest {
        RandomForest {
            trees: 10,
            features: 0,
            max_depth: 0,
        }
    }
}

impl RandomForest {
    /// The K a tree uses on `attributes` attributes (the class counted), as Weka 3.6 computes it.
    pub fn k_value(&self, attributes: usize) -> usize {
        let k = if self.features > 0 {
            self.features
        } else {
            ((attributes as f64).ln() / 2f64.ln()) as usize + 1
        };
        k.min(attributes.saturating_sub(1))
    }
}

/// One node of a [`Tree`]: what a prediction reads at it, in 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    /// The attribute it splits on, or [`LEAF`].
    attribute: u32,
    /// A numeric split's first child, or where a nominal split's child table starts in `slots`.
    first: u32,
    /// A numeric split's point (below: `first`; at or above: `first + 1`, both saw training
    /// rows); unused otherwise.
    split: f64,
}

/// One `RandomTree` as flat node arrays (the root first).
#[derive(Debug, Clone, PartialEq)]
struct Tree {
    classes: usize,
    nodes: Vec<Node>,
    /// Nominal splits' child tables: one slot per value, the child that saw training rows with it
    /// or [`NONE`] (a row with that value is predicted by the splitting node).
    slots: Vec<u32>,
    /// Per node: its class distribution, `classes` entries each.
    probs: Vec<f64>,
}

/// A node that is a leaf.
const LEAF: u32 = u32::MAX;
/// A value no training row of the node had.
const NONE: u32 = u32::MAX;

impl Tree {
    fn add_node(&mut self) {
        self.nodes.push(Node {
            attribute: LEAF,
            first: 0,
            split: 0.0,
        });
        self.probs.extend(std::iter::repeat_n(0.0, self.classes));
    }

    fn probs(&self, node: usize) -> &[f64] {
        &self.probs[node * self.classes..(node + 1) * self.classes]
    }
}

/// A trained forest.
#[derive(Debug, Clone, PartialEq)]
pub struct ForestModel {
    trees: Vec<Tree>,
    classes: usize,
}

/// `x ln x`, 0 at and below 0 (Weka's `ContingencyTables.lnFunc`).
fn ln_func(x: f64) -> f64 {
    if x < SMALL { 0.0 } else { x * x.ln() }
}

/// [`ln_func`] at the whole counts `0..=n`, tabulated: every weight of a bag is a whole count, so
/// every count a node sums is one of these, and a lookup gives the very value the call gives.
struct LnTable(Vec<f64>);

impl LnTable {
    fn new(n: usize) -> LnTable {
        LnTable((0..=n).map(|c| ln_func(c as f64)).collect())
    }

    fn at(&self, count: u32) -> f64 {
        self.0[count as usize]
    }

    /// Weka's `entropyOverColumns` of a split whose column (class) totals are `class_counts`:
    /// the entropy of the class, in bits. The columns of any split of a node are its class counts.
    fn prior_entropy(&self, class_counts: &[u32]) -> f64 {
        let mut value = 0.0;
        let mut total = 0u32;
        for &column in class_counts {
            value -= self.at(column);
            total += column;
        }
        if total == 0 {
            return 0.0;
        }
        (value + self.at(total)) / (f64::from(total) * std::f64::consts::LN_2)
    }

    /// Weka's `entropyConditionedOnRows` of the class counts `dist` (`classes` per branch, branches
    /// one after the other) over the branches `branches`, ascending: the class entropy given the
    /// branch, in bits. Branches left out must be empty (an empty branch adds only zeros).
    fn conditional_entropy(
        &self,
        dist: &[u32],
        classes: usize,
        branches: impl Iterator<Item = usize>,
    ) -> f64 {
        let mut value = 0.0;
        let mut total = 0u32;
        for b in branches {
            let mut sum = 0u32;
            for &count in &dist[b * classes..(b + 1) * classes] {
                value += self.at(count);
                sum += count;
            }
            value -= self.at(sum);
            total += sum;
        }
        if total == 0 {
            return 0.0;
        }
        -value / (f64::from(total) * std::f64::consts::LN_2)
    }
}

/// Whether attribute `attribute` is in the set `fixed` ([`Pending::fixed`]).
fn is_fixed(fixed: u64, attribute: usize) -> bool {
    attribute < 64 && fixed & (1 << attribute) != 0
}

/// The set bits of `words`, ascending.
fn set_bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(w, &word)| {
        let mut word = word;
        std::iter::from_fn(move || {
            if word == 0 {
                return None;
            }
            let bit = word.trailing_zeros() as usize;
            word &= word - 1;
            Some(w * 64 + bit)
        })
    })
}

/// A numeric attribute's distinct values, ascending, and each row's rank among them: a node's rows
/// are sorted by rank (or counted by rank) instead of by value. Every weight is a whole count, so
/// the class counts at each boundary are exact whatever the order of tied rows, and the split is
/// the one a sort by value finds.
struct Ranked {
    distinct: Vec<f64>,
    rank: Vec<u32>,
}

impl Ranked {
    fn new(values: &[f64]) -> Ranked {
        let mut order: Vec<u32> = (0..values.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| values[a as usize].total_cmp(&values[b as usize]));
        let mut distinct: Vec<f64> = Vec::new();
        let mut rank = vec![0; values.len()];
        for &row in &order {
            let value = values[row as usize];
            if distinct.last().is_none_or(|&last| value > last) {
                distinct.push(value);
            }
            rank[row as usize] = (distinct.len() - 1) as u32;
        }
        Ranked { distinct, rank }
    }
}

/// A node waiting to be built: its rows are positions `start..end` of the builder's columns in
/// buffer `parity`; its class counts are the matching entry of the builder's count stack.
struct Pending {
    node: usize,
    start: usize,
    end: usize,
    depth: usize,
    parity: usize,
    /// The nominal attributes (below 64) an ancestor splits on: every row of the node has the
    /// same value of each, so each one's gain is 0 (the class entropy less itself) and its
    /// column is not kept up to date below.
    fixed: u64,
}

/// A tree's bag as columns in node order: per examined attribute, each bagged row's cell (its value
/// code, or rank, times the number of classes, plus its class), then each row's weight. A node's
/// rows are one range of positions, so a node's scan reads its columns in order. Splitting a node
/// moves its range, stably by branch, into the other buffer at the same positions: the ranges of
/// the nodes waiting to be built are disjoint, so no waiting node's rows are overwritten.
struct Columns {
    /// Rows in the bag.
    rows: usize,
    /// Per dataset attribute: its column, or `usize::MAX` for the class.
    column_of: Vec<usize>,
    /// Per column but the weights: its attribute.
    attribute_of: Vec<usize>,
    /// The weight column's index.
    weight: usize,
    buffers: [Vec<u32>; 2],
}

impl Columns {
    fn column(&self, parity: usize, column: usize) -> &[u32] {
        &self.buffers[parity][column * self.rows..(column + 1) * self.rows]
    }
}

/// Buffers a tree's nodes reuse (one set per fit, shared by its trees).
struct Scratch {
    /// Per attribute: the class counts of its last examined split, `classes` per branch.
    dists: Vec<Vec<u32>>,
    /// Per attribute: its last numeric split point.
    points: Vec<f64>,
    gains: Vec<f64>,
    examined: Vec<bool>,
    /// The values a nominal attribute takes at the node, as a bit set.
    present: Vec<u64>,
    /// A node's (cell, weight) pairs sorted by rank, or class counts per rank, for numeric splits.
    by_rank: Vec<u64>,
    rank_dist: Vec<u32>,
    current: Vec<u32>,
    /// The branch, then the new position, of each row being partitioned; each branch's row count
    /// and next position.
    branch: Vec<u32>,
    branch_rows: Vec<usize>,
    next: Vec<usize>,
}

/// Builds one tree on its bag.
struct TreeBuilder<'a> {
    data: &'a Dataset,
    classes: usize,
    ranked: &'a [Option<Ranked>],
    ln: &'a LnTable,
    k: usize,
    max_depth: usize,
    /// Weka's `attIndicesWindow`, shared by all nodes of the tree.
    window: Vec<usize>,
    random: JavaRandom,
}

impl TreeBuilder<'_> {
    /// Examines `attribute` on the rows whose cells are `cells` and weights `weights`, whose class
    /// counts are `counts` and class entropy `prior`: its gain; its class counts per branch go to
    /// `scratch.dists[attribute]`, a numeric split point to `scratch.points[attribute]`.
    fn split(
        &self,
        attribute: usize,
        cells: &[u32],
        weights: &[u32],
        counts: &[u32],
        prior: f64,
        s: &mut Scratch,
    ) -> f64 {
        let classes = self.classes;
        let dist = &mut s.dists[attribute];
        match &self.ranked[attribute] {
            None => {
                let values = self.data.attribute(attribute).values();
                dist.clear();
                dist.resize(values * classes, 0);
                let present = &mut s.present;
                present.clear();
                present.resize(values.div_ceil(64), 0);
                for (&cell, &weight) in cells.iter().zip(weights) {
                    let cell = cell as usize;
                    dist[cell] += weight;
                    let value = cell / classes;
                    present[value / 64] |= 1 << (value % 64);
                }
                prior
                    - self
                        .ln
                        .conditional_entropy(dist, classes, set_bits(present))
            }
            Some(ranked) => {
                let current = &mut s.current;
                current.clear();
                current.resize(classes, 0);
                current.extend_from_slice(counts);
                dist.clone_from(current);
                let mut point = 0.0;
                let mut best = -f64::MAX;
                if ranked.distinct.len() <= cells.len() {
                    // Count by rank, then sweep the ranks present.
                    let rank_dist = &mut s.rank_dist;
                    rank_dist.clear();
                    rank_dist.resize(ranked.distinct.len() * classes, 0);
                    for (&cell, &weight) in cells.iter().zip(weights) {
                        rank_dist[cell as usize] += weight;
                    }
                    let mut last: Option<f64> = None;
                    for (value, group) in
                        ranked.distinct.iter().zip(rank_dist.chunks_exact(classes))
                    {
                        if group.iter().all(|&w| w == 0) {
                            continue;
                        }
                        if let Some(last) = last {
                            let gain = prior - self.ln.conditional_entropy(current, classes, 0..2);
                            if gain > best {
                                best = gain;
                                point = (value + last) / 2.0;
                                dist.clone_from(current);
                            }
                        }
                        last = Some(*value);
                        for (c, &w) in group.iter().enumerate() {
                            current[c] += w;
                            current[classes + c] -= w;
                        }
                    }
                } else {
                    // Sort the node's (cell, weight) pairs by cell (so by rank) and sweep them.
                    let by_rank = &mut s.by_rank;
                    by_rank.clear();
                    by_rank.extend(
                        cells
                            .iter()
                            .zip(weights)
                            .map(|(&cell, &weight)| (u64::from(cell) << 32) | u64::from(weight)),
                    );
                    by_rank.sort_unstable();
                    let rank_of = |pair: u64| (pair >> 32) as usize / classes;
                    let mut last = by_rank.first().map_or(0, |&p| rank_of(p));
                    for &pair in by_rank.iter() {
                        let rank = rank_of(pair);
                        if rank > last {
                            let gain = prior - self.ln.conditional_entropy(current, classes, 0..2);
                            if gain > best {
                                best = gain;
                                point = (ranked.distinct[rank] + ranked.distinct[last]) / 2.0;
                                dist.clone_from(current);
                            }
                        }
                        last = rank;
                        let c = (pair >> 32) as usize % classes;
                        let w = pair as u32;
                        current[c] += w;
                        current[classes + c] -= w;
                    }
                }
                s.points[attribute] = point;
                prior - self.ln.conditional_entropy(dist, classes, 0..2)
            }
        }
    }

    /// Builds the tree on the bag `columns` (in buffer 0) whose class counts are `counts`.
    fn build(mut self, columns: &mut Columns, mut counts: Vec<u32>, s: &mut Scratch) -> Tree {
        let classes = self.classes;
        let mut tree = Tree {
            classes,
            nodes: Vec::new(),
            slots: Vec::new(),
            probs: Vec::new(),
        };
        tree.add_node();
        // The class counts of the pending nodes, in the stack's order.
        let mut count_stack = counts.clone();
        let mut pending = vec![Pending {
            node: 0,
            start: 0,
            end: columns.rows,
            depth: 0,
            parity: 0,
            fixed: 0,
        }];
        let attributes = self.data.attributes().len();
        let mut chosen_attributes = Vec::new();
        while let Some(Pending {
            node,
            start,
            end,
            depth,
            parity,
            fixed,
        }) = pending.pop()
        {
            counts.clear();
            counts.extend_from_slice(&count_stack[count_stack.len() - classes..]);
            count_stack.truncate(count_stack.len() - classes);
            let total: u32 = counts.iter().sum();
            let probs = &mut tree.probs[node * classes..(node + 1) * classes];
            for (p, &c) in probs.iter_mut().zip(&counts) {
                *p = f64::from(c);
            }
            normalize(probs);
            let majority = counts.iter().copied().max().unwrap_or(0);
            if total < 2 || majority == total || (self.max_depth > 0 && depth >= self.max_depth) {
                continue;
            }
            let prior = self.ln.prior_entropy(&counts);
            let weights = &columns.column(parity, columns.weight)[start..end];
            s.gains.clear();
            s.gains.resize(attributes, 0.0);
            for &a in &chosen_attributes {
                s.examined[a] = false;
            }
            chosen_attributes.clear();
            let mut window_size = self.window.len();
            let mut k = self.k as i64;
            let mut gain_found = false;
            while window_size > 0
                && ({
                    let more = k > 0;
                    k -= 1;
                    more
                } || !gain_found)
            {
                let chosen = self.random.next_int_below(window_size as i32) as usize;
                let attribute = self.window[chosen];
                self.window.swap(chosen, window_size - 1);
                window_size -= 1;
                let gain = if is_fixed(fixed, attribute) {
                    0.0
                } else {
                    let cells = &columns.column(parity, columns.column_of[attribute])[start..end];
                    self.split(attribute, cells, weights, &counts, prior, s)
                };
                s.gains[attribute] = gain;
                if gain > SMALL {
                    gain_found = true;
                }
                s.examined[attribute] = true;
                chosen_attributes.push(attribute);
            }
            let best = max_index(&s.gains);
            if !s.examined[best] || s.gains[best] <= SMALL {
                continue;
            }
            // Each row's branch, and each branch's rows.
            let branches = s.dists[best].len() / classes;
            let point = s.points[best];
            let ranked = &self.ranked[best];
            let cells = &columns.column(parity, columns.column_of[best])[start..end];
            s.branch.clear();
            s.branch.extend(cells.iter().map(|&cell| {
                let code = cell as usize / classes;
                match ranked {
                    None => code as u32,
                    Some(ranked) => u32::from(ranked.distinct[code] >= point),
                }
            }));
            s.branch_rows.clear();
            s.branch_rows.resize(branches, 0);
            for &b in &s.branch {
                s.branch_rows[b as usize] += 1;
            }
            // Each row's new position (stably by branch), then every column's range moved there
            // in the other buffer.
            s.next.clear();
            let mut at = start;
            for &n in &s.branch_rows {
                s.next.push(at);
                at += n;
            }
            for b in s.branch.iter_mut() {
                let next = &mut s.next[*b as usize];
                *b = *next as u32;
                *next += 1;
            }
            let fixed = match ranked {
                None if best < 64 => fixed | 1 << best,
                _ => fixed,
            };
            let [zero, one] = &mut columns.buffers;
            let (from, to) = if parity == 0 {
                (&*zero, one)
            } else {
                (&*one, zero)
            };
            for column in 0..=columns.weight {
                if column < columns.weight && is_fixed(fixed, columns.attribute_of[column]) {
                    continue;
                }
                let offset = column * columns.rows;
                let to = &mut to[offset..offset + columns.rows];
                for (&position, &cell) in s.branch.iter().zip(&from[offset + start..offset + end]) {
                    to[position as usize] = cell;
                }
            }
            let first = tree.nodes.len();
            tree.nodes[node].attribute = best as u32;
            let mut child = first;
            if ranked.is_none() {
                tree.nodes[node].first = tree.slots.len() as u32;
                for &n in &s.branch_rows {
                    if n > 0 {
                        tree.slots.push(child as u32);
                        child += 1;
                    } else {
                        tree.slots.push(NONE);
                    }
                }
            } else {
                tree.nodes[node].first = first as u32;
                tree.nodes[node].split = s.points[best];
                child += s.branch_rows.iter().filter(|&&n| n > 0).count();
            }
            for _ in first..child {
                tree.add_node();
            }
            // Depth first, children in order (the order Weka's recursion draws in).
            let mut end_of = end;
            for (b, &n) in s.branch_rows.iter().enumerate().rev() {
                if n == 0 {
                    continue;
                }
                child -= 1;
                pending.push(Pending {
                    node: child,
                    start: end_of - n,
                    end: end_of,
                    depth: depth + 1,
                    parity: 1 - parity,
                    fixed,
                });
                count_stack.extend_from_slice(&s.dists[best][b * classes..(b + 1) * classes]);
                end_of -= n;
            }
        }
        tree
    }
}

/// Weka's `Utils.normalize` (an all-zero vector stays as it is).
fn normalize(values: &mut [f64]) {
    let sum: f64 = values.iter().sum();
    if sum > 0.0 {
        for v in values {
            *v /= sum;
        }
    }
}

/// Bag `iteration`: Weka's `resampleWithWeights` of `rows` (each weight 1) with a generator seeded
/// `seed + iteration`, as a weight (a count of draws) per dataset row, written to `weights`.
fn bag(rows: &[u32], seed: i64, iteration: usize, weights: &mut Vec<u32>, dataset_rows: usize) {
    let mut random = JavaRandom::new(seed.wrapping_add(iteration as i64));
    let n = rows.len();
    weights.clear();
    weights.resize(dataset_rows, 0);
    if n == 0 {
        return;
    }
    let mut probabilities = Vec::with_capacity(n);
    let mut sum = 0.0;
    for _ in 0..n {
        sum += random.next_double();
        probabilities.push(sum);
    }
    let scale = probabilities[n - 1] / n as f64;
    for p in &mut probabilities {
        *p /= scale;
    }
    probabilities[n - 1] = n as f64;
    let (mut k, mut l) = (0, 0);
    let mut sum_probs = 0.0;
    while k < n && l < n {
        sum_probs += 1.0;
        while k < n && probabilities[k] <= sum_probs {
            weights[rows[l] as usize] += 1;
            k += 1;
        }
        l += 1;
    }
}

impl Learner for RandomForest {
    type Model = ForestModel;

    fn fit(&self, data: &Dataset, class: usize, rows: &[u32], seed: u64) -> ForestModel {
        let classes = data.attribute(class).values();
        let labels = data.nominal_codes(class);
        let attributes = data.attributes().len();
        let k = self.k_value(attributes);
        let ranked: Vec<Option<Ranked>> = (0..attributes)
            .map(|a| match data.column(a) {
                Column::Numeric(values) if a != class => Some(Ranked::new(values)),
                _ => None,
            })
            .collect();
        // Each dataset row's cell per attribute (the class has none).
        let cells: Vec<Vec<u32>> = (0..attributes)
            .filter(|&a| a != class)
            .map(|a| {
                let codes = match (data.column(a), &ranked[a]) {
                    (_, Some(ranked)) => &ranked.rank,
                    (Column::Nominal(codes), None) => codes,
                    (Column::Numeric(_), None) => unreachable!("numeric attributes are ranked"),
                };
                codes
                    .iter()
                    .zip(labels)
                    .map(|(&code, &label)| code * classes as u32 + label)
                    .collect()
            })
            .collect();
        let mut column_of = vec![usize::MAX; attributes];
        for (j, a) in (0..attributes).filter(|&a| a != class).enumerate() {
            column_of[a] = j;
        }
        let mut columns = Columns {
            rows: 0,
            column_of,
            attribute_of: (0..attributes).filter(|&a| a != class).collect(),
            weight: cells.len(),
            buffers: [Vec::new(), Vec::new()],
        };
        let ln = LnTable::new(rows.len());
        let mut scratch = Scratch {
            dists: vec![Vec::new(); attributes],
            points: vec![0.0; attributes],
            gains: Vec::with_capacity(attributes),
            examined: vec![false; attributes],
            present: Vec::new(),
            by_rank: Vec::new(),
            rank_dist: Vec::new(),
            current: Vec::new(),
            branch: Vec::new(),
            branch_rows: Vec::new(),
            next: Vec::new(),
        };
        let mut seeds = JavaRandom::new(seed as i64);
        let mut weights = Vec::new();
        let mut in_bag = Vec::new();
        let trees = (0..self.trees)
            .map(|i| {
                let tree_seed = seeds.next_int();
                bag(rows, seed as i64, i, &mut weights, data.rows());
                in_bag.clear();
                in_bag.extend(rows.iter().copied().filter(|&r| weights[r as usize] > 0));
                columns.rows = in_bag.len();
                let [first, second] = &mut columns.buffers;
                first.clear();
                for column in &cells {
                    first.extend(in_bag.iter().map(|&r| column[r as usize]));
                }
                first.extend(in_bag.iter().map(|&r| weights[r as usize]));
                second.clear();
                second.resize(first.len(), 0);
                let mut counts = vec![0u32; classes];
                for &row in &in_bag {
                    counts[labels[row as usize] as usize] += weights[row as usize];
                }
                TreeBuilder {
                    data,
                    classes,
                    ranked: &ranked,
                    ln: &ln,
                    k,
                    max_depth: self.max_depth,
                    window: (0..attributes).filter(|&a| a != class).collect(),
                    random: JavaRandom::new(i64::from(tree_seed)),
                }
                .build(&mut columns, counts, &mut scratch)
            })
            .collect();
        ForestModel { trees, classes }
    }
}

impl Tree {
    /// The class distribution of row `row` (Weka's `RandomTree.distributionForInstance`).
    fn distribution(&self, data: &Dataset, row: usize) -> &[f64] {
        let mut at = 0;
        loop {
            let node = self.nodes[at];
            if node.attribute == LEAF {
                return self.probs(at);
            }
            at = match data.column(node.attribute as usize) {
                Column::Nominal(codes) => {
                    let slot = self.slots[node.first as usize + codes[row] as usize];
                    if slot == NONE {
                        return self.probs(at);
                    }
                    slot as usize
                }
                Column::Numeric(values) => {
                    node.first as usize + usize::from(values[row] >= node.split)
                }
            };
        }
    }
}

impl Model for ForestModel {
    fn predict(&self, data: &Dataset, row: u32) -> u32 {
        let mut small = [0.0; 16];
        let mut large = Vec::new();
        let sums = if self.classes <= small.len() {
            &mut small[..self.classes]
        } else {
            large.resize(self.classes, 0.0);
            &mut large[..]
        };
        for tree in &self.trees {
            for (s, p) in sums.iter_mut().zip(tree.distribution(data, row as usize)) {
                *s += p;
            }
        }
        max_index(sums) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learning::cross_validate;

    #[test]
    fn k_is_wekas_rule_with_the_class_counted() {
        let forest = RandomForest::default();
        assert_eq!(forest.k_value(9), 4);
        assert_eq!(forest.k_value(8), 4);
        assert_eq!(forest.k_value(7), 3);
        assert_eq!(forest.k_value(2), 1);
    }

    #[test]
    fn gains_are_in_bits() {
        let ln = LnTable::new(4);
        let dist = [2, 0, 0, 2];
        assert!((ln.prior_entropy(&[2, 2]) - 1.0).abs() < 1e-12);
        assert!(ln.conditional_entropy(&dist, 2, 0..2).abs() < 1e-12);
        assert_eq!(set_bits(&[0b1010, 1]).collect::<Vec<_>>(), [1, 3, 64]);
    }

    #[test]
    fn a_bag_has_as_many_draws_as_rows() {
        let rows: Vec<u32> = (0..50).collect();
        let mut weights = Vec::new();
        bag(&rows, 1, 3, &mut weights, 60);
        assert_eq!(weights.iter().sum::<u32>(), 50);
        assert!(weights[50..].iter().all(|&w| w == 0));
        assert!(weights.iter().filter(|&&w| w > 0).count() < 50);
    }

    /// A class decided by a nominal attribute and a numeric threshold is learned exactly.
    #[test]
    fn learns_a_nominal_and_numeric_rule() {
        let rows: Vec<[String; 4]> = (0..200)
            .map(|i| {
                let color = ["red", "green", "blue"][i % 3];
                let size = (i * 7 % 50) as f64;
                let noise = ["p", "q"][(i / 3) % 2];
                let class = if color == "red" || size >= 25.0 {
                    "yes"
                } else {
                    "no"
                };
                [
                    color.to_string(),
                    size.to_string(),
                    noise.to_string(),
                    class.to_string(),
                ]
            })
            .collect();
        let data = Dataset::from_rows(
            &["color", "size", "noise", "class"],
            &[false, true, false, false],
            rows.iter().map(|r| r.iter().map(String::as_str)),
        )
        .unwrap();
        let accuracy = cross_validate(&RandomForest::default(), &data, 3, 10, 1).unwrap();
        assert!(accuracy.rate() > 0.95, "{accuracy:?}");
        let again = cross_validate(&RandomForest::default(), &data, 3, 10, 1).unwrap();
        assert_eq!(accuracy, again);
    }
}
