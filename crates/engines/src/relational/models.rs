//! Privacy models over equivalence classes (docs/architecture.md#definitions): k-anonymity;
//! l-diversity (distinct, entropy,
//! probabilistic — no value more frequent than 1/l, Li & Li's reading — and recursive (c,l) of
//! Machanavajjhala et al.); t-closeness (Li, Li & Venkatasubramanian) with the earth mover's distance or
//! the Jensen-Shannon divergence; delta-disclosure in Brickell & Shmatikov's strict form.
//!
//! A model is a pluggable check ([`PrivacyModel`]) of one class's sensitive counts against the whole
//! table's distribution Q. Invariants: every check depends only on the class's counts and on Q, so the
//! same check serves the Mondrian split test and the verification of a released table; a model that
//! admits a class reports no reason, one that rejects it can say why ([`PrivacyModel::violation`]).
//! Floating comparisons allow a slack of [`TOLERANCE`] so that exact boundary cases (entropy exactly
//! ln l, a distance exactly t) are admitted the same way by every caller.
use std::fmt;
use std::str::FromStr;

use super::distance::{emd_equal, emd_ordered, js_divergence};
use super::population::{Estimate, Histogram, population_uniqueness};

/// Slack of floating-point comparisons against a model's threshold.
pub const TOLERANCE: f64 = 1e-9;

/// The sensitive attribute's distribution over the whole table (Q).
#[derive(Debug, Clone, PartialEq)]
pub struct SensitiveDistribution {
    /// Count of each sensitive value, over the sorted sensitive domain.
    pub counts: Vec<u64>,
    pub total: u64,
    /// counts / total.
    pub probabilities: Vec<f64>,
    /// Whether the domain is numeric and sorted ascending (ordered EMD) rather than categorical.
    pub ordered: bool,
}

impl SensitiveDistribution {
    pub fn from_counts(counts: Vec<u64>, ordered: bool) -> SensitiveDistribution {
        let total: u64 = counts.iter().sum();
        let probabilities = counts
            .iter()
            .map(|&c| {
                if total == 0 {
                    0.0
                } else {
                    c as f64 / total as f64
                }
            })
            .collect();
        SensitiveDistribution {
            counts,
            total,
            probabilities,
            ordered,
        }
    }
}

/// One equivalence class as the models see it: its size and the count of each sensitive value (over
/// the same domain as the table's [`SensitiveDistribution`]).
#[derive(Debug, Clone, Copy)]
pub struct ClassCounts<'a> {
    pub size: u64,
    pub counts: &'a [u32],
}

impl ClassCounts<'_> {
    pub fn distinct(&self) -> usize {
        self.counts.iter().filter(|&&c| c > 0).count()
    }

    pub fn max_count(&self) -> u32 {
        self.counts.iter().copied().max().unwrap_or(0)
    }

    /// Shannon entropy of the class's sensitive values, natural log.
    pub fn entropy(&self) -> f64 {
        if self.size == 0 {
            return 0.0;
        }
        let n = self.size as f64;
        -self
            .counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                p * p.ln()
            })
            .sum::<f64>()
    }

    pub fn probabilities(&self) -> Vec<f64> {
        let n = self.size.max(1) as f64;
        self.counts.iter().map(|&c| c as f64 / n).collect()
    }

    /// EMD to Q: ordered ground distance for a numeric sensitive attribute, equal otherwise.
    pub fn emd(&self, table: &SensitiveDistribution) -> f64 {
        let p = self.probabilities();
        if table.ordered {
            emd_ordered(&p, &table.probabilities)
        } else {
            emd_equal(&p, &table.probabilities)
        }
    }

    pub fn js(&self, table: &SensitiveDistribution) -> f64 {
        js_divergence(&self.probabilities(), &table.probabilities)
    }

    /// max over the table's values s of |ln(p(class,s) / p(T,s))|; +∞ when a value of the table is
    /// absent from the class.
    pub fn delta(&self, table: &SensitiveDistribution) -> f64 {
        let n = self.size.max(1) as f64;
        let mut worst: f64 = 0.0;
        for (&c, &q) in self.counts.iter().zip(&table.probabilities) {
            if q <= 0.0 {
                continue;
            }
            if c == 0 {
                return f64::INFINITY;
            }
            worst = worst.max((c as f64 / n / q).ln().abs());
        }
        worst
    }
}

/// A privacy model: a check of one equivalence class against the table's distribution.
pub trait PrivacyModel: fmt::Debug + Send + Sync {
    /// The model and its parameters, e.g. `k-anonymity (k=10)`.
    fn name(&self) -> String;
    /// Whether the class satisfies the model.
    fn admits(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> bool;
    /// Why the class violates the model (`None` when it admits it).
    fn violation(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> Option<String>;
}

/// Which l-diversity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LDiversity {
    /// At least l distinct sensitive values per class.
    Distinct(f64),
    /// Entropy of the class >= ln(l).
    Entropy(f64),
    /// max_s P(s) <= 1/l.
    Probabilistic(f64),
    /// r1 < c (r_l + ... + r_m) over the class's counts sorted descending.
    Recursive { l: usize, c: f64 },
}

/// Which distance t-closeness uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distance {
    Emd,
    Js,
}

/// t-closeness: distance(P, Q) <= t.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TCloseness {
    pub t: f64,
    pub distance: Distance,
}

/// Why a model specification was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{spec:?}: {rule}")]
pub struct ModelSpecError {
    pub spec: String,
    pub rule: String,
}

fn spec_error(spec: &str, rule: impl Into<String>) -> ModelSpecError {
    ModelSpecError {
        spec: spec.to_string(),
        rule: rule.into(),
    }
}

fn parse_number(spec: &str, what: &str, text: &str) -> Result<f64, ModelSpecError> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| spec_error(spec, format!("{what} must be a number (got {text:?})")))?;
    if !v.is_finite() {
        return Err(spec_error(spec, format!("{what} must be finite")));
    }
    Ok(v)
}

impl FromStr for LDiversity {
    type Err = ModelSpecError;

    /// `distinct:L`, `entropy:L`, `probabilistic:L` or `recursive:L:c=C`.
    fn from_str(spec: &str) -> Result<LDiversity, ModelSpecError> {
        let mut parts = spec.split(':');
        let kind = parts.next().unwrap_or_default().trim();
        let l_text = parts.next().ok_or_else(|| {
            spec_error(
                spec,
                "expected distinct:L, entropy:L, probabilistic:L or recursive:L:c=C",
            )
        })?;
        let l = parse_number(spec, "l", l_text)?;
        if l < 1.0 {
            return Err(spec_error(spec, "l must be at least 1"));
        }
        let rest: Vec<&str> = parts.collect();
        let model = match kind {
            "distinct" => LDiversity::Distinct(l),
            "entropy" => LDiversity::Entropy(l),
            "probabilistic" => LDiversity::Probabilistic(l),
            "recursive" => {
                if l.fract() != 0.0 {
                    return Err(spec_error(
                        spec,
                        "recursive (c,l)-diversity needs an integer l",
                    ));
                }
                let c_text = rest
                    .first()
                    .and_then(|p| p.trim().strip_prefix("c="))
                    .ok_or_else(|| spec_error(spec, "recursive needs c: recursive:L:c=C"))?;
                let c = parse_number(spec, "c", c_text)?;
                if c <= 0.0 {
                    return Err(spec_error(spec, "c must be > 0"));
                }
                return if rest.len() > 1 {
                    Err(spec_error(spec, "unexpected text after c=C"))
                } else {
                    Ok(LDiversity::Recursive { l: l as usize, c })
                };
            }
            other => {
                return Err(spec_error(
                    spec,
                    format!(
                        "unknown l-diversity {other:?} (known: distinct, entropy, probabilistic, recursive)"
                    ),
                ));
            }
        };
        if !rest.is_empty() {
            return Err(spec_error(spec, "unexpected text after L"));
        }
        Ok(model)
    }
}

impl fmt::Display for LDiversity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LDiversity::Distinct(l) => write!(f, "distinct:{l}"),
            LDiversity::Entropy(l) => write!(f, "entropy:{l}"),
            LDiversity::Probabilistic(l) => write!(f, "probabilistic:{l}"),
            LDiversity::Recursive { l, c } => write!(f, "recursive:{l}:c={c}"),
        }
    }
}

impl FromStr for TCloseness {
    type Err = ModelSpecError;

    /// `emd:T` or `js:T`, T in [0, 1].
    fn from_str(spec: &str) -> Result<TCloseness, ModelSpecError> {
        let (kind, t_text) = spec
            .split_once(':')
            .ok_or_else(|| spec_error(spec, "expected emd:T or js:T"))?;
        let distance = match kind.trim() {
            "emd" => Distance::Emd,
            "js" => Distance::Js,
            other => {
                return Err(spec_error(
                    spec,
                    format!("unknown t-closeness distance {other:?} (known: emd, js)"),
                ));
            }
        };
        let t = parse_number(spec, "t", t_text)?;
        if !(0.0..=1.0).contains(&t) {
            return Err(spec_error(spec, "t must lie in [0, 1]"));
        }
        Ok(TCloseness { t, distance })
    }
}

impl fmt::Display for TCloseness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self.distance {
            Distance::Emd => "emd",
            Distance::Js => "js",
        };
        write!(f, "{d}:{}", self.t)
    }
}

/// The population-uniqueness model a bound is measured with (docs/risk.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UniquenessModel {
    Pitman,
    Zayatz,
    Snb,
    /// Dankar et al.'s rule choosing among the three.
    Dankar,
}

impl FromStr for UniquenessModel {
    type Err = String;
    fn from_str(s: &str) -> Result<UniquenessModel, String> {
        match s {
            "pitman" => Ok(UniquenessModel::Pitman),
            "zayatz" => Ok(UniquenessModel::Zayatz),
            "snb" => Ok(UniquenessModel::Snb),
            "dankar" => Ok(UniquenessModel::Dankar),
            other => Err(format!(
                "unknown population model {} (known: pitman, zayatz, snb, dankar)",
                crate::text::quote(other)
            )),
        }
    }
}

impl fmt::Display for UniquenessModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UniquenessModel::Pitman => "pitman",
            UniquenessModel::Zayatz => "zayatz",
            UniquenessModel::Snb => "snb",
            UniquenessModel::Dankar => "dankar",
        })
    }
}

/// A bound on the share of population uniques: the `model`'s estimated uniques / `population` ≤ `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniquenessBound {
    pub model: UniquenessModel,
    /// The population's size (records), ≥ 1 and ≥ the released records.
    pub population: f64,
    /// The largest share of population uniques allowed, in [0, 1].
    pub max: f64,
}

/// Bounds on the re-identification risk of a release, measured as the risk engine measures the
/// release (fully suppressed rows count nowhere; docs/risk.md).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RiskBounds {
    /// The highest prosecutor risk, 1 / the smallest class, in (0, 1].
    pub highest: Option<f64>,
    /// The average prosecutor risk, classes / records, in (0, 1].
    pub average: Option<f64>,
    pub population_uniqueness: Option<UniquenessBound>,
}

impl RiskBounds {
    pub fn is_empty(&self) -> bool {
        self.highest.is_none() && self.average.is_none() && self.population_uniqueness.is_none()
    }
}

/// The privacy requested of a release: any combination of the models.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrivacySpec {
    pub k: Option<u64>,
    pub l: Option<LDiversity>,
    pub t: Option<TCloseness>,
    pub delta: Option<f64>,
    pub risk: RiskBounds,
}

impl PrivacySpec {
    /// Checks the parameters' ranges; the error names the parameter and the rule.
    pub fn validate(&self) -> Result<(), ModelSpecError> {
        if self.k.is_none()
            && self.l.is_none()
            && self.t.is_none()
            && self.delta.is_none()
            && self.risk.is_empty()
        {
            return Err(spec_error(
                "privacy",
                "request at least one of k, l, t, delta, max_risk_highest, max_risk_average, population_uniqueness",
            ));
        }
        for (key, bound) in [
            ("max_risk_highest", self.risk.highest),
            ("max_risk_average", self.risk.average),
        ] {
            if let Some(r) = bound
                && !(r > 0.0 && r <= 1.0)
            {
                return Err(spec_error(key, format!("{key} must lie in (0, 1]")));
            }
        }
        if let Some(u) = self.risk.population_uniqueness {
            if !(u.population.is_finite() && u.population >= 1.0) {
                return Err(spec_error(
                    "population_uniqueness.population",
                    "population must be a finite number >= 1",
                ));
            }
            if !(0.0..=1.0).contains(&u.max) {
                return Err(spec_error(
                    "population_uniqueness.max",
                    "max must lie in [0, 1]",
                ));
            }
        }
        if let Some(k) = self.k
            && k < 1
        {
            return Err(spec_error("k", "k must be at least 1"));
        }
        if let Some(l) = self.l {
            let value = match l {
                LDiversity::Distinct(l) | LDiversity::Entropy(l) | LDiversity::Probabilistic(l) => {
                    l
                }
                LDiversity::Recursive { l, c } => {
                    if !(c.is_finite() && c > 0.0) {
                        return Err(spec_error("l", "c must be a finite number > 0"));
                    }
                    l as f64
                }
            };
            if !(value.is_finite() && value >= 1.0) {
                return Err(spec_error("l", "l must be a finite number >= 1"));
            }
        }
        if let Some(t) = self.t
            && !(0.0..=1.0).contains(&t.t)
        {
            return Err(spec_error("t", "t must lie in [0, 1]"));
        }
        if let Some(delta) = self.delta
            && (delta.is_nan() || delta <= 0.0 || delta.is_infinite())
        {
            return Err(spec_error("delta", "delta must be a finite number > 0"));
        }
        Ok(())
    }

    /// The requested models, as checks.
    pub fn models(&self) -> ModelSet {
        let mut models: Vec<Box<dyn PrivacyModel>> = Vec::new();
        if let Some(k) = self.k {
            models.push(Box::new(KAnonymity { k }));
        }
        if let Some(l) = self.l {
            models.push(Box::new(l));
        }
        if let Some(t) = self.t {
            models.push(Box::new(t));
        }
        if let Some(delta) = self.delta {
            models.push(Box::new(DeltaDisclosure { delta }));
        }
        if let Some(highest) = self.risk.highest {
            models.push(Box::new(HighestRisk { highest }));
        }
        let mut release: Vec<Box<dyn ReleaseCriterion>> = Vec::new();
        if let Some(average) = self.risk.average {
            release.push(Box::new(AverageRisk { average }));
        }
        if let Some(bound) = self.risk.population_uniqueness {
            release.push(Box::new(bound));
        }
        ModelSet { models, release }
    }
}

/// Highest prosecutor risk: every released class has 1/|E| ≤ `highest` (k-anonymity with
/// k = ⌈1/highest⌉, monotone as k is, with and without suppression).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HighestRisk {
    pub highest: f64,
}

impl PrivacyModel for HighestRisk {
    fn name(&self) -> String {
        format!(
            "highest prosecutor risk (max_risk_highest={})",
            self.highest
        )
    }
    fn admits(&self, class: &ClassCounts<'_>, _: &SensitiveDistribution) -> bool {
        class.size > 0 && 1.0 / class.size as f64 <= self.highest + TOLERANCE
    }
    fn violation(&self, class: &ClassCounts<'_>, t: &SensitiveDistribution) -> Option<String> {
        (!self.admits(class, t)).then(|| {
            format!(
                "risk 1/{} = {:.6} > max_risk_highest={}",
                class.size,
                1.0 / class.size.max(1) as f64,
                self.highest
            )
        })
    }
}

/// A criterion on a whole release rather than on one class: measured on the class-size histogram of
/// the released classes (suppressed rows left out, as the risk engine measures a release).
pub trait ReleaseCriterion: fmt::Debug + Send + Sync {
    /// The measure and its bound, e.g. `average prosecutor risk (max_risk_average=0.1)`.
    fn name(&self) -> String;
    /// Whether the criterion holds at every node above one where it holds when nothing is
    /// suppressed (OLA may then tag and predict with it).
    fn monotone(&self) -> bool;
    fn bound(&self) -> f64;
    /// The measured value, or why the measure has no value (then the criterion does not hold).
    fn measure(&self, released: &Histogram) -> Result<f64, String>;
    /// The most classes a release of `records` records may have, when the criterion caps it (what
    /// Mondrian's splits honour).
    fn max_classes(&self, _records: u64) -> Option<u64> {
        None
    }
    /// Whether the release's measure is within the bound.
    fn holds(&self, released: &Histogram) -> bool {
        matches!(self.measure(released), Ok(v) if v <= self.bound() + TOLERANCE)
    }
}

/// Average prosecutor risk: classes / records ≤ `average`. Monotone under generalization (merging
/// classes lowers the count, records stay), not with suppression (suppressing the large classes of
/// a node can leave fewer, larger-risk ones kept at the node above).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AverageRisk {
    pub average: f64,
}

impl ReleaseCriterion for AverageRisk {
    fn name(&self) -> String {
        format!(
            "average prosecutor risk (max_risk_average={})",
            self.average
        )
    }
    fn monotone(&self) -> bool {
        true
    }
    fn bound(&self) -> f64 {
        self.average
    }
    fn measure(&self, released: &Histogram) -> Result<f64, String> {
        if released.is_empty() {
            return Ok(0.0);
        }
        Ok(released.classes() as f64 / released.records() as f64)
    }
    fn max_classes(&self, records: u64) -> Option<u64> {
        Some(((self.average + TOLERANCE) * records as f64).floor() as u64)
    }
}

/// The share of population uniques under a model: not monotone (the models' estimates move either
/// way as classes merge), so OLA checks it at every node and never tags with it.
impl ReleaseCriterion for UniquenessBound {
    fn name(&self) -> String {
        format!(
            "population uniqueness ({}, population={}, max={})",
            self.model, self.population, self.max
        )
    }
    fn monotone(&self) -> bool {
        false
    }
    fn bound(&self) -> f64 {
        self.max
    }
    fn measure(&self, released: &Histogram) -> Result<f64, String> {
        if released.is_empty() {
            return Ok(0.0);
        }
        let n = released.records() as f64;
        if self.population < n {
            return Err(format!(
                "the population ({}) is smaller than the released records ({n})",
                self.population
            ));
        }
        let all = population_uniqueness(released, self.population);
        let estimate = match self.model {
            UniquenessModel::Pitman => all.pitman,
            UniquenessModel::Zayatz => all.zayatz,
            UniquenessModel::Snb => all.snb,
            UniquenessModel::Dankar => all.dankar.estimate,
        };
        match estimate {
            Estimate::Estimated { share, .. } => Ok(share),
            Estimate::Unavailable { unavailable } => Err(unavailable),
        }
    }
}

/// k-anonymity: every class has at least k records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KAnonymity {
    pub k: u64,
}

impl PrivacyModel for KAnonymity {
    fn name(&self) -> String {
        format!("k-anonymity (k={})", self.k)
    }
    fn admits(&self, class: &ClassCounts<'_>, _: &SensitiveDistribution) -> bool {
        class.size >= self.k
    }
    fn violation(&self, class: &ClassCounts<'_>, t: &SensitiveDistribution) -> Option<String> {
        (!self.admits(class, t)).then(|| format!("{} records < k={}", class.size, self.k))
    }
}

fn recursive_holds(class: &ClassCounts<'_>, l: usize, c: f64) -> bool {
    let mut sorted: Vec<u32> = class.counts.iter().copied().filter(|&x| x > 0).collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let Some(&r1) = sorted.first() else {
        return false;
    };
    let tail: u64 = sorted
        .iter()
        .skip(l.saturating_sub(1))
        .map(|&r| r as u64)
        .sum();
    (r1 as f64) < c * tail as f64
}

impl PrivacyModel for LDiversity {
    fn name(&self) -> String {
        match self {
            LDiversity::Distinct(l) => format!("distinct l-diversity (l={l})"),
            LDiversity::Entropy(l) => format!("entropy l-diversity (l={l})"),
            LDiversity::Probabilistic(l) => format!("probabilistic l-diversity (l={l})"),
            LDiversity::Recursive { l, c } => format!("recursive (c,l)-diversity (c={c}, l={l})"),
        }
    }
    fn admits(&self, class: &ClassCounts<'_>, _: &SensitiveDistribution) -> bool {
        match *self {
            LDiversity::Distinct(l) => class.distinct() as f64 >= l,
            LDiversity::Entropy(l) => class.entropy() >= l.ln() - TOLERANCE,
            LDiversity::Probabilistic(l) => {
                class.max_count() as f64 * l <= class.size as f64 * (1.0 + TOLERANCE)
            }
            LDiversity::Recursive { l, c } => recursive_holds(class, l, c),
        }
    }
    fn violation(&self, class: &ClassCounts<'_>, t: &SensitiveDistribution) -> Option<String> {
        if self.admits(class, t) {
            return None;
        }
        Some(match *self {
            LDiversity::Distinct(l) => {
                format!("{} distinct sensitive values < l={l}", class.distinct())
            }
            LDiversity::Entropy(l) => {
                format!("entropy {:.6} < ln(l={l}) = {:.6}", class.entropy(), l.ln())
            }
            LDiversity::Probabilistic(l) => format!(
                "most frequent sensitive value has probability {:.6} > 1/l = {:.6}",
                class.max_count() as f64 / class.size.max(1) as f64,
                1.0 / l
            ),
            LDiversity::Recursive { l, c } => format!(
                "r1 >= c (r_l + ... + r_m) for c={c}, l={l} ({} distinct sensitive values)",
                class.distinct()
            ),
        })
    }
}

impl PrivacyModel for TCloseness {
    fn name(&self) -> String {
        match self.distance {
            Distance::Emd => format!("t-closeness (EMD, t={})", self.t),
            Distance::Js => format!("t-closeness (JS divergence, t={})", self.t),
        }
    }
    fn admits(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> bool {
        let d = match self.distance {
            Distance::Emd => class.emd(table),
            Distance::Js => class.js(table),
        };
        d <= self.t + TOLERANCE
    }
    fn violation(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> Option<String> {
        if self.admits(class, table) {
            return None;
        }
        let d = match self.distance {
            Distance::Emd => class.emd(table),
            Distance::Js => class.js(table),
        };
        Some(format!(
            "distance to the table's distribution {d:.6} > t={}",
            self.t
        ))
    }
}

/// delta-disclosure (strict): |ln(p(class,s) / p(T,s))| < delta for every sensitive value s of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaDisclosure {
    pub delta: f64,
}

impl PrivacyModel for DeltaDisclosure {
    fn name(&self) -> String {
        format!("delta-disclosure (delta={})", self.delta)
    }
    fn admits(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> bool {
        class.delta(table) < self.delta
    }
    fn violation(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> Option<String> {
        if self.admits(class, table) {
            return None;
        }
        let d = class.delta(table);
        Some(if d.is_infinite() {
            "a sensitive value of the table is absent from the class".to_string()
        } else {
            format!(
                "max |ln(p(class,s)/p(T,s))| = {d:.6} >= delta={}",
                self.delta
            )
        })
    }
}

/// Every requested model; a class is admitted when every model admits it, a release when, besides,
/// every release criterion holds on its kept classes.
#[derive(Debug, Default)]
pub struct ModelSet {
    pub models: Vec<Box<dyn PrivacyModel>>,
    pub release: Vec<Box<dyn ReleaseCriterion>>,
}

/// A release criterion a release does not meet: the criterion, its bound and the measured value
/// (or why there is none).
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseViolation {
    pub criterion: String,
    pub bound: f64,
    pub measured: Result<f64, String>,
}

impl fmt::Display for ReleaseViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.measured {
            Ok(v) => write!(
                f,
                "{}: measured {v:.6} > bound {}",
                self.criterion, self.bound
            ),
            Err(why) => write!(
                f,
                "{}: no measured value ({why}), so the bound {} cannot be shown",
                self.criterion, self.bound
            ),
        }
    }
}

impl ModelSet {
    /// Whether every release criterion holds on the kept classes' sizes (`all`), and whether every
    /// monotone one does (`monotone`).
    pub fn release_holds(&self, kept_sizes: impl IntoIterator<Item = u64>) -> (bool, bool) {
        if self.release.is_empty() {
            return (true, true);
        }
        let h = Histogram::from_sizes(kept_sizes);
        let mut all = true;
        let mut monotone = true;
        for c in &self.release {
            if !c.holds(&h) {
                all = false;
                if c.monotone() {
                    monotone = false;
                }
            }
        }
        (all, monotone)
    }

    /// The most classes a release of `records` records may have under every release criterion.
    pub fn max_classes(&self, records: u64) -> Option<(u64, String)> {
        self.release
            .iter()
            .filter_map(|c| c.max_classes(records).map(|m| (m, c.name())))
            .min_by_key(|(m, _)| *m)
    }

    /// Whether every release criterion is monotone.
    pub fn release_monotone(&self) -> bool {
        self.release.iter().all(|c| c.monotone())
    }

    /// The first release criterion the kept classes (of these sizes) violate.
    pub fn release_violation(
        &self,
        kept_sizes: impl IntoIterator<Item = u64>,
    ) -> Option<ReleaseViolation> {
        if self.release.is_empty() {
            return None;
        }
        let h = Histogram::from_sizes(kept_sizes);
        self.release
            .iter()
            .find(|c| !c.holds(&h))
            .map(|c| ReleaseViolation {
                criterion: c.name(),
                bound: c.bound(),
                measured: c.measure(&h),
            })
    }

    pub fn admits(&self, class: &ClassCounts<'_>, table: &SensitiveDistribution) -> bool {
        self.models.iter().all(|m| m.admits(class, table))
    }

    /// The first violated model and why.
    pub fn violation(
        &self,
        class: &ClassCounts<'_>,
        table: &SensitiveDistribution,
    ) -> Option<(String, String)> {
        self.models
            .iter()
            .find_map(|m| m.violation(class, table).map(|why| (m.name(), why)))
    }

    /// The names of the per-class models (the report's `models`).
    pub fn names(&self) -> Vec<String> {
        self.models.iter().map(|m| m.name()).collect()
    }

    /// The names of every model and release criterion.
    pub fn all_names(&self) -> Vec<String> {
        self.models
            .iter()
            .map(|m| m.name())
            .chain(self.release.iter().map(|c| c.name()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(counts: &[u64]) -> SensitiveDistribution {
        SensitiveDistribution::from_counts(counts.to_vec(), false)
    }

    #[test]
    fn parses_model_specs() {
        assert_eq!("distinct:3".parse(), Ok(LDiversity::Distinct(3.0)));
        assert_eq!(
            "recursive:3:c=2".parse(),
            Ok(LDiversity::Recursive { l: 3, c: 2.0 })
        );
        assert!("entropic:3".parse::<LDiversity>().is_err());
        assert!("distinct:0.5".parse::<LDiversity>().is_err());
        assert!("recursive:3".parse::<LDiversity>().is_err());
        assert_eq!(
            "js:0.2".parse(),
            Ok(TCloseness {
                t: 0.2,
                distance: Distance::Js
            })
        );
        assert!("emd:1.5".parse::<TCloseness>().is_err());
        assert!("kl:0.1".parse::<TCloseness>().is_err());
        let bad = PrivacySpec {
            k: Some(0),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = PrivacySpec {
            delta: Some(0.0),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn models_check_classes() {
        let t = table(&[5, 5, 5, 5]);
        let uniform = ClassCounts {
            size: 4,
            counts: &[1, 1, 1, 1],
        };
        let skewed = ClassCounts {
            size: 4,
            counts: &[3, 1, 0, 0],
        };
        assert!(LDiversity::Entropy(4.0).admits(&uniform, &t));
        assert!(!LDiversity::Entropy(2.0).admits(&skewed, &t));
        assert!(LDiversity::Probabilistic(4.0).admits(&uniform, &t));
        assert!(!LDiversity::Probabilistic(2.0).admits(&skewed, &t));
        assert!(LDiversity::Recursive { l: 2, c: 4.0 }.admits(&skewed, &t));
        assert!(!LDiversity::Recursive { l: 2, c: 3.0 }.admits(&skewed, &t));
        assert!(!LDiversity::Recursive { l: 3, c: 100.0 }.admits(&skewed, &t));
        let delta = DeltaDisclosure { delta: 0.1 };
        assert!(delta.admits(&uniform, &t));
        assert!(!delta.admits(&skewed, &t));
        assert!(
            delta
                .violation(&skewed, &t)
                .unwrap()
                .contains("absent from the class")
        );
        let emd = TCloseness {
            t: 0.5,
            distance: Distance::Emd,
        };
        // TV([.75,.25,0,0], uniform) = 0.5.
        assert!(emd.admits(&skewed, &t));
        assert!(
            !TCloseness {
                t: 0.49,
                distance: Distance::Emd
            }
            .admits(&skewed, &t)
        );
    }
}
