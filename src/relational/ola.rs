//! OLA, the Optimal Lattice Anonymization of El Emam et al. (JAMIA 2009): optimal full-domain
//! generalization with a suppression limit.
//!
//! A node of the lattice is a vector of per-attribute hierarchy levels (0 = the values themselves,
//! h − 1 = the root); releasing at a node generalizes every value of attribute j to its ancestor at
//! level j. The rows of classes that violate a requested model are suppressed (released with every
//! QI `*`); a node is *anonymous* when at most `max_suppression` × |T| rows are suppressed and the
//! suppressed rows, taken together as the one class they form in the release, satisfy every model
//! (or there are none). Among the anonymous nodes OLA returns one of least information loss under the
//! chosen [`Metric`] (DM, 1 − Prec, non-uniform entropy, as [`crate::relational::distortion`] defines
//! them; ties go to the node found first).
//!
//! Search: for every generalization strategy (path from the bottom to the top), a binary search by
//! height between a bottom node B and a top node T ("Kmin" of the paper): the nodes at half height of
//! the sub-lattice are checked in turn, recursing below an anonymous one and above a non-anonymous one,
//! with *predictive tagging*: a node above one tagged anonymous is anonymous, a node below one tagged
//! non-anonymous is not, and neither is checked again. The k-minimal nodes found are the lowest
//! anonymous nodes of every path.
//!
//! Monotonicity (what tagging may rely on). Merging two classes that both satisfy a model gives a
//! class that satisfies it for every model cloakd has: k (sizes add), distinct l (values unite),
//! entropy l (entropy is concave), probabilistic l (the top frequency of a mixture is at most the
//! larger one), recursive (c,l) (Machanavajjhala et al.), t-closeness under EMD and JS (both are
//! convex in the class distribution) and delta-disclosure (a mixture's ratio lies between the two).
//! So **without suppression** every model is monotone and OLA tags with the whole model set. **With
//! suppression** a node's property is "at most so many rows in violating classes", which stays
//! monotone only when a violating class merged with a satisfying one satisfies the model: true for
//! k-anonymity and distinct l-diversity, false for entropy, probabilistic and recursive l, t and delta
//! (a skewed class can drag a good one below the bound). The condition on the suppressed rows
//! themselves is monotone for no model. So with suppression the binary search and the tags use only
//! k and distinct l, and the full condition is then checked on each candidate above the k-minimal
//! nodes of that monotone part, in increasing order of a lower bound of its loss (level shares for
//! Prec and entropy, the largest Σ|E|² of a checked node below it for DM — every bound is ≤ the
//! loss of every node above), stopping when the bound reaches the best loss found. Without
//! suppression every metric is monotone along the lattice, so the optimum is a k-minimal node.
//!
//! Risk bounds ([`crate::relational::models::RiskBounds`]). The highest prosecutor risk is a check
//! of one class (|E| ≥ 1/r, k-anonymity's rule), monotone with and without suppression: it tags
//! like k. The average prosecutor risk and the share of population uniques are measured on the
//! kept classes of a node (suppressed rows count nowhere, as the risk engine measures a release).
//! The average is monotone without suppression (merging classes lowers the number of classes, the
//! records stay), so it tags then; with suppression it is not (suppressing the large classes of a
//! node can leave fewer, riskier ones kept at a node above) and population uniqueness never is:
//! those are checked at every candidate node (the search above the k-minimal nodes of the monotone
//! part described above, which then also runs without suppression).
//!
//! Checking a node groups the table's distinct QI tuples (each with its count and sensitive
//! histogram), not its rows, on a key that packs the per-attribute level codes into one `u128`;
//! per-attribute level codes are computed once. Every QI needs a hierarchy (numeric columns without
//! one are refused: OLA's lattice is made of hierarchy levels).
//!
//! Invariants: the returned node is anonymous as defined above (the release is checked again by the
//! caller from the released rows); the engine is pure and deterministic; [`ola_unless`] looks at the
//! cancellation flag before each node check.
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::relational::models::{
    ClassCounts, LDiversity, ModelSet, PrivacySpec, RiskBounds, SensitiveDistribution,
};
use crate::relational::recoding::{Cell, Recoding};
use crate::relational::table::{QuasiAttribute, Table};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// The largest lattice OLA accepts (nodes); a larger one is refused before allocation.
pub const MAX_LATTICE: u64 = 1 << 22;

/// The information-loss metric OLA minimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metric {
    /// Discernibility: Σ |E|² + |T| per suppressed row.
    #[default]
    Dm,
    /// 1 − precision (mean level share of the QI cells).
    Prec,
    /// Non-uniform entropy.
    Entropy,
}

impl FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Metric, String> {
        match s {
            "dm" => Ok(Metric::Dm),
            "prec" => Ok(Metric::Prec),
            "entropy" => Ok(Metric::Entropy),
            other => Err(format!(
                "unknown metric {other:?} (known: dm, prec, entropy)"
            )),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Metric::Dm => "dm",
            Metric::Prec => "prec",
            Metric::Entropy => "entropy",
        })
    }
}

/// Why OLA found no release.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OlaError {
    #[error(
        "column {0:?} is numeric without a hierarchy (rule: OLA generalizes by hierarchy levels; give every quasi-identifier a hierarchy)"
    )]
    NeedsHierarchy(String),
    #[error("the lattice has {nodes} nodes (rule: at most {max})", max = MAX_LATTICE)]
    LatticeTooLarge { nodes: u64 },
    #[error(
        "the quasi-identifiers' level codes need {bits} bits (rule: at most 128; use fewer or smaller quasi-identifiers)"
    )]
    KeyTooWide { bits: u32 },
    #[error(
        "no node of the lattice is anonymous with at most {max_suppression} of the rows suppressed ({model})"
    )]
    NoAnonymousNode { max_suppression: f64, model: String },
    #[error("max_suppression = {0}: it must lie in [0, 1]")]
    MaxSuppression(f64),
    #[error("cancelled")]
    Cancelled,
}

/// OLA's answer.
#[derive(Debug, Clone)]
pub struct OlaResult {
    /// The chosen node: a level per QI.
    pub levels: Vec<usize>,
    /// Its loss under the metric.
    pub loss: f64,
    /// The release, cell by cell (suppressed rows flagged).
    pub recoding: Recoding,
    pub lattice_size: u64,
    pub nodes_checked: u64,
}

/// One attribute's hierarchy as OLA uses it.
struct Attribute {
    height: usize,
    /// `codes[level][leaf]`: dense index of the leaf's ancestor among the nodes of that level.
    codes: Vec<Vec<u32>>,
    /// `cost[level][leaf]`: the entropy cost log2(n(ancestor) / n(leaf)) of a cell of that leaf.
    cost: Vec<Vec<f64>>,
    /// `widths[level]`: how many dense codes that level has.
    widths: Vec<u32>,
    shift: u32,
}

/// A node check's outcome.
#[derive(Debug, Clone)]
struct Check {
    /// Rows in classes violating the monotone (tagging) models.
    violating_tag: u64,
    /// Whether the node is anonymous under the full definition.
    anonymous: bool,
    /// Whether the monotone release criteria hold on its kept classes.
    release_monotone_ok: bool,
    /// Σ |E|² over every class (suppressed ones included).
    dm_all: f64,
    /// The node's loss (meaningful when anonymous).
    loss: f64,
}

/// How many nodes' partitions [`Search::classes`] keeps to coarsen from (the most recent ones).
const KEPT_PARTITIONS: usize = 32;

/// The most cells of the table [`Search::classes`] indexes by a node's mixed-radix tuple key (4 bytes
/// each) instead of hashing the keys.
const DENSE_CELLS: usize = 1 << 22;

/// The classes of one checked node: the class of each distinct tuple and a tuple of each class.
struct Partition {
    node: Vec<usize>,
    class_of: Vec<u32>,
    representatives: Vec<u32>,
}

struct Search<'a> {
    n: u64,
    d: usize,
    attributes: Vec<Attribute>,
    /// Distinct QI tuples: leaves (flat, d per tuple), counts, sparse sensitive histograms.
    leaves: Vec<u32>,
    counts: Vec<u64>,
    hist_offsets: Vec<usize>,
    hist_cells: Vec<(u32, u32)>,
    tuple_of_row: Vec<u32>,
    m: usize,
    distribution: SensitiveDistribution,
    all: ModelSet,
    tag: ModelSet,
    needs_histograms: bool,
    limit: u64,
    /// Whether the full anonymity condition is monotone (no suppression, every release criterion
    /// monotone): tags use it and the optimum is a k-minimal node.
    monotone: bool,
    metric: Metric,
    radices: Vec<u64>,
    checks: FastMap<u64, Check>,
    tagged_anonymous: Vec<Vec<usize>>,
    tagged_not: Vec<Vec<usize>>,
    /// The tag of every node already decided, by lattice index (a tag never changes once known).
    decided: FastMap<u64, bool>,
    /// Recently computed partitions, coarsened into the partitions of nodes above them.
    partitions: Vec<Partition>,
    /// Scratch table of [`Search::classes`]'s dense path, reused across nodes.
    dense: Vec<u32>,
    cancelled: &'a AtomicBool,
}

/// Runs OLA (see the module doc).
pub fn ola(
    table: &Table,
    privacy: &PrivacySpec,
    metric: Metric,
    max_suppression: f64,
) -> Result<OlaResult, OlaError> {
    ola_unless(
        table,
        privacy,
        metric,
        max_suppression,
        &AtomicBool::new(false),
    )
}

/// The lattice size of a table's QIs (product of hierarchy heights), if all have hierarchies.
pub fn lattice_size(table: &Table) -> Result<u64, OlaError> {
    let mut size = 1u64;
    for q in &table.quasi {
        let QuasiAttribute::Categorical(h) = &q.attribute else {
            return Err(OlaError::NeedsHierarchy(q.name.clone()));
        };
        size = size.saturating_mul(h.height() as u64);
    }
    Ok(size)
}

/// [`ola`], giving up with [`OlaError::Cancelled`] soon after `cancelled` turns true.
pub fn ola_unless(
    table: &Table,
    privacy: &PrivacySpec,
    metric: Metric,
    max_suppression: f64,
    cancelled: &AtomicBool,
) -> Result<OlaResult, OlaError> {
    if !(0.0..=1.0).contains(&max_suppression) {
        return Err(OlaError::MaxSuppression(max_suppression));
    }
    let size = lattice_size(table)?;
    if size > MAX_LATTICE {
        return Err(OlaError::LatticeTooLarge { nodes: size });
    }
    let n = table.rows() as u64;
    let limit = (max_suppression * n as f64 + 1e-9).floor() as u64;
    let mut search = Search::new(table, privacy, metric, limit, cancelled)?;
    let d = search.d;
    let bottom = vec![0usize; d];
    let top: Vec<usize> = search.attributes.iter().map(|a| a.height - 1).collect();
    let mut kmin: Vec<Vec<usize>> = Vec::new();
    search.kmin(&bottom, &top, &mut kmin)?;
    // Keep the k-minimal nodes: drop any that lies above another.
    kmin.sort();
    kmin.dedup();
    let minimal: Vec<Vec<usize>> = kmin
        .iter()
        .filter(|a| !kmin.iter().any(|b| b != *a && leq(b, a)))
        .cloned()
        .collect();
    let mut best: Option<(f64, Vec<usize>)> = None;
    if search.monotone {
        // Every model and metric is monotone: the optimum is k-minimal.
        for node in &minimal {
            let check = search.check(node)?;
            if check.anonymous && best.as_ref().is_none_or(|(l, _)| check.loss < *l) {
                best = Some((check.loss, node.clone()));
            }
        }
    } else {
        let mut candidates: Vec<(f64, u64, Vec<usize>)> = Vec::new();
        for index in 0..size {
            let node = search.node_of(index);
            if minimal.iter().any(|b| leq(b, &node)) {
                candidates.push((search.bound(&node), index, node));
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, _, node) in candidates {
            // The DM bound grows as nodes are checked: recompute it.
            let bound = search.bound(&node);
            if best.as_ref().is_some_and(|(l, _)| bound >= *l) {
                continue;
            }
            let check = search.check(&node)?;
            if check.anonymous && best.as_ref().is_none_or(|(l, _)| check.loss < *l) {
                best = Some((check.loss, node.clone()));
            }
        }
    }
    let Some((loss, levels)) = best else {
        return Err(OlaError::NoAnonymousNode {
            max_suppression,
            model: search.all.all_names().join(", "),
        });
    };
    let recoding = search.recoding(table, &levels);
    Ok(OlaResult {
        levels,
        loss,
        recoding,
        lattice_size: size,
        nodes_checked: search.checks.len() as u64,
    })
}

/// `a <= b` in the lattice (every level).
fn leq(a: &[usize], b: &[usize]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y)
}

impl<'a> Search<'a> {
    fn new(
        table: &Table,
        privacy: &PrivacySpec,
        metric: Metric,
        limit: u64,
        cancelled: &'a AtomicBool,
    ) -> Result<Search<'a>, OlaError> {
        let n = table.rows() as u64;
        let d = table.quasi.len();
        let mut attributes = Vec::with_capacity(d);
        let mut shift = 0u32;
        for q in &table.quasi {
            let QuasiAttribute::Categorical(h) = &q.attribute else {
                return Err(OlaError::NeedsHierarchy(q.name.clone()));
            };
            let leaves = h.leaf_count();
            let mut of_leaf = vec![0u64; leaves];
            for &c in &q.codes {
                of_leaf[c as usize] += 1;
            }
            let mut codes = Vec::with_capacity(h.height());
            let mut cost = Vec::with_capacity(h.height());
            let mut widths = Vec::with_capacity(h.height());
            for level in 0..h.height() {
                let mut dense: HashMap<u32, u32> = HashMap::new();
                let mut under: Vec<u64> = Vec::new();
                let level_codes: Vec<u32> = (0..leaves as u32)
                    .map(|leaf| {
                        let node = h.ancestor(leaf, level);
                        let next = dense.len() as u32;
                        let code = *dense.entry(node).or_insert(next);
                        if code as usize == under.len() {
                            under.push(0);
                        }
                        under[code as usize] += of_leaf[leaf as usize];
                        code
                    })
                    .collect();
                cost.push(
                    (0..leaves)
                        .map(|leaf| {
                            let a = of_leaf[leaf];
                            if a == 0 {
                                0.0
                            } else {
                                (under[level_codes[leaf] as usize] as f64 / a as f64).log2()
                            }
                        })
                        .collect(),
                );
                codes.push(level_codes);
                widths.push(under.len() as u32);
            }
            let bits = u32::BITS - (leaves.max(2) as u32 - 1).leading_zeros();
            attributes.push(Attribute {
                height: h.height(),
                codes,
                cost,
                widths,
                shift,
            });
            shift += bits;
        }
        if shift > 128 {
            return Err(OlaError::KeyTooWide { bits: shift });
        }
        // Distinct QI tuples with counts and sensitive histograms.
        let mut tuple_of_key: FastMap<u128, u32> = FastMap::default();
        let mut leaves: Vec<u32> = Vec::new();
        let mut counts: Vec<u64> = Vec::new();
        let mut tuple_of_row = Vec::with_capacity(n as usize);
        let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(n as usize);
        for r in 0..n as usize {
            let mut key = 0u128;
            for (q, a) in table.quasi.iter().zip(&attributes) {
                key |= (q.codes[r] as u128) << a.shift;
            }
            let next = counts.len() as u32;
            let t = *tuple_of_key.entry(key).or_insert(next);
            if t == next {
                counts.push(0);
                leaves.extend(table.quasi.iter().map(|q| q.codes[r]));
            }
            counts[t as usize] += 1;
            tuple_of_row.push(t);
            pairs.push((t, table.sensitive.codes[r]));
        }
        pairs.sort_unstable();
        let mut hist_offsets = Vec::with_capacity(counts.len() + 1);
        let mut hist_cells: Vec<(u32, u32)> = Vec::new();
        let mut next = 0;
        for t in 0..counts.len() as u32 {
            hist_offsets.push(hist_cells.len());
            while let Some(&(pt, s)) = pairs.get(next) {
                if pt != t {
                    break;
                }
                let fresh = hist_cells.len() == hist_offsets[t as usize];
                match hist_cells.last_mut() {
                    Some(cell) if !fresh && cell.0 == s => cell.1 += 1,
                    _ => hist_cells.push((s, 1)),
                }
                next += 1;
            }
        }
        hist_offsets.push(hist_cells.len());
        let tag_spec = if limit == 0 {
            privacy.clone()
        } else {
            PrivacySpec {
                k: privacy.k,
                l: privacy.l.filter(|l| matches!(l, LDiversity::Distinct(_))),
                t: None,
                delta: None,
                risk: RiskBounds {
                    highest: privacy.risk.highest,
                    ..RiskBounds::default()
                },
            }
        };
        let mut radices = Vec::with_capacity(d);
        let mut product = 1u64;
        for a in &attributes {
            radices.push(product);
            product *= a.height as u64;
        }
        let all = privacy.models();
        Ok(Search {
            n,
            d,
            attributes,
            leaves,
            counts,
            hist_offsets,
            hist_cells,
            tuple_of_row,
            m: table.sensitive.domain.len(),
            distribution: table.sensitive_distribution(),
            monotone: limit == 0 && all.release_monotone(),
            all,
            tag: tag_spec.models(),
            needs_histograms: privacy.l.is_some() || privacy.t.is_some() || privacy.delta.is_some(),
            limit,
            metric,
            radices,
            checks: FastMap::default(),
            tagged_anonymous: Vec::new(),
            tagged_not: Vec::new(),
            decided: FastMap::default(),
            partitions: Vec::new(),
            dense: Vec::new(),
            cancelled,
        })
    }

    fn index(&self, node: &[usize]) -> u64 {
        node.iter()
            .zip(&self.radices)
            .map(|(&l, &r)| l as u64 * r)
            .sum()
    }

    fn node_of(&self, index: u64) -> Vec<usize> {
        self.attributes
            .iter()
            .zip(&self.radices)
            .map(|(a, &r)| ((index / r) % a.height as u64) as usize)
            .collect()
    }

    /// The strides of the mixed-radix cell of a tuple at `node` and the number of cells, when that
    /// number is at most [`DENSE_CELLS`].
    fn dense_strides(&self, node: &[usize]) -> Option<(Vec<usize>, usize)> {
        let mut strides = Vec::with_capacity(self.d);
        let mut cells = 1usize;
        for (a, &level) in self.attributes.iter().zip(node) {
            strides.push(cells);
            cells = cells.checked_mul(a.widths[level] as usize)?;
            if cells > DENSE_CELLS {
                return None;
            }
        }
        Some((strides, cells))
    }

    /// The tuple key of tuple `t` at `node` (its ancestors' dense codes, packed).
    fn key(&self, t: usize, node: &[usize]) -> u128 {
        let leaves = &self.leaves[t * self.d..(t + 1) * self.d];
        let mut key = 0u128;
        for ((a, &leaf), &level) in self.attributes.iter().zip(leaves).zip(node) {
            key |= (a.codes[level][leaf as usize] as u128) << a.shift;
        }
        key
    }

    /// Classes of the tuples at `node`: the class of each tuple (numbered by first appearance in
    /// tuple order) and the size of each class.
    ///
    /// A node's classes are unions of the classes of any node below it, so when a partition of a
    /// node below is kept, only one representative tuple per class of it is hashed; otherwise every
    /// distinct tuple is looked up, in a table indexed by its mixed-radix key where the node has at
    /// most [`DENSE_CELLS`] keys, else by hashing.
    fn classes(&mut self, node: &[usize]) -> (Vec<u32>, Vec<u64>) {
        let below = self
            .partitions
            .iter()
            .filter(|p| leq(&p.node, node))
            .min_by_key(|p| p.representatives.len());
        let mut class_of_key: FastMap<u128, u32> = FastMap::default();
        let (unnumbered, classes): (Vec<u32>, usize) = match below {
            Some(p) => {
                let coarse: Vec<u32> = p
                    .representatives
                    .iter()
                    .map(|&t| {
                        let next = class_of_key.len() as u32;
                        *class_of_key
                            .entry(self.key(t as usize, node))
                            .or_insert(next)
                    })
                    .collect();
                let class_of = p.class_of.iter().map(|&c| coarse[c as usize]).collect();
                (class_of, class_of_key.len())
            }
            None => match self.dense_strides(node) {
                // Few enough tuple keys at this node: index a table by the mixed-radix key.
                Some((strides, cells)) => {
                    // Every cell is u32::MAX between calls: only the cells used are reset.
                    let mut table = std::mem::take(&mut self.dense);
                    if table.len() < cells {
                        table.resize(cells, u32::MAX);
                    }
                    let mut used = Vec::new();
                    let class_of = (0..self.counts.len())
                        .map(|t| {
                            let leaves = &self.leaves[t * self.d..(t + 1) * self.d];
                            let mut cell = 0usize;
                            for (((a, &leaf), &level), &stride) in
                                self.attributes.iter().zip(leaves).zip(node).zip(&strides)
                            {
                                cell += a.codes[level][leaf as usize] as usize * stride;
                            }
                            let slot = &mut table[cell];
                            if *slot == u32::MAX {
                                *slot = used.len() as u32;
                                used.push(cell);
                            }
                            *slot
                        })
                        .collect();
                    for &cell in &used {
                        table[cell] = u32::MAX;
                    }
                    self.dense = table;
                    (class_of, used.len())
                }
                None => {
                    let class_of = (0..self.counts.len())
                        .map(|t| {
                            let next = class_of_key.len() as u32;
                            *class_of_key.entry(self.key(t, node)).or_insert(next)
                        })
                        .collect();
                    (class_of, class_of_key.len())
                }
            },
        };
        // Number the classes by first appearance in tuple order, as a direct pass would.
        let mut number = vec![u32::MAX; classes];
        let mut sizes: Vec<u64> = Vec::with_capacity(classes);
        let mut representatives = Vec::with_capacity(classes);
        let class_of: Vec<u32> = unnumbered
            .iter()
            .zip(&self.counts)
            .enumerate()
            .map(|(t, (&c, &count))| {
                if number[c as usize] == u32::MAX {
                    number[c as usize] = sizes.len() as u32;
                    sizes.push(0);
                    representatives.push(t as u32);
                }
                let c = number[c as usize];
                sizes[c as usize] += count;
                c
            })
            .collect();
        if self.partitions.len() == KEPT_PARTITIONS {
            self.partitions.remove(0);
        }
        self.partitions.push(Partition {
            node: node.to_vec(),
            class_of: class_of.clone(),
            representatives,
        });
        (class_of, sizes)
    }

    /// Per class: (satisfies the tagging models, satisfies every model); and whether the union of
    /// the classes violating some model satisfies every model (true when there is none).
    fn admissions(&self, class_of: &[u32], sizes: &[u64]) -> (Vec<(bool, bool)>, bool) {
        let classes = sizes.len();
        if !self.needs_histograms {
            let admitted: Vec<(bool, bool)> = sizes
                .iter()
                .map(|&size| {
                    let c = ClassCounts { size, counts: &[] };
                    (
                        self.tag.admits(&c, &self.distribution),
                        self.all.admits(&c, &self.distribution),
                    )
                })
                .collect();
            let suppressed: u64 = sizes
                .iter()
                .zip(&admitted)
                .filter(|(_, a)| !a.1)
                .map(|(s, _)| s)
                .sum();
            let c = ClassCounts {
                size: suppressed,
                counts: &[],
            };
            return (
                admitted,
                suppressed == 0 || self.all.admits(&c, &self.distribution),
            );
        }
        // Tuples grouped by class (counting sort), one dense histogram reused per class.
        let mut offsets = vec![0usize; classes + 1];
        for &c in class_of {
            offsets[c as usize + 1] += 1;
        }
        for c in 0..classes {
            offsets[c + 1] += offsets[c];
        }
        let mut next = offsets.clone();
        let mut order = vec![0u32; class_of.len()];
        for (t, &c) in class_of.iter().enumerate() {
            order[next[c as usize]] = t as u32;
            next[c as usize] += 1;
        }
        let mut counts = vec![0u32; self.m];
        let mut suppressed_counts = vec![0u32; self.m];
        let mut suppressed = 0u64;
        let mut admitted = Vec::with_capacity(classes);
        for c in 0..classes {
            let tuples = &order[offsets[c]..offsets[c + 1]];
            for &t in tuples {
                for &(s, k) in self.histogram(t as usize) {
                    counts[s as usize] += k;
                }
            }
            let class = ClassCounts {
                size: sizes[c],
                counts: &counts,
            };
            let a = (
                self.tag.admits(&class, &self.distribution),
                self.all.admits(&class, &self.distribution),
            );
            for &t in tuples {
                for &(s, k) in self.histogram(t as usize) {
                    if !a.1 {
                        suppressed_counts[s as usize] += k;
                    }
                    counts[s as usize] = 0;
                }
            }
            if !a.1 {
                suppressed += sizes[c];
            }
            admitted.push(a);
        }
        let union = ClassCounts {
            size: suppressed,
            counts: &suppressed_counts,
        };
        (
            admitted,
            suppressed == 0 || self.all.admits(&union, &self.distribution),
        )
    }

    fn histogram(&self, t: usize) -> &[(u32, u32)] {
        &self.hist_cells[self.hist_offsets[t]..self.hist_offsets[t + 1]]
    }

    /// Checks a node (once; later calls return the cached outcome).
    fn check(&mut self, node: &[usize]) -> Result<Check, OlaError> {
        let index = self.index(node);
        if let Some(check) = self.checks.get(&index) {
            return Ok(check.clone());
        }
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(OlaError::Cancelled);
        }
        let (class_of, sizes) = self.classes(node);
        let (admitted, union_ok) = self.admissions(&class_of, &sizes);
        let violating_tag: u64 = sizes
            .iter()
            .zip(&admitted)
            .filter(|(_, a)| !a.0)
            .map(|(s, _)| s)
            .sum();
        let suppressed: u64 = sizes
            .iter()
            .zip(&admitted)
            .filter(|(_, a)| !a.1)
            .map(|(s, _)| s)
            .sum();
        let (release_ok, release_monotone_ok) = self.all.release_holds(
            sizes
                .iter()
                .zip(&admitted)
                .filter(|(_, a)| a.1)
                .map(|(&s, _)| s),
        );
        let anonymous = suppressed <= self.limit && union_ok && release_ok;
        let dm_all: f64 = sizes.iter().map(|&s| (s * s) as f64).sum();
        let loss = match self.metric {
            Metric::Dm => {
                sizes
                    .iter()
                    .zip(&admitted)
                    .filter(|(_, a)| a.1)
                    .map(|(&s, _)| (s * s) as f64)
                    .sum::<f64>()
                    + (suppressed * self.n) as f64
            }
            Metric::Prec => {
                let share: f64 = self
                    .attributes
                    .iter()
                    .zip(node)
                    .map(|(a, &l)| l as f64 / (a.height - 1) as f64)
                    .sum();
                let d = self.d as f64;
                ((self.n - suppressed) as f64 * share + suppressed as f64 * d) / (self.n as f64 * d)
            }
            Metric::Entropy => {
                let mut sum = 0.0;
                for (t, &count) in self.counts.iter().enumerate() {
                    let kept = admitted[class_of[t] as usize].1;
                    let leaves = &self.leaves[t * self.d..(t + 1) * self.d];
                    for ((a, &leaf), &level) in self.attributes.iter().zip(leaves).zip(node) {
                        let level = if kept { level } else { a.height - 1 };
                        sum += count as f64 * a.cost[level][leaf as usize];
                    }
                }
                sum
            }
        };
        let check = Check {
            violating_tag,
            anonymous,
            release_monotone_ok,
            dm_all,
            loss,
        };
        self.checks.insert(index, check.clone());
        Ok(check)
    }

    /// The tagging property: anonymous under the monotone models (see the module doc).
    fn tagged(&self, node: &[usize]) -> Option<bool> {
        if self.tagged_anonymous.iter().any(|a| leq(a, node)) {
            return Some(true);
        }
        if self.tagged_not.iter().any(|x| leq(node, x)) {
            return Some(false);
        }
        None
    }

    fn is_anonymous(&mut self, node: &[usize]) -> Result<bool, OlaError> {
        let index = self.index(node);
        if let Some(&known) = self.decided.get(&index) {
            return Ok(known);
        }
        if let Some(known) = self.tagged(node) {
            self.decided.insert(index, known);
            return Ok(known);
        }
        let check = self.check(node)?;
        let anonymous = if self.monotone {
            check.anonymous
        } else if self.limit == 0 {
            check.violating_tag == 0 && check.release_monotone_ok
        } else {
            check.violating_tag <= self.limit
        };
        if anonymous {
            self.tagged_anonymous.push(node.to_vec());
        } else {
            self.tagged_not.push(node.to_vec());
        }
        self.decided.insert(index, anonymous);
        Ok(anonymous)
    }

    /// El Emam et al.'s Kmin: the lowest anonymous nodes of the sub-lattice [b, t].
    fn kmin(
        &mut self,
        b: &[usize],
        t: &[usize],
        found: &mut Vec<Vec<usize>>,
    ) -> Result<(), OlaError> {
        let height: usize = t.iter().zip(b).map(|(x, y)| x - y).sum();
        if height > 1 {
            let half = height / 2;
            let mut middle = Vec::new();
            nodes_at(b, t, half, &mut b.to_vec(), 0, &mut middle);
            for p in middle {
                if self.is_anonymous(&p)? {
                    self.kmin(b, &p, found)?;
                } else {
                    self.kmin(&p, t, found)?;
                }
            }
        } else if self.is_anonymous(b)? {
            found.push(b.to_vec());
        } else if self.is_anonymous(t)? {
            found.push(t.to_vec());
        }
        Ok(())
    }

    /// A lower bound of the loss of `node` and of every node above it.
    fn bound(&self, node: &[usize]) -> f64 {
        match self.metric {
            Metric::Prec => {
                let share: f64 = self
                    .attributes
                    .iter()
                    .zip(node)
                    .map(|(a, &l)| l as f64 / (a.height - 1) as f64)
                    .sum();
                share / self.d as f64
            }
            Metric::Entropy => {
                let mut sum = 0.0;
                for (t, &count) in self.counts.iter().enumerate() {
                    let leaves = &self.leaves[t * self.d..(t + 1) * self.d];
                    for ((a, &leaf), &level) in self.attributes.iter().zip(leaves).zip(node) {
                        sum += count as f64 * a.cost[level][leaf as usize];
                    }
                }
                sum
            }
            Metric::Dm => self
                .checks
                .iter()
                .filter(|(index, _)| leq(&self.node_of(**index), node))
                .map(|(_, c)| c.dm_all)
                .fold(self.n as f64, f64::max),
        }
    }

    /// The recoding of the table at `node`, rows of violating classes suppressed.
    fn recoding(&mut self, table: &Table, node: &[usize]) -> Recoding {
        let (class_of, sizes) = self.classes(node);
        let (admitted, _) = self.admissions(&class_of, &sizes);
        let suppressed = self
            .tuple_of_row
            .iter()
            .map(|&t| !admitted[class_of[t as usize] as usize].1)
            .collect();
        let cells = table
            .quasi
            .iter()
            .zip(node)
            .map(|(q, &level)| {
                let QuasiAttribute::Categorical(h) = &q.attribute else {
                    unreachable!("checked in Search::new")
                };
                q.codes
                    .iter()
                    .map(|&leaf| Cell::Node(h.ancestor(leaf, level)))
                    .collect()
            })
            .collect();
        Recoding { cells, suppressed }
    }
}

/// The nodes `v` with `b <= v <= t` and Σ (v − b) = `height`, in lexicographic order.
fn nodes_at(
    b: &[usize],
    t: &[usize],
    height: usize,
    current: &mut Vec<usize>,
    j: usize,
    out: &mut Vec<Vec<usize>>,
) {
    if j == b.len() {
        if height == 0 {
            out.push(current.clone());
        }
        return;
    }
    let rest: usize = (j + 1..b.len()).map(|i| t[i] - b[i]).sum();
    for step in 0..=(t[j] - b[j]).min(height) {
        if height - step > rest {
            continue;
        }
        current[j] = b[j] + step;
        nodes_at(b, t, height - step, current, j + 1, out);
    }
    current[j] = b[j];
}
