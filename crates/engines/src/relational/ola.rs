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
//! Checking a node takes its equivalence classes from [`crate::relational::groupify`]: rolled up from
//! the classes of a checked node below it (or from the table's distinct QI tuples), one hash lookup
//! of a packed key per finer class. DM and the suppressed counts are exact integers and the
//! non-uniform entropy a fixed-point integer sum, so a node's loss does not depend on the order its
//! classes are met in (ties still go to the node found first). Every QI needs a hierarchy (numeric
//! columns without one are refused: OLA's lattice is made of hierarchy levels).
//!
//! Invariants: the returned node is anonymous as defined above (the release is checked again by the
//! caller from the released rows); the engine is pure and deterministic; [`ola_unless`] looks at the
//! cancellation flag before each node check.
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::relational::groupify::{ClassTable, ENTROPY_SCALE, EncodeError, Encoded, leq};
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

/// A node check's outcome.
#[derive(Debug, Clone)]
struct Check {
    /// Rows in classes violating the monotone (tagging) models.
    violating_tag: u64,
    /// Whether the node is anonymous under the full definition.
    anonymous: bool,
    /// Whether the monotone release criteria hold on its kept classes.
    release_monotone_ok: bool,
    /// The node's loss (meaningful when anonymous).
    loss: f64,
}

/// The search's state: the encoded table, the checks made and the tags decided.
struct Search<'a> {
    n: u64,
    d: usize,
    encoded: Encoded,
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
    /// Every checked node and its Σ |E|², in check order (for the DM bound).
    checked: Vec<(Vec<usize>, f64)>,
    tagged_anonymous: Vec<Vec<usize>>,
    tagged_not: Vec<Vec<usize>>,
    /// The tag of every node already decided, by lattice index (a tag never changes once known).
    decided: FastMap<u64, bool>,
    /// The sub-lattices `[b, t]` Kmin has already searched, by their ends' lattice indices: the
    /// tag is a fixed monotone predicate, so a second search finds the same nodes.
    searched: HashSet<(u64, u64), foldhash::fast::FixedState>,
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
    let top: Vec<usize> = search
        .encoded
        .attributes
        .iter()
        .map(|a| a.height - 1)
        .collect();
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
        let dm_bounds = (metric == Metric::Dm).then(|| search.dm_bounds(size));
        for index in 0..size {
            let node = search.node_of(index);
            if minimal.iter().any(|b| leq(b, &node)) {
                let bound = match &dm_bounds {
                    Some(bounds) => bounds[index as usize],
                    None => search.bound(&node),
                };
                candidates.push((bound, index, node));
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let checked_before = search.checked.len();
        for (first, _, node) in candidates {
            // The DM bound grows as nodes are checked: add the nodes checked since.
            let bound = search.bound_since(&node, first, checked_before);
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

impl<'a> Search<'a> {
    fn new(
        table: &Table,
        privacy: &PrivacySpec,
        metric: Metric,
        limit: u64,
        cancelled: &'a AtomicBool,
    ) -> Result<Search<'a>, OlaError> {
        let needs_histograms =
            privacy.l.is_some() || privacy.t.is_some() || privacy.delta.is_some();
        let encoded = Encoded::new(table, needs_histograms).map_err(|e| match e {
            EncodeError::NeedsHierarchy(name) => OlaError::NeedsHierarchy(name),
            EncodeError::KeyTooWide(bits) => OlaError::KeyTooWide { bits },
        })?;
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
        let mut radices = Vec::with_capacity(encoded.d);
        let mut product = 1u64;
        for a in &encoded.attributes {
            radices.push(product);
            product *= a.height as u64;
        }
        let all = privacy.models();
        Ok(Search {
            n: table.rows() as u64,
            d: encoded.d,
            encoded,
            distribution: table.sensitive_distribution(),
            monotone: limit == 0 && all.release_monotone(),
            all,
            tag: tag_spec.models(),
            needs_histograms,
            limit,
            metric,
            radices,
            checks: FastMap::default(),
            checked: Vec::new(),
            tagged_anonymous: Vec::new(),
            tagged_not: Vec::new(),
            decided: FastMap::default(),
            searched: HashSet::default(),
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
        self.encoded
            .attributes
            .iter()
            .zip(&self.radices)
            .map(|(a, &r)| ((index / r) % a.height as u64) as usize)
            .collect()
    }

    /// Per class: (satisfies the tagging models, satisfies every model); and whether the union of
    /// the classes violating some model satisfies every model (true when there is none).
    fn admissions(&self, classes: &ClassTable) -> (Vec<(bool, bool)>, bool) {
        let m = self.encoded.m;
        if !self.needs_histograms {
            let admitted: Vec<(bool, bool)> = classes
                .sizes
                .iter()
                .map(|&size| {
                    let c = ClassCounts { size, counts: &[] };
                    (
                        self.tag.admits(&c, &self.distribution),
                        self.all.admits(&c, &self.distribution),
                    )
                })
                .collect();
            let suppressed: u64 = classes
                .sizes
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
        let mut suppressed_counts = vec![0u32; m];
        let mut suppressed = 0u64;
        let mut admitted = Vec::with_capacity(classes.len());
        let mut admit = |size: u64, counts: &[u32]| {
            let class = ClassCounts { size, counts };
            let a = (
                self.tag.admits(&class, &self.distribution),
                self.all.admits(&class, &self.distribution),
            );
            if !a.1 {
                suppressed += size;
                for (to, &k) in suppressed_counts.iter_mut().zip(counts) {
                    *to += k;
                }
            }
            admitted.push(a);
        };
        if classes.histograms.is_some() {
            for (c, &size) in classes.sizes.iter().enumerate() {
                admit(size, classes.histogram(c, m).unwrap_or_default());
            }
        } else {
            // Too many classes × sensitive values to keep: tuples grouped by class (counting
            // sort), one dense histogram reused per class.
            let class_of = self.encoded.class_of_tuples(classes);
            let count = classes.len();
            let mut offsets = vec![0usize; count + 1];
            for &c in &class_of {
                offsets[c as usize + 1] += 1;
            }
            for c in 0..count {
                offsets[c + 1] += offsets[c];
            }
            let mut next = offsets.clone();
            let mut order = vec![0u32; class_of.len()];
            for (t, &c) in class_of.iter().enumerate() {
                order[next[c as usize]] = t as u32;
                next[c as usize] += 1;
            }
            let mut counts = vec![0u32; m];
            for (c, &size) in classes.sizes.iter().enumerate() {
                let tuples = &order[offsets[c]..offsets[c + 1]];
                for &t in tuples {
                    for &(s, k) in self.encoded.sparse_histogram(t as usize) {
                        counts[s as usize] += k;
                    }
                }
                admit(size, &counts);
                counts.fill(0);
            }
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

    /// Checks a node (once; later calls return the cached outcome).
    fn check(&mut self, node: &[usize]) -> Result<Check, OlaError> {
        let index = self.index(node);
        if let Some(check) = self.checks.get(&index) {
            return Ok(check.clone());
        }
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(OlaError::Cancelled);
        }
        let classes = self.encoded.classes(node);
        let (admitted, union_ok) = self.admissions(&classes);
        let sizes = &classes.sizes;
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
        let dm_all = sizes.iter().map(|&s| s * s).sum::<u64>() as f64;
        let loss = match self.metric {
            Metric::Dm => {
                (sizes
                    .iter()
                    .zip(&admitted)
                    .filter(|(_, a)| a.1)
                    .map(|(&s, _)| s * s)
                    .sum::<u64>()
                    + suppressed * self.n) as f64
            }
            Metric::Prec => {
                let share: f64 = self
                    .encoded
                    .attributes
                    .iter()
                    .zip(node)
                    .map(|(a, &l)| l as f64 / (a.height - 1) as f64)
                    .sum();
                let d = self.d as f64;
                ((self.n - suppressed) as f64 * share + suppressed as f64 * d) / (self.n as f64 * d)
            }
            Metric::Entropy => {
                // Σ over rows of Σ_j log2 (rows under the ancestor / rows of the leaf), the
                // ancestor at the top for suppressed rows: the classes' part plus the leaves' part.
                let ancestors: i128 = classes
                    .representatives
                    .iter()
                    .zip(sizes)
                    .zip(&admitted)
                    .map(|((&rep, &size), a)| {
                        size as i128 * self.encoded.class_entropy(rep, node, !a.1) as i128
                    })
                    .sum();
                (ancestors - self.encoded.leaf_entropy) as f64 / ENTROPY_SCALE
            }
        };
        self.encoded.keep(classes);
        let check = Check {
            violating_tag,
            anonymous,
            release_monotone_ok,
            loss,
        };
        self.checks.insert(index, check.clone());
        self.checked.push((node.to_vec(), dm_all));
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
        // The tags stay antichains: a tag implied by the new one goes.
        if anonymous {
            self.tagged_anonymous.retain(|a| !leq(node, a));
            self.tagged_anonymous.push(node.to_vec());
        } else {
            self.tagged_not.retain(|x| !leq(x, node));
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
        if !self.searched.insert((self.index(b), self.index(t))) {
            return Ok(());
        }
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

    /// [`Search::bound`] given `bound`, the bound of `node` when `from` nodes had been checked.
    fn bound_since(&self, node: &[usize], bound: f64, from: usize) -> f64 {
        match self.metric {
            Metric::Dm => self.checked[from..]
                .iter()
                .filter(|(below, _)| leq(below, node))
                .map(|(_, dm)| *dm)
                .fold(bound, f64::max),
            Metric::Prec | Metric::Entropy => bound,
        }
    }

    /// [`Search::bound`] under DM for every node, by lattice index: the largest Σ |E|² of a checked
    /// node at or below it, found by one pass in index order (a node's immediate predecessors, one
    /// level lower in one attribute, have smaller indices).
    fn dm_bounds(&self, size: u64) -> Vec<f64> {
        let checked: FastMap<u64, f64> = self
            .checked
            .iter()
            .map(|(node, dm)| (self.index(node), *dm))
            .collect();
        let mut bounds = vec![self.n as f64; size as usize];
        let mut node = vec![0usize; self.d];
        for index in 0..size as usize {
            let mut bound = checked
                .get(&(index as u64))
                .copied()
                .unwrap_or(self.n as f64);
            for (j, &level) in node.iter().enumerate() {
                if level > 0 {
                    bound = bound.max(bounds[index - self.radices[j] as usize]);
                }
            }
            bounds[index] = bound;
            // The next node in index order (the first attribute varies fastest).
            for (j, level) in node.iter_mut().enumerate() {
                *level += 1;
                if *level < self.encoded.attributes[j].height {
                    break;
                }
                *level = 0;
            }
        }
        bounds
    }

    /// A lower bound of the loss of `node` and of every node above it.
    fn bound(&self, node: &[usize]) -> f64 {
        match self.metric {
            Metric::Prec => {
                let share: f64 = self
                    .encoded
                    .attributes
                    .iter()
                    .zip(node)
                    .map(|(a, &l)| l as f64 / (a.height - 1) as f64)
                    .sum();
                share / self.d as f64
            }
            Metric::Entropy => self.encoded.entropy_unsuppressed(node) as f64 / ENTROPY_SCALE,
            Metric::Dm => self
                .checked
                .iter()
                .filter(|(below, _)| leq(below, node))
                .map(|(_, dm)| *dm)
                .fold(self.n as f64, f64::max),
        }
    }

    /// The recoding of the table at `node`, rows of violating classes suppressed.
    fn recoding(&mut self, table: &Table, node: &[usize]) -> Recoding {
        let classes = self.encoded.classes(node);
        let (admitted, _) = self.admissions(&classes);
        let class_of = self.encoded.class_of_tuples(&classes);
        let suppressed = self
            .encoded
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
