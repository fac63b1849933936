//! Utility loss Uloss (Li & Li, KDD'09 §4.2): the mean, over all *large populations* y, of
//! JS(P_y, P̄_y), where P_y is y's true sensitive distribution in the original table and P̄_y the one
//! estimated from the release under the uniform assumption (every value of a released region equally
//! likely; every sensitive value of a bucket equally likely per row).
//!
//! A large population is a conjunction of QI predicates, at most one per attribute, whose support in
//! the original table is at least `min_support` × |T|. A predicate is an *item*: a value of a QI or a
//! generalized value of it — a non-root node of a categorical QI's hierarchy, or a non-root interval of
//! a numeric QI's quantile tree (the sorted distinct values split recursively at the row median, so
//! intervals at depth d hold about |T| / 2^d rows). Large populations are mined by pattern growth
//! (FP-growth's divide and conquer over conditional databases; each conditional database is kept as a
//! list of merged, weighted prefix paths — the paths an FP-tree would store — rather than as a linked
//! tree), with every transaction carrying a sensitive histogram so the mining yields each
//! population's distribution directly. The release's estimates are summed over *virtual
//! transactions*: each released cell split into the pieces of its region that fall under different
//! items, weighted by their share of the region's equally likely values, merged by their pieces; each
//! transaction's histogram is added to every large population it contains, found by walking a trie
//! of the populations along the transaction's items (the baseline builds the trie once).
//!
//! Invariants: a population is reported once (its items sorted by global item order); populations
//! are downward closed, so the walk from the trie's root through populations a transaction contains
//! reaches every one it contains, each once; the release's estimates are summed in one fixed order
//! (cells in the view's order, transactions in the order the cells first give them), so a release
//! measures the same Uloss to the last bit in every run; the original table as its own release
//! gives P̄_y = P_y for every y (Uloss 0); the trivial release gives P̄_y = Q. A population the
//! release gives no mass at all counts as the maximum ln 2.
//!
//! Memory: the mining and the estimates charge the job's [`MemoryBudget`] before each heavy
//! allocation (the merged transactions and their histograms, every level's item sums, the
//! conditional databases, every population found, the trie, the release's sums), so a table whose
//! populations cannot fit ends with [`BudgetExceeded`] (Uloss unavailable) instead of aborting the
//! process; what the populations keep is held by them until they are dropped.
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::budget::{BudgetExceeded, MemoryBudget, Reservation, bytes_of, reserve_one};

use crate::measures::view::{Region, ReleaseView};
use crate::relational::distance::js_divergence;
use crate::relational::table::{QuasiAttribute, Table};

/// An item id; lower ids are more frequent in the original table.
pub type Item = u32;

/// The items of each QI and, for every equally likely value of a QI, the items it belongs to.
#[derive(Debug, Clone)]
pub struct ItemCatalog {
    /// Per QI, per value unit (hierarchy leaf or numeric domain index): its piece.
    piece_of: Vec<Vec<u32>>,
    /// Per QI, per piece: its items (ascending ids).
    pieces: Vec<Vec<Vec<Item>>>,
    /// The QI of each item.
    item_quasi: Vec<u32>,
    /// A readable label of each item (`age=17-25`, `education=Higher education`).
    pub item_labels: Vec<String>,
    /// Support of each item in the original table.
    pub item_support: Vec<u64>,
}

/// Chains of candidate item keys (top to bottom, root excluded) per value unit of one QI, with the
/// label of each key.
struct Candidates {
    chains: Vec<Vec<u64>>,
    labels: HashMap<u64, String>,
}

fn numeric_candidates(domain: &[f64], texts: &[String], counts: &[u64]) -> Candidates {
    let d = domain.len();
    let mut chains = vec![Vec::new(); d];
    let mut labels = HashMap::new();
    // Recursive median split of [lo, hi] (domain indices); node key = lo * d + hi.
    let mut stack = vec![(0usize, d.saturating_sub(1), 0usize)];
    while let Some((lo, hi, depth)) = stack.pop() {
        if depth > 0 {
            let key = (lo * d + hi) as u64;
            for chain in &mut chains[lo..=hi] {
                chain.push(key);
            }
            let label = if lo == hi {
                texts[lo].clone()
            } else {
                format!("{}-{}", texts[lo], texts[hi])
            };
            labels.insert(key, label);
        }
        if lo >= hi {
            continue;
        }
        let total: u64 = counts[lo..=hi].iter().sum();
        let mut cumulative = 0;
        let mut split = lo;
        for (i, &c) in counts.iter().enumerate().take(hi).skip(lo) {
            cumulative += c;
            split = i;
            if 2 * cumulative >= total {
                break;
            }
        }
        stack.push((split + 1, hi, depth + 1));
        stack.push((lo, split, depth + 1));
    }
    Candidates { chains, labels }
}

impl ItemCatalog {
    /// Items with support >= `min_count` in `table`.
    fn build(table: &Table, min_count: u64) -> ItemCatalog {
        let mut frequent: Vec<(u64, u32, u64, String)> = Vec::new(); // (support, qi, key, label)
        let mut chains_per_quasi = Vec::new();
        for (q, column) in table.quasi.iter().enumerate() {
            let candidates = match &column.attribute {
                QuasiAttribute::Numeric(domain) => {
                    let mut counts = vec![0u64; domain.values.len()];
                    for &c in &column.codes {
                        counts[c as usize] += 1;
                    }
                    numeric_candidates(&domain.values, &domain.texts, &counts)
                }
                QuasiAttribute::Categorical(h) => {
                    let mut labels = HashMap::new();
                    let chains = (0..h.leaf_count() as u32)
                        .map(|leaf| {
                            (0..h.height() - 1)
                                .rev()
                                .map(|level| {
                                    let node = h.ancestor(leaf, level);
                                    labels.insert(node as u64, h.label(node).to_string());
                                    node as u64
                                })
                                .collect()
                        })
                        .collect();
                    Candidates { chains, labels }
                }
            };
            let mut support: HashMap<u64, u64> = HashMap::new();
            let mut unit_rows = vec![0u64; candidates.chains.len()];
            for &c in &column.codes {
                unit_rows[c as usize] += 1;
            }
            for (unit, chain) in candidates.chains.iter().enumerate() {
                for &key in chain {
                    *support.entry(key).or_default() += unit_rows[unit];
                }
            }
            for (&key, &s) in &support {
                if s >= min_count && s > 0 {
                    let label = format!("{}={}", column.name, candidates.labels[&key]);
                    frequent.push((s, q as u32, key, label));
                }
            }
            chains_per_quasi.push(candidates.chains);
        }
        frequent.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let id_of: HashMap<(u32, u64), Item> = frequent
            .iter()
            .enumerate()
            .map(|(i, f)| ((f.1, f.2), i as Item))
            .collect();
        let mut piece_of = Vec::new();
        let mut pieces = Vec::new();
        for (q, chains) in chains_per_quasi.into_iter().enumerate() {
            let mut index: HashMap<Vec<Item>, u32> = HashMap::new();
            let mut list: Vec<Vec<Item>> = Vec::new();
            let of: Vec<u32> = chains
                .into_iter()
                .map(|chain| {
                    let mut items: Vec<Item> = chain
                        .iter()
                        .filter_map(|&key| id_of.get(&(q as u32, key)).copied())
                        .collect();
                    items.sort_unstable();
                    *index.entry(items.clone()).or_insert_with(|| {
                        list.push(items);
                        (list.len() - 1) as u32
                    })
                })
                .collect();
            piece_of.push(of);
            pieces.push(list);
        }
        ItemCatalog {
            piece_of,
            pieces,
            item_quasi: frequent.iter().map(|f| f.1).collect(),
            item_labels: frequent.iter().map(|f| f.3.clone()).collect(),
            item_support: frequent.iter().map(|f| f.0).collect(),
        }
    }

    fn items_of(&self, pieces: &[u32]) -> Vec<Item> {
        let mut items: Vec<Item> = pieces
            .iter()
            .enumerate()
            .flat_map(|(q, &p)| self.pieces[q][p as usize].iter().copied())
            .collect();
        items.sort_unstable();
        items
    }

    /// The pieces of a released region with their probability (uniform over the region's values).
    fn region_pieces(&self, table: &Table, q: usize, region: Region) -> Vec<(u32, f64)> {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        let mut total = 0u32;
        match (region, &table.quasi[q].attribute) {
            (Region::Interval { lo, hi }, _) => {
                for unit in lo..=hi {
                    *counts.entry(self.piece_of[q][unit as usize]).or_default() += 1;
                    total += 1;
                }
            }
            (Region::Node(node), QuasiAttribute::Categorical(h)) => {
                for leaf in 0..h.leaf_count() as u32 {
                    if h.covers(node, leaf) {
                        *counts.entry(self.piece_of[q][leaf as usize]).or_default() += 1;
                        total += 1;
                    }
                }
            }
            (Region::Node(node), QuasiAttribute::Numeric(_)) => {
                counts.insert(self.piece_of[q][node as usize], 1);
                total = 1;
            }
        }
        let mut out: Vec<(u32, f64)> = counts
            .into_iter()
            .map(|(p, c)| (p, c as f64 / total.max(1) as f64))
            .collect();
        out.sort_by_key(|&(p, _)| p);
        out
    }
}

/// A weighted transaction: its items (ascending) and its sensitive histogram (weighted counts).
type Transaction = (Vec<Item>, Vec<f64>);

/// Bytes a hash map entry and the headers of its vectors take beyond their elements (an estimate
/// on the safe side).
const ENTRY_OVERHEAD: usize = 96;

/// The bytes of one transaction or population: its items, its histogram and their overhead.
fn transaction_bytes(items: usize, m: usize) -> u64 {
    bytes_of(items, 4)
        .saturating_add(bytes_of(m, 8))
        .saturating_add(ENTRY_OVERHEAD as u64)
}

/// Pattern growth over weighted transactions. `accept(itemset, support)` decides whether an itemset
/// (sorted) is reported and grown further. Returns every accepted itemset with its histogram and
/// the reservation holding them, or `None` when `cancelled` turned true (looked at before each
/// conditional database is mined); refused when the mining would pass `budget`.
fn pattern_growth(
    transactions: Vec<Transaction>,
    m: usize,
    item_quasi: &[u32],
    accept: &dyn Fn(&[Item], f64) -> bool,
    budget: &MemoryBudget,
    cancelled: &AtomicBool,
) -> Result<Option<Found>, BudgetExceeded> {
    let mut out = Found {
        itemsets: Vec::new(),
        held: budget.reservation(),
    };
    let mut suffix = Vec::new();
    let mining = Mining {
        m,
        item_quasi,
        accept,
        budget,
        cancelled,
    };
    Ok(grow(&mining, &transactions, &mut suffix, &mut out)?.then_some(out))
}

/// The itemsets found with their histograms, and the bytes they hold.
struct Found {
    itemsets: Vec<(Vec<Item>, Vec<f64>)>,
    held: Reservation,
}

/// What every level of [`grow`] shares.
struct Mining<'a> {
    m: usize,
    item_quasi: &'a [u32],
    accept: &'a dyn Fn(&[Item], f64) -> bool,
    budget: &'a MemoryBudget,
    cancelled: &'a AtomicBool,
}

/// Mines `database` (the conditional database of `suffix`); `Ok(false)` when cancelled.
fn grow(
    mining: &Mining<'_>,
    database: &[Transaction],
    suffix: &mut Vec<Item>,
    out: &mut Found,
) -> Result<bool, BudgetExceeded> {
    if mining.cancelled.load(Ordering::Relaxed) {
        return Ok(false);
    }
    let (m, item_quasi, accept) = (mining.m, mining.item_quasi, mining.accept);
    let n_items = item_quasi.len();
    let cells = n_items.saturating_mul(m);
    let _level = mining.budget.try_reserve(
        bytes_of(cells, 8).saturating_add(n_items as u64),
        "mining the large populations (items x sensitive values per level)",
    )?;
    let mut sums = vec![0.0; cells];
    let mut present = vec![false; n_items];
    for (items, histogram) in database {
        for &i in items {
            present[i as usize] = true;
            for (s, h) in sums[i as usize * m..(i as usize + 1) * m]
                .iter_mut()
                .zip(histogram)
            {
                *s += h;
            }
        }
    }
    for item in (0..n_items).rev().filter(|&i| present[i]) {
        let histogram = &sums[item * m..(item + 1) * m];
        let support: f64 = histogram.iter().sum();
        suffix.push(item as Item);
        let mut itemset = suffix.clone();
        itemset.sort_unstable();
        if accept(&itemset, support) {
            let what = "the large populations found";
            reserve_one(&mut out.itemsets, &mut out.held, what)?;
            out.held.grow(transaction_bytes(itemset.len(), m), what)?;
            out.itemsets.push((itemset, histogram.to_vec()));
            // The conditional database of `item`: the prefixes (more frequent items, other QIs).
            let quasi = item_quasi[item];
            let mut merged: HashMap<Vec<Item>, Vec<f64>> = HashMap::new();
            let mut conditional_held = mining.budget.reservation();
            for (items, h) in database {
                let Ok(position) = items.binary_search(&(item as Item)) else {
                    continue;
                };
                let prefix: Vec<Item> = items[..position]
                    .iter()
                    .copied()
                    .filter(|&j| item_quasi[j as usize] != quasi)
                    .collect();
                if prefix.is_empty() {
                    continue;
                }
                if !merged.contains_key(&prefix) {
                    conditional_held.grow(
                        transaction_bytes(prefix.len(), m),
                        "a conditional database of the large populations",
                    )?;
                }
                let entry = merged.entry(prefix).or_insert_with(|| vec![0.0; m]);
                for (e, x) in entry.iter_mut().zip(h) {
                    *e += x;
                }
            }
            if !merged.is_empty() {
                let conditional: Vec<Transaction> = merged.into_iter().collect();
                if !grow(mining, &conditional, suffix, out)? {
                    return Ok(false);
                }
            }
        }
        suffix.pop();
    }
    Ok(true)
}

/// The large populations of a table with their true sensitive distributions.
#[derive(Debug, Clone)]
pub struct LargePopulations {
    pub catalog: ItemCatalog,
    pub min_support: f64,
    /// Itemsets (sorted item ids).
    pub populations: Vec<Vec<Item>>,
    /// True sensitive counts of each population, `m` each.
    pub truths: Vec<Vec<f64>>,
    trie: PopulationTrie,
    m: usize,
    /// The bytes the populations, their truths and the trie hold of the job's budget.
    _held: Option<Arc<Reservation>>,
}

/// Runs `work` with no memory limit and no cancellation: the plain entry points (`mine`,
/// `estimates`, `uloss`) of work that otherwise runs within a job's budget and cancellation flag.
fn unbounded<T>(
    work: impl FnOnce(&MemoryBudget, &AtomicBool) -> Result<Option<T>, BudgetExceeded>,
) -> T {
    work(&MemoryBudget::unlimited(), &AtomicBool::new(false))
        .ok()
        .flatten()
        .expect("work that can be neither cancelled nor refused completes")
}

impl LargePopulations {
    /// Mines every population with support >= `min_support` × |T| (`min_support` in (0, 1]).
    pub fn mine(table: &Table, min_support: f64) -> LargePopulations {
        unbounded(|budget, never| Self::mine_within(table, min_support, budget, never))
    }

    /// No populations (the measure unavailable).
    pub fn none(table: &Table, min_support: f64) -> LargePopulations {
        LargePopulations {
            catalog: ItemCatalog {
                piece_of: Vec::new(),
                pieces: Vec::new(),
                item_quasi: Vec::new(),
                item_labels: Vec::new(),
                item_support: Vec::new(),
            },
            min_support,
            populations: Vec::new(),
            truths: Vec::new(),
            trie: PopulationTrie::new(&[]),
            m: table.sensitive.domain.len(),
            _held: None,
        }
    }

    /// [`LargePopulations::mine`], giving up (`Ok(None)`) soon after `cancelled` turns true and
    /// refusing ([`BudgetExceeded`]) before the mining would pass `budget`.
    pub fn mine_within(
        table: &Table,
        min_support: f64,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<Option<LargePopulations>, BudgetExceeded> {
        let n = table.rows() as f64;
        let min_count = (min_support * n).ceil().max(1.0) as u64;
        let catalog = ItemCatalog::build(table, min_count);
        let m = table.sensitive.domain.len();
        let mut merged: HashMap<Vec<u32>, Vec<f64>> = HashMap::new();
        let mut merged_held = budget.reservation();
        let mut key = Vec::with_capacity(table.quasi.len());
        for row in 0..table.rows() {
            key.clear();
            key.extend(
                table
                    .quasi
                    .iter()
                    .enumerate()
                    .map(|(q, c)| catalog.piece_of[q][c.codes[row] as usize]),
            );
            let entry = match merged.get_mut(key.as_slice()) {
                Some(e) => e,
                None => {
                    merged_held.grow(
                        transaction_bytes(key.len(), m),
                        "the table's transactions (distinct QI pieces x sensitive values)",
                    )?;
                    merged.entry(key.clone()).or_insert_with(|| vec![0.0; m])
                }
            };
            entry[table.sensitive.codes[row] as usize] += 1.0;
        }
        // The transactions' item lists: at most one item per hierarchy level or tree depth of a QI.
        let mut items_held = budget.reservation();
        let mut transactions: Vec<Transaction> = Vec::new();
        for (pieces, h) in merged {
            let items = catalog.items_of(&pieces);
            items_held.grow(
                transaction_bytes(items.len(), 0),
                "the table's transactions (their items)",
            )?;
            if !items.is_empty() {
                transactions.push((items, h));
            }
        }
        let threshold = min_count as f64 - 1e-6;
        let Some(found) = pattern_growth(
            transactions,
            m,
            &catalog.item_quasi,
            &|_, support| support >= threshold,
            budget,
            cancelled,
        )?
        else {
            return Ok(None);
        };
        drop((merged_held, items_held));
        let Found { itemsets, mut held } = found;
        // Two lists of the populations, and the trie: a node per item of a population at most.
        let items: usize = itemsets.iter().map(|(i, _)| i.len()).sum();
        held.grow(
            bytes_of(itemsets.len(), 48).saturating_add(bytes_of(items.saturating_add(1), 48)),
            "the large populations' trie",
        )?;
        let mut populations = Vec::with_capacity(itemsets.len());
        let mut truths = Vec::with_capacity(itemsets.len());
        for (itemset, histogram) in itemsets {
            populations.push(itemset);
            truths.push(histogram);
        }
        let trie = PopulationTrie::new(&populations);
        Ok(Some(LargePopulations {
            catalog,
            min_support,
            populations,
            truths,
            trie,
            m,
            _held: Some(Arc::new(held)),
        }))
    }

    pub fn len(&self) -> usize {
        self.populations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.populations.is_empty()
    }

    /// The release's estimated sensitive counts of each population, in the order of
    /// [`LargePopulations::populations`] (`None`: the release gives it no mass).
    pub fn estimates(&self, table: &Table, view: &ReleaseView) -> Vec<Option<Vec<f64>>> {
        unbounded(|budget, never| self.estimates_within(table, view, budget, never))
    }

    /// [`LargePopulations::estimates`], giving up (`Ok(None)`) soon after `cancelled` turns true
    /// and refusing before its sums would pass `budget`.
    pub fn estimates_within(
        &self,
        table: &Table,
        view: &ReleaseView,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<Option<Vec<Option<Vec<f64>>>>, BudgetExceeded> {
        let m = self.m;
        let Some((transactions, _transactions_held)) =
            self.virtual_transactions(table, view, budget, cancelled)?
        else {
            return Ok(None);
        };
        // The sums, then the estimates copied out of them.
        let cells = self.populations.len().saturating_mul(m);
        let _sums_held = budget.try_reserve(
            bytes_of(cells, 16).saturating_add(bytes_of(self.populations.len(), 32)),
            "the release's estimates (large populations x sensitive values)",
        )?;
        let mut sums = vec![0.0; cells];
        let mut reached = vec![false; self.populations.len()];
        for (i, (pieces, histogram)) in transactions.iter().enumerate() {
            if i.is_multiple_of(CANCEL_CHECK_EVERY) && cancelled.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let items = self.catalog.items_of(pieces);
            self.trie
                .add_contained(0, &items, histogram, &mut sums, &mut reached);
        }
        Ok(Some(
            reached
                .iter()
                .enumerate()
                .map(|(p, &r)| r.then(|| sums[p * m..(p + 1) * m].to_vec()))
                .collect(),
        ))
    }

    /// The release's cells split into virtual transactions: each cell's region cut into the pieces
    /// of each QI, weighted by their share of the region's values, merged by their pieces (one per
    /// QI) in the order the cells first give them (so every sum below is taken in one order).
    #[allow(clippy::type_complexity)]
    fn virtual_transactions(
        &self,
        table: &Table,
        view: &ReleaseView,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<Option<(Vec<(Vec<u32>, Vec<f64>)>, Reservation)>, BudgetExceeded> {
        let mut held = budget.reservation();
        let m = self.m;
        let qn = table.quasi.len();
        // The pieces of each (QI, region) met so far, and their place in `lists`.
        let mut cache: HashMap<(usize, Region), usize> = HashMap::new();
        let mut lists: Vec<Vec<(u32, f64)>> = Vec::new();
        let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut merged: Vec<(Vec<u32>, Vec<f64>)> = Vec::new();
        let mut of_quasi = vec![0usize; qn];
        let mut at = vec![0usize; qn];
        let mut key = vec![0u32; qn];
        for c in 0..view.cells() {
            if c.is_multiple_of(CANCEL_CHECK_EVERY) && cancelled.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let (regions, histogram) = view.cell(c);
            for (q, &region) in regions.iter().enumerate() {
                of_quasi[q] = *cache.entry((q, region)).or_insert_with(|| {
                    lists.push(self.catalog.region_pieces(table, q, region));
                    lists.len() - 1
                });
            }
            if of_quasi.iter().any(|&l| lists[l].is_empty()) {
                continue;
            }
            // Every combination of one piece per QI (an odometer over `at`), weighted by the
            // product of the pieces' shares in QI order.
            at.fill(0);
            'combinations: loop {
                let mut w = 1.0;
                for q in 0..qn {
                    let (piece, share) = lists[of_quasi[q]][at[q]];
                    key[q] = piece;
                    w *= share;
                }
                let t = match index.get(key.as_slice()) {
                    Some(&t) => t,
                    None => {
                        // In `index` and in `merged`: the key twice and the histogram.
                        held.grow(
                            transaction_bytes(2 * qn, m),
                            "the release's virtual transactions (pieces x sensitive values)",
                        )?;
                        index.insert(key.clone(), merged.len());
                        merged.push((key.clone(), vec![0.0; m]));
                        merged.len() - 1
                    }
                };
                for (e, h) in merged[t].1.iter_mut().zip(histogram) {
                    *e += w * h;
                }
                for q in (0..qn).rev() {
                    at[q] += 1;
                    if at[q] < lists[of_quasi[q]].len() {
                        continue 'combinations;
                    }
                    at[q] = 0;
                }
                break;
            }
        }
        Ok(Some((merged, held)))
    }

    /// Uloss of a release: mean over the populations of JS(P_y, P̄_y); 0 when there are none.
    pub fn uloss(&self, table: &Table, view: &ReleaseView) -> f64 {
        unbounded(|budget, never| self.uloss_within(table, view, budget, never))
    }

    /// [`LargePopulations::uloss`], giving up (`Ok(None)`) soon after `cancelled` turns true and
    /// refusing before the release's estimates would pass `budget`.
    pub fn uloss_within(
        &self,
        table: &Table,
        view: &ReleaseView,
        budget: &MemoryBudget,
        cancelled: &AtomicBool,
    ) -> Result<Option<f64>, BudgetExceeded> {
        if self.populations.is_empty() {
            return Ok(Some(0.0));
        }
        let Some(estimates) = self.estimates_within(table, view, budget, cancelled)? else {
            return Ok(None);
        };
        let mut sum = 0.0;
        for (truth, estimate) in self.truths.iter().zip(&estimates) {
            sum += population_loss(truth, estimate.as_deref());
        }
        Ok(Some(sum / self.populations.len() as f64))
    }
}

/// Cells or transactions measured between two looks at the cancellation flag.
const CANCEL_CHECK_EVERY: usize = 256;

/// The populations as a trie over their items in ascending order: node 0 is the empty itemset, and
/// a node reached by items i1 < i2 < ... is that itemset. Populations are downward closed, so every
/// population contained in a transaction is reached from the root through populations contained in
/// it, and a walk through the transaction's items visits each exactly once.
#[derive(Debug, Clone)]
struct PopulationTrie {
    /// Per node: its children by item, ascending.
    children: Vec<Vec<(Item, u32)>>,
    /// Per node: the population it is (an index into `populations`), if any.
    population: Vec<Option<u32>>,
}

impl PopulationTrie {
    fn new(populations: &[Vec<Item>]) -> PopulationTrie {
        let mut trie = PopulationTrie {
            children: vec![Vec::new()],
            population: vec![None],
        };
        for (p, itemset) in populations.iter().enumerate() {
            let mut node = 0usize;
            for &item in itemset {
                node = match trie.children[node].binary_search_by_key(&item, |&(i, _)| i) {
                    Ok(at) => trie.children[node][at].1 as usize,
                    Err(at) => {
                        let child = trie.children.len();
                        trie.children[node].insert(at, (item, child as u32));
                        trie.children.push(Vec::new());
                        trie.population.push(None);
                        child
                    }
                };
            }
            trie.population[node] = Some(p as u32);
        }
        trie
    }

    /// Adds `histogram` to the sums (`m` per population) of every population below `node` whose
    /// remaining items are among `items` (ascending), and marks them reached.
    fn add_contained(
        &self,
        node: usize,
        items: &[Item],
        histogram: &[f64],
        sums: &mut [f64],
        reached: &mut [bool],
    ) {
        let children = &self.children[node];
        if children.is_empty() {
            return;
        }
        let m = histogram.len();
        for (j, &item) in items.iter().enumerate() {
            let Ok(at) = children.binary_search_by_key(&item, |&(i, _)| i) else {
                continue;
            };
            let child = children[at].1 as usize;
            if let Some(p) = self.population[child] {
                let p = p as usize;
                reached[p] = true;
                for (s, h) in sums[p * m..(p + 1) * m].iter_mut().zip(histogram) {
                    *s += h;
                }
            }
            self.add_contained(child, &items[j + 1..], histogram, sums, reached);
        }
    }
}

/// JS(P_y, P̄_y) from counts; ln 2 when the estimate has no mass.
pub fn population_loss(truth: &[f64], estimate: Option<&[f64]>) -> f64 {
    let normalize = |h: &[f64]| -> Option<Vec<f64>> {
        let total: f64 = h.iter().sum();
        (total > 1e-12).then(|| h.iter().map(|x| x / total).collect())
    };
    match (normalize(truth), estimate.and_then(normalize)) {
        (Some(p), Some(e)) => js_divergence(&p, &e),
        _ => std::f64::consts::LN_2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn quantile_tree_splits_at_the_row_median() {
        let texts: Vec<String> = ["1", "2", "3", "4"].iter().map(|s| s.to_string()).collect();
        let c = numeric_candidates(&[1.0, 2.0, 3.0, 4.0], &texts, &[1, 1, 1, 1]);
        // Root children [1,2] and [3,4], then the single values.
        assert_eq!(c.chains[0].len(), 2);
        assert_eq!(c.labels[&c.chains[0][0]], "1-2");
        assert_eq!(c.labels[&c.chains[3][0]], "3-4");
        assert_eq!(c.labels[&c.chains[3][1]], "4");
    }

    #[test]
    fn pattern_growth_counts_like_brute_force() {
        // Items 0,1 of QI 0; 2,3 of QI 1. Transactions with histograms over 2 values.
        let quasi = [0u32, 0, 1, 1];
        let db: Vec<Transaction> = vec![
            (vec![0, 2], vec![1.0, 0.0]),
            (vec![0, 3], vec![0.0, 2.0]),
            (vec![1, 2], vec![1.0, 1.0]),
            (vec![0, 1, 2], vec![3.0, 0.0]),
        ];
        let never = AtomicBool::new(false);
        let budget = MemoryBudget::unlimited();
        let found = pattern_growth(db.clone(), 2, &quasi, &|_, s| s >= 1.0, &budget, &never)
            .unwrap()
            .unwrap();
        let all: HashMap<Vec<Item>, Vec<f64>> = found.itemsets.into_iter().collect();
        for (itemset, h) in &all {
            let mut expected = [0.0, 0.0];
            for (items, th) in &db {
                if itemset.iter().all(|i| items.contains(i)) {
                    expected[0] += th[0];
                    expected[1] += th[1];
                }
            }
            assert_eq!(h.as_slice(), expected.as_slice(), "{itemset:?}");
            // At most one item per QI.
            let qs: HashSet<u32> = itemset.iter().map(|&i| quasi[i as usize]).collect();
            assert_eq!(qs.len(), itemset.len());
        }
        // Singletons 0..3, pairs {0,2},{0,3},{1,2}; {0,1} excluded (same QI).
        assert_eq!(all.len(), 7, "{all:?}");
        assert_eq!(all[&vec![0, 2]], vec![4.0, 0.0]);
        // A raised flag stops the mining before it reports anything.
        let cancelled = AtomicBool::new(true);
        assert!(
            pattern_growth(db.clone(), 2, &quasi, &|_, s| s >= 1.0, &budget, &cancelled)
                .unwrap()
                .is_none()
        );
        // A budget too small for the populations refuses the mining and holds nothing after.
        let small = MemoryBudget::new(600);
        let refused = pattern_growth(db, 2, &quasi, &|_, s| s >= 1.0, &small, &never)
            .err()
            .unwrap();
        assert!(refused.what.contains("large populations"), "{refused}");
        assert_eq!(small.held(), 0);
    }
}

#[cfg(test)]
mod estimate_tests {
    //! The release's estimates against the definition, cell by cell: P̄_y = Σ over cells of the
    //! cell's histogram times, per item of y, the share of the cell's region whose values lie under
    //! the item.
    use super::*;
    use crate::relational::hierarchy::Hierarchy;
    use crate::relational::models::PrivacySpec;
    use crate::relational::release::ReleaseMethod;
    use crate::relational::table::{
        ColumnRole, ColumnSchema, QuasiKind, TableSchema, Unlisted, read_csv,
    };
    use proptest::prelude::*;

    fn table(rows: &[(u8, u8, u8)]) -> Table {
        let job = Hierarchy::parse("job", "a;x;*\nb;x;*\nc;y;*\nd;y;*\ne;y;*\n").unwrap();
        let schema = TableSchema {
            columns: vec![
                ColumnSchema::new("age", ColumnRole::Quasi(QuasiKind::Numeric)),
                ColumnSchema::new("job", ColumnRole::Quasi(QuasiKind::Categorical(job))),
                ColumnSchema::new("disease", ColumnRole::Sensitive { numeric: false }),
            ],
            unlisted: Unlisted::Drop,
        };
        let mut csv = String::from("age,job,disease\n");
        for (age, job, disease) in rows {
            let job = ["a", "b", "c", "d", "e"][*job as usize];
            csv.push_str(&format!("{age},{job},s{disease}\n"));
        }
        read_csv(schema, csv.as_bytes(), "t.csv", b',').unwrap()
    }

    /// The equally likely values (domain indices or leaves) of a region.
    fn units(table: &Table, q: usize, region: Region) -> Vec<u32> {
        match (region, &table.quasi[q].attribute) {
            (Region::Interval { lo, hi }, _) => (lo..=hi).collect(),
            (Region::Node(node), QuasiAttribute::Categorical(h)) => (0..h.leaf_count() as u32)
                .filter(|&leaf| h.covers(node, leaf))
                .collect(),
            (Region::Node(node), QuasiAttribute::Numeric(_)) => vec![node],
        }
    }

    fn defined_estimate(
        populations: &LargePopulations,
        table: &Table,
        view: &ReleaseView,
        itemset: &[Item],
    ) -> Vec<f64> {
        let catalog = &populations.catalog;
        let mut estimate = vec![0.0; view.domain];
        for c in 0..view.cells() {
            let (regions, histogram) = view.cell(c);
            let mut w = 1.0;
            for &item in itemset {
                let q = catalog.item_quasi[item as usize] as usize;
                let units = units(table, q, regions[q]);
                let under = units
                    .iter()
                    .filter(|&&u| {
                        catalog.pieces[q][catalog.piece_of[q][u as usize] as usize].contains(&item)
                    })
                    .count();
                w *= under as f64 / units.len() as f64;
            }
            for (e, h) in estimate.iter_mut().zip(histogram) {
                *e += w * h;
            }
        }
        estimate
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn estimates_are_the_definition_and_repeat_to_the_last_bit(
            rows in prop::collection::vec((20u8..40, 0u8..5, 0u8..4), 4..80),
            k in 1u64..8,
            bucketize in any::<bool>(),
            min_support in 0.05f64..0.4,
        ) {
            let t = table(&rows);
            let spec = PrivacySpec { k: Some(k), ..PrivacySpec::default() };
            let method = if bucketize { ReleaseMethod::Bucketization } else { ReleaseMethod::Generalization };
            let Ok((release, _)) = crate::relational::anonymize(&t, &spec, method, 7) else {
                prop_assume!(false);
                unreachable!();
            };
            let view = ReleaseView::new(&t, &release).unwrap();
            let populations = LargePopulations::mine(&t, min_support);
            let estimates = populations.estimates(&t, &view);
            prop_assert_eq!(estimates.len(), populations.len());
            for (itemset, estimate) in populations.populations.iter().zip(&estimates) {
                let defined = defined_estimate(&populations, &t, &view, itemset);
                match estimate {
                    Some(e) => {
                        for (a, b) in e.iter().zip(&defined) {
                            prop_assert!((a - b).abs() < 1e-9, "{itemset:?}: {e:?} vs {defined:?}");
                        }
                    }
                    None => prop_assert!(defined.iter().all(|&d| d == 0.0), "{itemset:?}: {defined:?}"),
                }
            }
            let uloss = populations.uloss(&t, &view);
            prop_assert_eq!(uloss.to_bits(), populations.uloss(&t, &view).to_bits());
            let mined_again = LargePopulations::mine(&t, min_support);
            prop_assert_eq!(uloss.to_bits(), mined_again.uloss(&t, &view).to_bits());
        }
    }
}
