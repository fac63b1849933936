//! KACA, K-Anonymization by Clustering in Attribute hierarchies (Li, Wong, Fu & Pei, DaWaK 2006):
//! local recoding, each equivalence class generalized on its own to the closest common ancestors
//! of its members' values.
//!
//! Algorithm: the initial classes are the table's distinct QI tuples (every value at its leaf).
//! While some class violates a requested model, one of the violating classes is drawn uniformly at
//! random (from the seeded RNG), the live class nearest to it is found, and both are replaced by
//! their merge: the tuple of the per-attribute lowest common ancestors of their nodes. If another
//! live class already has that tuple, it joins the merge (rows with one released tuple are one
//! class). The distance of classes C1 (n1 rows) and C2 (n2 rows) with closest common generalization
//! C12 is the paper's n1 · Distortion(C1, C12) + n2 · Distortion(C2, C12), where Distortion sums
//! over the attributes the weighted hierarchical distance of the step from the class's level to the
//! common ancestor's, with height weights w_{j,j−1} = 1/(j−1)^β (the job's `beta`, default 1; the
//! same WHD the report's `whd_height` averages): a merge costs exactly the increase of the table's
//! total `whd_height`, and KACA is the greedy that takes the cheapest such step for the class drawn.
//! Ties go to the first class in the scan order (deterministic for a seed).
//!
//! Privacy models: the merge sees each class's size and sensitive histogram, so every model cloakd
//! has is checked on every class — k-anonymity, l-diversity (distinct, entropy, probabilistic,
//! recursive), t-closeness (EMD, JS) and delta-disclosure — and a class is *violating* when it fails
//! any of them. KACA continues merging until no class violates. This ends: every merge lowers the
//! number of classes, and the whole table, which one class becomes at worst, is checked first (a
//! model the whole table fails is refused as [`Unsatisfiable`], naming the model). Merging two
//! admitted classes gives an admitted class for every model (see [`crate::relational::ola`]), so
//! released classes that share labels are admitted too. Nothing is suppressed.
//!
//! Nearest-class search: classes are few compared with rows (Adult: 16,581 distinct tuples for
//! 45,222 rows with 8 QIs), so KACA works on the distinct tuples only. For the class drawn, the
//! common-ancestor level and the two costs against every node of every hierarchy are computed once
//! (a few hundred entries), after which each live class's distance is one table lookup and two
//! additions per attribute, abandoned as soon as the partial sum reaches the best distance found.
//! Live classes sit in dense arrays (removal by swap) and in a map from their tuple.
//!
//! Every QI needs a hierarchy (numeric ones through theirs, e.g. Adult's age; a numeric column
//! without one is refused). Invariants: pure (no clock, no files) and deterministic for a seed;
//! every row's cell is an ancestor-or-self of its leaf; every class of the result admits every
//! model (the caller checks the release again from its rows); [`kaca_unless`] looks at the
//! cancellation flag before each merge.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use rand::Rng;

use crate::relational::distortion::{Weights, whd};
use crate::relational::hierarchy::Hierarchy;
use crate::relational::models::{ClassCounts, ModelSet, PrivacySpec, SensitiveDistribution};
use crate::relational::mondrian::{Unsatisfiable, check_whole_table};
use crate::relational::recoding::{Cell, Recoding};
use crate::relational::table::{QuasiAttribute, Table};

type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// Why KACA found no release.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KacaError {
    #[error(
        "column {0:?} is numeric without a hierarchy (rule: KACA clusters in attribute hierarchies; give every quasi-identifier a hierarchy)"
    )]
    NeedsHierarchy(String),
    #[error(transparent)]
    Unsatisfiable(#[from] Unsatisfiable),
    #[error("cancelled")]
    Cancelled,
}

/// KACA's answer.
#[derive(Debug, Clone)]
pub struct KacaResult {
    /// The release, cell by cell (nothing suppressed).
    pub recoding: Recoding,
    /// Distinct QI tuples of the table (the initial classes).
    pub initial_classes: u64,
    /// Classes of the result.
    pub classes: u64,
    /// Merges performed.
    pub merges: u64,
}

/// One QI's hierarchy as KACA uses it.
struct Attribute<'h> {
    hierarchy: &'h Hierarchy,
    /// `cost[level]`: WHD (height weights) of a cell generalized from its leaf to `level`.
    cost: Vec<f64>,
    /// A leaf under each node (to find a node's ancestors).
    representative: Vec<u32>,
    /// Where this attribute's nodes start in the flat per-node tables.
    offset: usize,
}

/// A class by id; ids of merged classes point to the class they joined.
struct Class {
    size: u64,
    /// Sparse sensitive histogram, sorted by value (empty when no model needs it).
    histogram: Vec<(u32, u32)>,
    /// Live slot, or [`DEAD`].
    slot: u32,
    /// Position in the violating list, or [`DEAD`].
    violating: u32,
    /// The class this one was merged into (itself while live).
    parent: u32,
}

const DEAD: u32 = u32::MAX;

struct Kaca<'a> {
    d: usize,
    attributes: Vec<Attribute<'a>>,
    models: ModelSet,
    distribution: SensitiveDistribution,
    needs_histograms: bool,
    classes: Vec<Class>,
    /// Live classes: `d` global node indices per slot, their sizes and ids.
    live_nodes: Vec<u32>,
    live_size: Vec<u64>,
    live_id: Vec<u32>,
    by_tuple: FastMap<Vec<u32>, u32>,
    violating: Vec<u32>,
    /// Per-query tables over the global node indices: n1 · cost of the drawn class's side, the
    /// other side's cost per row, and the common ancestor (global index).
    near_cost: Vec<f64>,
    far_cost: Vec<f64>,
    common: Vec<u32>,
    scratch: Vec<u32>,
}

/// Runs KACA (see the module doc); `beta` is the exponent of the height weights of the distance.
pub fn kaca(
    table: &Table,
    privacy: &PrivacySpec,
    beta: f64,
    rng: &mut impl Rng,
) -> Result<KacaResult, KacaError> {
    kaca_unless(table, privacy, beta, rng, &AtomicBool::new(false))
}

/// [`kaca`], giving up with [`KacaError::Cancelled`] soon after `cancelled` turns true.
pub fn kaca_unless(
    table: &Table,
    privacy: &PrivacySpec,
    beta: f64,
    rng: &mut impl Rng,
    cancelled: &AtomicBool,
) -> Result<KacaResult, KacaError> {
    let mut state = Kaca::new(table, privacy, beta)?;
    check_whole_table(table, &state.models, &state.distribution)?;
    let tuple_of_row = state.initial_classes(table);
    let initial_classes = state.classes.len() as u64;
    let mut merges = 0u64;
    while !state.violating.is_empty() {
        if cancelled.load(Ordering::Relaxed) {
            return Err(KacaError::Cancelled);
        }
        let drawn = state.violating[rng.random_range(0..state.violating.len())];
        let Some(nearest) = state.nearest(drawn) else {
            // One class left, and it violates: only possible if the whole table does.
            let class = &state.classes[drawn as usize];
            let counts = state.dense(&class.histogram);
            let (model, reason) = state
                .models
                .violation(
                    &ClassCounts {
                        size: class.size,
                        counts: &counts,
                    },
                    &state.distribution,
                )
                .unwrap_or_default();
            return Err(Unsatisfiable { model, reason }.into());
        };
        state.merge(drawn, nearest);
        merges += 1;
    }
    let recoding = state.recoding(table, &tuple_of_row);
    Ok(KacaResult {
        recoding,
        initial_classes,
        classes: state.live_id.len() as u64,
        merges,
    })
}

impl<'a> Kaca<'a> {
    fn new(table: &'a Table, privacy: &PrivacySpec, beta: f64) -> Result<Kaca<'a>, KacaError> {
        let mut attributes = Vec::with_capacity(table.quasi.len());
        let mut offset = 0;
        for q in &table.quasi {
            let QuasiAttribute::Categorical(h) = &q.attribute else {
                return Err(KacaError::NeedsHierarchy(q.name.clone()));
            };
            let height = h.height();
            let cost = (0..height)
                .map(|level| whd(height, height - level, height, Weights::Height(beta)))
                .collect();
            let mut representative = vec![u32::MAX; h.node_count()];
            for leaf in 0..h.leaf_count() as u32 {
                for level in 0..height {
                    let node = h.ancestor(leaf, level) as usize;
                    if representative[node] == u32::MAX {
                        representative[node] = leaf;
                    }
                }
            }
            attributes.push(Attribute {
                hierarchy: h,
                cost,
                representative,
                offset,
            });
            offset += h.node_count();
        }
        Ok(Kaca {
            d: table.quasi.len(),
            attributes,
            models: privacy.models(),
            distribution: table.sensitive_distribution(),
            needs_histograms: privacy.l.is_some() || privacy.t.is_some() || privacy.delta.is_some(),
            classes: Vec::new(),
            live_nodes: Vec::new(),
            live_size: Vec::new(),
            live_id: Vec::new(),
            by_tuple: FastMap::default(),
            violating: Vec::new(),
            near_cost: vec![0.0; offset],
            far_cost: vec![0.0; offset],
            common: vec![0; offset],
            scratch: vec![0; table.sensitive.domain.len()],
        })
    }

    /// The distinct QI tuples as live classes; returns the initial class of every row.
    fn initial_classes(&mut self, table: &Table) -> Vec<u32> {
        let n = table.rows();
        let mut tuple = vec![0u32; self.d];
        let mut tuple_of_row = Vec::with_capacity(n);
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for r in 0..n {
            for ((t, q), a) in tuple.iter_mut().zip(&table.quasi).zip(&self.attributes) {
                *t = a.offset as u32 + a.hierarchy.ancestor(q.codes[r], 0);
            }
            let id = match self.by_tuple.get(tuple.as_slice()) {
                Some(&id) => id,
                None => {
                    let id = self.classes.len() as u32;
                    self.by_tuple.insert(tuple.clone(), id);
                    self.classes.push(Class {
                        size: 0,
                        histogram: Vec::new(),
                        slot: self.live_id.len() as u32,
                        violating: DEAD,
                        parent: id,
                    });
                    self.live_nodes.extend_from_slice(&tuple);
                    self.live_size.push(0);
                    self.live_id.push(id);
                    id
                }
            };
            self.classes[id as usize].size += 1;
            self.live_size[self.classes[id as usize].slot as usize] += 1;
            tuple_of_row.push(id);
            if self.needs_histograms {
                pairs.push((id, table.sensitive.codes[r]));
            }
        }
        pairs.sort_unstable();
        for (id, s) in pairs {
            let histogram = &mut self.classes[id as usize].histogram;
            match histogram.last_mut() {
                Some(cell) if cell.0 == s => cell.1 += 1,
                _ => histogram.push((s, 1)),
            }
        }
        for id in 0..self.classes.len() as u32 {
            self.update_violating(id);
        }
        tuple_of_row
    }

    /// The class's histogram as dense counts (in the scratch buffer's copy).
    fn dense(&self, histogram: &[(u32, u32)]) -> Vec<u32> {
        let mut counts = vec![0u32; self.scratch.len()];
        for &(s, c) in histogram {
            counts[s as usize] = c;
        }
        counts
    }

    fn admits(&mut self, id: u32) -> bool {
        let class = &self.classes[id as usize];
        if !self.needs_histograms {
            let c = ClassCounts {
                size: class.size,
                counts: &[],
            };
            return self.models.admits(&c, &self.distribution);
        }
        for &(s, c) in &class.histogram {
            self.scratch[s as usize] = c;
        }
        let admitted = self.models.admits(
            &ClassCounts {
                size: class.size,
                counts: &self.scratch,
            },
            &self.distribution,
        );
        for &(s, _) in &class.histogram {
            self.scratch[s as usize] = 0;
        }
        admitted
    }

    /// Puts a live class on the violating list or takes it off, as it admits the models or not.
    fn update_violating(&mut self, id: u32) {
        let violates = !self.admits(id);
        let listed = self.classes[id as usize].violating != DEAD;
        if violates && !listed {
            self.classes[id as usize].violating = self.violating.len() as u32;
            self.violating.push(id);
        } else if !violates && listed {
            self.unlist(id);
        }
    }

    fn unlist(&mut self, id: u32) {
        let position = self.classes[id as usize].violating;
        if position == DEAD {
            return;
        }
        self.violating.swap_remove(position as usize);
        if let Some(&moved) = self.violating.get(position as usize) {
            self.classes[moved as usize].violating = position;
        }
        self.classes[id as usize].violating = DEAD;
    }

    /// The live class nearest to `drawn` (not itself), if there is one.
    fn nearest(&mut self, drawn: u32) -> Option<u32> {
        let d = self.d;
        let slot = self.classes[drawn as usize].slot as usize;
        let n1 = self.live_size[slot] as f64;
        for (j, a) in self.attributes.iter().enumerate() {
            let u = self.live_nodes[slot * d + j] - a.offset as u32;
            let h = a.hierarchy;
            let (lu, ru) = (h.level(u), a.representative[u as usize]);
            for v in 0..h.node_count() as u32 {
                let (lv, rv) = (h.level(v), a.representative[v as usize]);
                let mut m = lu.max(lv);
                while h.ancestor(ru, m) != h.ancestor(rv, m) {
                    m += 1;
                }
                let g = a.offset + v as usize;
                self.near_cost[g] = n1 * (a.cost[m] - a.cost[lu]);
                self.far_cost[g] = a.cost[m] - a.cost[lv];
                self.common[g] = a.offset as u32 + h.ancestor(ru, m);
            }
        }
        let mut best = f64::INFINITY;
        let mut found = None;
        for (s, (nodes, &size)) in self
            .live_nodes
            .chunks_exact(d)
            .zip(&self.live_size)
            .enumerate()
        {
            if s == slot {
                continue;
            }
            let n2 = size as f64;
            let mut sum = 0.0;
            let mut closer = true;
            for &g in nodes {
                sum += self.near_cost[g as usize] + n2 * self.far_cost[g as usize];
                if sum >= best {
                    closer = false;
                    break;
                }
            }
            if closer {
                best = sum;
                found = Some(s);
            }
        }
        found.map(|s| self.live_id[s])
    }

    /// Takes a class out of the live arrays and the tuple map; returns its tuple.
    fn remove_live(&mut self, id: u32) -> Vec<u32> {
        let d = self.d;
        let slot = self.classes[id as usize].slot as usize;
        let tuple = self.live_nodes[slot * d..(slot + 1) * d].to_vec();
        let last = self.live_id.len() - 1;
        if slot != last {
            self.live_nodes
                .copy_within(last * d..(last + 1) * d, slot * d);
            self.live_size[slot] = self.live_size[last];
            self.live_id[slot] = self.live_id[last];
            self.classes[self.live_id[slot] as usize].slot = slot as u32;
        }
        self.live_nodes.truncate(last * d);
        self.live_size.truncate(last);
        self.live_id.truncate(last);
        self.by_tuple.remove(&tuple);
        self.unlist(id);
        self.classes[id as usize].slot = DEAD;
        tuple
    }

    /// Merges `a` and `b` into the class of their common ancestors' tuple (the per-query tables
    /// still hold `a`'s common ancestors).
    fn merge(&mut self, a: u32, b: u32) {
        let slot_b = self.classes[b as usize].slot as usize;
        let tuple: Vec<u32> = self.live_nodes[slot_b * self.d..(slot_b + 1) * self.d]
            .iter()
            .map(|&g| self.common[g as usize])
            .collect();
        self.remove_live(a);
        self.remove_live(b);
        let size = self.classes[a as usize].size + self.classes[b as usize].size;
        let mut histogram = merge_histograms(
            &std::mem::take(&mut self.classes[a as usize].histogram),
            &std::mem::take(&mut self.classes[b as usize].histogram),
        );
        let target = match self.by_tuple.get(&tuple) {
            Some(&c) => {
                let class = &mut self.classes[c as usize];
                histogram = merge_histograms(&class.histogram, &histogram);
                class.size += size;
                class.histogram = histogram;
                let slot = class.slot as usize;
                self.live_size[slot] += size;
                c
            }
            None => {
                let c = self.classes.len() as u32;
                self.classes.push(Class {
                    size,
                    histogram,
                    slot: self.live_id.len() as u32,
                    violating: DEAD,
                    parent: c,
                });
                self.live_nodes.extend_from_slice(&tuple);
                self.live_size.push(size);
                self.live_id.push(c);
                self.by_tuple.insert(tuple, c);
                c
            }
        };
        self.classes[a as usize].parent = target;
        self.classes[b as usize].parent = target;
        self.update_violating(target);
    }

    /// The live class a class ended up in (path halving).
    fn root(&mut self, mut id: u32) -> u32 {
        while self.classes[id as usize].parent != id {
            let up = self.classes[id as usize].parent;
            self.classes[id as usize].parent = self.classes[up as usize].parent;
            id = up;
        }
        id
    }

    fn recoding(&mut self, table: &Table, tuple_of_row: &[u32]) -> Recoding {
        let d = self.d;
        let n = table.rows();
        let mut cells: Vec<Vec<Cell>> = vec![Vec::with_capacity(n); d];
        let mut memo: FastMap<u32, usize> = FastMap::default();
        for &t in tuple_of_row {
            let slot = match memo.get(&t) {
                Some(&slot) => slot,
                None => {
                    let root = self.root(t);
                    let slot = self.classes[root as usize].slot as usize;
                    memo.insert(t, slot);
                    slot
                }
            };
            for (j, a) in self.attributes.iter().enumerate() {
                let g = self.live_nodes[slot * d + j];
                cells[j].push(Cell::Node(g - a.offset as u32));
            }
        }
        Recoding {
            cells,
            suppressed: vec![false; n],
        }
    }
}

/// The sum of two sparse histograms sorted by value.
fn merge_histograms(a: &[(u32, u32)], b: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push((a[i].0, a[i].1 + b[j].1));
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}
