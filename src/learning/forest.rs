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

/// One node of a tree.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Leaf {
        probs: Vec<f64>,
    },
    Nominal {
        attribute: usize,
        /// The value and child of each branch that saw training rows, by value; a row with
        /// another value is predicted by this node.
        children: Vec<(u32, usize)>,
        probs: Vec<f64>,
    },
    Numeric {
        attribute: usize,
        split: f64,
        /// Below the split: `first`; at or above: `first + 1` (both saw training rows).
        first: usize,
        probs: Vec<f64>,
    },
}

/// One `RandomTree`, its nodes in an arena (the root first).
#[derive(Debug, Clone, PartialEq)]
struct Tree {
    nodes: Vec<Node>,
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

/// Weka's `entropyOverColumns` of a split's class counts: the entropy of the class, in bits.
fn prior_entropy(dist: &[Vec<f64>], classes: usize) -> f64 {
    let mut value = 0.0;
    let mut total = 0.0;
    for c in 0..classes {
        let column: f64 = dist.iter().map(|branch| branch[c]).sum();
        value -= ln_func(column);
        total += column;
    }
    if (total).abs() < SMALL {
        return 0.0;
    }
    (value + ln_func(total)) / (total * std::f64::consts::LN_2)
}

/// Weka's `entropyConditionedOnRows`: the class entropy given the branch, in bits.
fn conditional_entropy(dist: &[Vec<f64>]) -> f64 {
    let mut value = 0.0;
    let mut total = 0.0;
    for branch in dist {
        let mut sum = 0.0;
        for &count in branch {
            value += ln_func(count);
            sum += count;
        }
        value -= ln_func(sum);
        total += sum;
    }
    if total.abs() < SMALL {
        return 0.0;
    }
    -value / (total * std::f64::consts::LN_2)
}

/// A candidate split of one node on one attribute.
struct Split {
    gain: f64,
    /// Class counts per branch.
    dist: Vec<Vec<f64>>,
    /// The numeric split point (unused for nominal splits).
    point: f64,
}

/// A node waiting to be built.
struct Pending {
    node: usize,
    rows: Vec<u32>,
    counts: Vec<f64>,
    depth: usize,
}

/// Builds one tree on the bag `weights` (a weight per row of the dataset, 0 outside the bag).
struct TreeBuilder<'a> {
    data: &'a Dataset,
    labels: &'a [u32],
    classes: usize,
    weights: &'a [f64],
    k: usize,
    max_depth: usize,
    /// Weka's `attIndicesWindow`, shared by all nodes of the tree.
    window: Vec<usize>,
    random: JavaRandom,
}

impl TreeBuilder<'_> {
    fn class_counts(&self, rows: &[u32]) -> Vec<f64> {
        let mut counts = vec![0.0; self.classes];
        for &row in rows {
            counts[self.labels[row as usize] as usize] += self.weights[row as usize];
        }
        counts
    }

    fn split(&self, attribute: usize, rows: &[u32], scratch: &mut Vec<(f64, u32)>) -> Split {
        match self.data.column(attribute) {
            Column::Nominal(codes) => {
                let values = self.data.attribute(attribute).values();
                let mut dist = vec![vec![0.0; self.classes]; values];
                for &row in rows {
                    let r = row as usize;
                    dist[codes[r] as usize][self.labels[r] as usize] += self.weights[r];
                }
                let gain = prior_entropy(&dist, self.classes) - conditional_entropy(&dist);
                Split {
                    gain,
                    dist,
                    point: 0.0,
                }
            }
            Column::Numeric(values) => {
                scratch.clear();
                scratch.extend(rows.iter().map(|&r| (values[r as usize], r)));
                scratch.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                let mut current = vec![vec![0.0; self.classes], self.class_counts(rows)];
                let prior = prior_entropy(&current, self.classes);
                let mut dist = current.clone();
                let mut point = 0.0;
                let mut best = -f64::MAX;
                let mut last = scratch.first().map_or(0.0, |s| s.0);
                for &(value, row) in scratch.iter() {
                    if value > last {
                        let gain = prior - conditional_entropy(&current);
                        if gain > best {
                            best = gain;
                            point = (value + last) / 2.0;
                            dist.clone_from(&current);
                        }
                    }
                    last = value;
                    let c = self.labels[row as usize] as usize;
                    let w = self.weights[row as usize];
                    current[0][c] += w;
                    current[1][c] -= w;
                }
                let gain = prior - conditional_entropy(&dist);
                Split { gain, dist, point }
            }
        }
    }

    fn build(mut self, rows: Vec<u32>) -> Tree {
        let mut nodes = vec![Node::Leaf { probs: Vec::new() }];
        let counts = self.class_counts(&rows);
        let mut pending = vec![Pending {
            node: 0,
            rows,
            counts,
            depth: 0,
        }];
        let mut scratch = Vec::new();
        let attributes = self.data.attributes().len();
        while let Some(Pending {
            node,
            rows,
            counts,
            depth,
        }) = pending.pop()
        {
            let total: f64 = counts.iter().sum();
            let mut probs = counts.clone();
            normalize(&mut probs);
            let majority = counts[max_index(&counts)];
            if total < 2.0 - SMALL
                || (majority - total).abs() < SMALL
                || (self.max_depth > 0 && depth >= self.max_depth)
            {
                nodes[node] = Node::Leaf { probs };
                continue;
            }
            let mut gains = vec![0.0; attributes];
            let mut splits: Vec<Option<Split>> = (0..attributes).map(|_| None).collect();
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
                let split = self.split(attribute, &rows, &mut scratch);
                gains[attribute] = split.gain;
                if split.gain > SMALL {
                    gain_found = true;
                }
                splits[attribute] = Some(split);
            }
            let best = max_index(&gains);
            let Some(split) = splits[best].take().filter(|s| s.gain > SMALL) else {
                nodes[node] = Node::Leaf { probs };
                continue;
            };
            let branches = split.dist.len();
            let mut parts: Vec<Vec<u32>> = vec![Vec::new(); branches];
            let first = nodes.len();
            match self.data.column(best) {
                Column::Nominal(codes) => {
                    for &row in &rows {
                        parts[codes[row as usize] as usize].push(row);
                    }
                    let children = parts
                        .iter()
                        .enumerate()
                        .filter(|(_, part)| !part.is_empty())
                        .enumerate()
                        .map(|(i, (value, _))| (value as u32, first + i))
                        .collect();
                    nodes[node] = Node::Nominal {
                        attribute: best,
                        children,
                        probs,
                    };
                }
                Column::Numeric(values) => {
                    for &row in &rows {
                        parts[usize::from(values[row as usize] >= split.point)].push(row);
                    }
                    nodes[node] = Node::Numeric {
                        attribute: best,
                        split: split.point,
                        first,
                        probs,
                    };
                }
            }
            drop(rows);
            let children: Vec<(Vec<u32>, Vec<f64>)> = parts
                .into_iter()
                .zip(split.dist)
                .filter(|(part, _)| !part.is_empty())
                .collect();
            nodes.extend(children.iter().map(|_| Node::Leaf { probs: Vec::new() }));
            // Depth first, children in order (the order Weka's recursion draws in).
            for (i, (rows, counts)) in children.into_iter().enumerate().rev() {
                pending.push(Pending {
                    node: first + i,
                    rows,
                    counts,
                    depth: depth + 1,
                });
            }
        }
        Tree { nodes }
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
/// `seed + iteration`, as a weight (a count) per dataset row.
fn bag(rows: &[u32], seed: i64, iteration: usize, dataset_rows: usize) -> Vec<f64> {
    let mut random = JavaRandom::new(seed.wrapping_add(iteration as i64));
    let n = rows.len();
    let mut weights = vec![0.0; dataset_rows];
    if n == 0 {
        return weights;
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
            weights[rows[l] as usize] += 1.0;
            k += 1;
        }
        l += 1;
    }
    weights
}

impl Learner for RandomForest {
    type Model = ForestModel;

    fn fit(&self, data: &Dataset, class: usize, rows: &[u32], seed: u64) -> ForestModel {
        let classes = data.attribute(class).values();
        let labels = data.nominal_codes(class);
        let k = self.k_value(data.attributes().len());
        let mut seeds = JavaRandom::new(seed as i64);
        let trees = (0..self.trees)
            .map(|i| {
                let tree_seed = seeds.next_int();
                let weights = bag(rows, seed as i64, i, data.rows());
                let in_bag: Vec<u32> = rows
                    .iter()
                    .copied()
                    .filter(|&r| weights[r as usize] > 0.0)
                    .collect();
                TreeBuilder {
                    data,
                    labels,
                    classes,
                    weights: &weights,
                    k,
                    max_depth: self.max_depth,
                    window: (0..data.attributes().len())
                        .filter(|&a| a != class)
                        .collect(),
                    random: JavaRandom::new(i64::from(tree_seed)),
                }
                .build(in_bag)
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
            let child = match &self.nodes[at] {
                Node::Leaf { probs } => return probs,
                Node::Nominal {
                    attribute,
                    children,
                    probs,
                } => {
                    let value = data.nominal_codes(*attribute)[row];
                    match children.binary_search_by_key(&value, |&(v, _)| v) {
                        Ok(i) => children[i].1,
                        Err(_) => return probs,
                    }
                }
                Node::Numeric {
                    attribute,
                    split,
                    first,
                    ..
                } => first + usize::from(data.numeric_values(*attribute)[row] >= *split),
            };
            at = child;
        }
    }
}

impl Model for ForestModel {
    fn predict(&self, data: &Dataset, row: u32) -> u32 {
        let mut sums = vec![0.0; self.classes];
        for tree in &self.trees {
            for (s, p) in sums.iter_mut().zip(tree.distribution(data, row as usize)) {
                *s += p;
            }
        }
        max_index(&sums) as u32
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
        let dist = vec![vec![2.0, 0.0], vec![0.0, 2.0]];
        assert!((prior_entropy(&dist, 2) - 1.0).abs() < 1e-12);
        assert!(conditional_entropy(&dist).abs() < 1e-12);
    }

    #[test]
    fn a_bag_has_as_many_draws_as_rows() {
        let rows: Vec<u32> = (0..50).collect();
        let weights = bag(&rows, 1, 3, 60);
        assert_eq!(weights.iter().sum::<f64>(), 50.0);
        assert!(weights[50..].iter().all(|&w| w == 0.0));
        assert!(weights.iter().filter(|&&w| w > 0.0).count() < 50);
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
