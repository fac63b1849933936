//! J48, Weka 3.6's C4.5 (revision 8) decision tree, with Weka's defaults: gain ratio among the tests
//! whose information gain is at least the average (less 1e-3), multiway splits on nominal
//! attributes, binary splits on numeric ones (threshold by information gain with the MDL correction,
//! then moved down to the greatest training value below it), at least `min_leaf` rows in two
//! branches, `collapse`, then pessimistic pruning at confidence `confidence` with subtree raising.
//! Built to give Weka's accuracy on Weka's folds ([`crate::learning::cross_validate`]).
//!
//! Invariants: a fit is a pure function of the dataset, the class and the training rows (the seed
//! is unused: J48 is deterministic). Nothing panics on any dataset: one row, one class, constant or
//! single-valued attributes, no attribute but the class, rows with values unseen in training. Like
//! the datasets ([`crate::learning::Dataset`]) the learner knows no missing values, so Weka's
//! fractional instances for unknown values are not implemented. Where Weka leaves a row
//! unclassified (a leaf that lost all its rows to subtree raising), [`J48Model`] predicts
//! [`UNCLASSIFIED`], which no label equals, so it counts as an error, as Weka counts it.
//! Numeric values closer than 1e-6 to each other may move Weka's `setSplitPoint` differently (it
//! scans rows in file order): the model takes the greatest distinct training value within the
//! tolerance.
use super::{Dataset, Learner, Model};

mod split;
pub mod stats;
mod tree;

use tree::{Grower, Test, merge};

/// What [`J48Model`] predicts where Weka's J48 leaves a row unclassified.
pub const UNCLASSIFIED: u32 = u32::MAX;

/// J48's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct J48 {
    /// The pruning confidence (Weka's `-C`, 0.25); taken as an `f32` as Weka does; above 0.5 the
    /// error estimates are not raised (Weka warns and does the same).
    pub confidence: f64,
    /// The fewest rows in at least two branches of a test (Weka's `-M`, 2).
    pub min_leaf: u32,
    /// Prune (Weka's default; `false` is `-U`).
    pub prune: bool,
}

impl Default for J48 {
    fn default() -> J48 {
        J48 {
            confidence: 0.25,
            min_leaf: 2,
            prune: true,
        }
    }
}

/// One node of a trained tree: a test with its branches at `first..first + branches`, or an answer.
#[derive(Debug, Clone, PartialEq)]
enum Compiled {
    Test { test: Test, first: u32 },
    Answer(u32),
}

/// A trained J48 tree.
#[derive(Debug, Clone, PartialEq)]
pub struct J48Model {
    nodes: Vec<Compiled>,
}

impl J48Model {
    /// The number of nodes (inner nodes and leaves).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// The number of leaves.
    pub fn leaves(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| matches!(n, Compiled::Answer(_)))
            .count()
    }
}

/// The first class with the most rows, or `UNCLASSIFIED` for no rows.
fn majority(counts: &[u32]) -> u32 {
    let mut best = 0;
    for (j, &c) in counts.iter().enumerate() {
        if c > counts[best] {
            best = j;
        }
    }
    if counts.get(best).copied().unwrap_or(0) == 0 {
        UNCLASSIFIED
    } else {
        best as u32
    }
}

impl Model for J48Model {
    fn predict(&self, data: &Dataset, row: u32) -> u32 {
        let mut at = 0usize;
        loop {
            match &self.nodes[at] {
                Compiled::Answer(class) => return *class,
                Compiled::Test { test, first } => {
                    at = *first as usize + test.branch(data, row);
                }
            }
        }
    }
}

/// Rows above which the recursive growing runs on a thread with a stack sized for the deepest tree
/// the rows allow.
const DEEP: usize = 4096;

impl Learner for J48 {
    type Model = J48Model;

    fn fit(&self, data: &Dataset, class: usize, rows: &[u32], _seed: u64) -> J48Model {
        if rows.len() <= DEEP {
            return self.grow(data, class, rows);
        }
        // A tree can be as deep as half its rows; each level of the recursion costs a few hundred
        // bytes of stack.
        let stack = (8 << 20) + rows.len() * 1024;
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("j48-fit".into())
                .stack_size(stack)
                .spawn_scoped(scope, || self.grow(data, class, rows))
                .map(|handle| handle.join())
        })
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| self.grow(data, class, rows))
    }
}

impl J48 {
    fn grow(&self, data: &Dataset, class: usize, rows: &[u32]) -> J48Model {
        let classes = data.attribute(class).values();
        let mut grower = Grower::new(data, class, rows, f64::from(self.min_leaf), self.confidence);
        let root = grower.grow(0, rows.len());
        grower.collapse(root);
        if self.prune {
            grower.prune(root);
        }
        // Lay the tree out breadth-first: a test's branches are consecutive.
        let nodes = &grower.nodes;
        let mut compiled = Vec::new();
        let mut queue = std::collections::VecDeque::new();
        compiled.push(Compiled::Answer(UNCLASSIFIED));
        queue.push_back((root, 0usize, None::<(usize, usize)>));
        while let Some((id, at, parent)) = queue.pop_front() {
            let node = &nodes[id];
            compiled[at] = if let (true, Some((p, branch))) = (node.empty, parent) {
                // Weka's `getProbs` for an empty son: the parent's distribution for this branch,
                // or the parent's whole distribution when the branch has no rows.
                let bag = &nodes[p].dist[branch * classes..(branch + 1) * classes];
                if bag.iter().any(|&c| c > 0) {
                    Compiled::Answer(majority(bag))
                } else {
                    Compiled::Answer(majority(&merge(&nodes[p].dist, classes)))
                }
            } else {
                match node.test {
                    None => Compiled::Answer(majority(&node.dist)),
                    Some(test) => {
                        let first = compiled.len();
                        for (b, &child) in node.children.iter().enumerate() {
                            compiled.push(Compiled::Answer(UNCLASSIFIED));
                            queue.push_back((child, first + b, Some((id, b))));
                        }
                        Compiled::Test {
                            test,
                            first: first as u32,
                        }
                    }
                }
            };
        }
        J48Model { nodes: compiled }
    }
}

#[cfg(test)]
mod tests;
