//! Sample-based re-identification risk (El Emam): prosecutor, journalist and marketer risk, and
//! sample uniqueness, from the sizes of the equivalence classes (and, for the journalist, the sizes
//! of the matching classes of a population table). Definitions as ARX's `RiskModelSampleSummary`
//! and `RiskModelSampleUniqueness`; formulas and edge cases in docs/risk.md.
//!
//! Invariants: a record's prosecutor risk is 1/|its class|; the journalist's is 1/|its class in
//! the population table| (the sample itself when there is none); "at risk" means strictly above the
//! threshold. The caller never passes an empty histogram ([`crate::risk::RiskError::NoRecords`]).
//! The record-risk histogram ([`risk_bins`]) and the riskiest classes ([`riskiest`]) say how many
//! classes and records carry each risk, by class size only: never a class's values.
use serde::Serialize;

use crate::risk::Histogram;

/// Prosecutor or journalist risk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordRisk {
    /// The highest risk of a record: 1 / the smallest class.
    pub highest: f64,
    /// The lowest risk of a record: 1 / the largest class.
    pub lowest: f64,
    /// The expected share of records re-identified.
    pub average: f64,
    /// The share of records whose risk is above the threshold.
    pub records_at_risk: f64,
}

/// Marketer risk: the expected share of records re-identified when all are attacked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MarketerRisk {
    pub average: f64,
}

/// Sample uniqueness.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleUniqueness {
    /// Records alone in their class.
    pub unique_records: u64,
    /// unique_records / records.
    pub share: f64,
}

/// Prosecutor risk: the attacker knows the target is in the sample.
pub fn prosecutor(histogram: &Histogram, threshold: f64) -> RecordRisk {
    let n = histogram.records() as f64;
    let at_risk: u64 = histogram
        .entries()
        .iter()
        .filter(|&&(size, _)| 1.0 / size as f64 > threshold)
        .map(|&(size, count)| size * count)
        .sum();
    RecordRisk {
        highest: 1.0 / histogram.smallest() as f64,
        lowest: 1.0 / histogram.largest() as f64,
        average: histogram.classes() as f64 / n,
        records_at_risk: at_risk as f64 / n,
    }
}

/// Journalist risk against a population table: `pairs` holds, per sample class, its size in the
/// sample and the size of the population class with the same key (≥ the sample size). The average
/// is the larger of El Emam's two estimates, as ARX: classes / Σ population sizes and the mean
/// over records of 1 / population size.
pub fn journalist(pairs: &[(u64, u64)], threshold: f64) -> RecordRisk {
    let mut at_risk = 0u64;
    let mut records = 0u64;
    let mut population_records = 0u64;
    let mut smallest = u64::MAX;
    let mut largest = 0;
    let mut expected = 0.0;
    for &(sample, population) in pairs {
        if 1.0 / population as f64 > threshold {
            at_risk += sample;
        }
        smallest = smallest.min(population);
        largest = largest.max(population);
        records += sample;
        population_records += population;
        expected += sample as f64 / population as f64;
    }
    let n = records as f64;
    RecordRisk {
        highest: 1.0 / smallest as f64,
        lowest: 1.0 / largest as f64,
        average: (pairs.len() as f64 / population_records as f64).max(expected / n),
        records_at_risk: at_risk as f64 / n,
    }
}

/// Marketer risk against a population table (`pairs` as [`journalist`]): the mean over records of
/// 1 / population class size; without a population table, classes / records.
pub fn marketer(pairs: &[(u64, u64)]) -> MarketerRisk {
    let records: u64 = pairs.iter().map(|p| p.0).sum();
    let expected: f64 = pairs.iter().map(|&(s, p)| s as f64 / p as f64).sum();
    MarketerRisk {
        average: expected / records as f64,
    }
}

/// Sample uniqueness.
pub fn sample_uniqueness(histogram: &Histogram) -> SampleUniqueness {
    let unique = histogram.classes_of_size(1);
    SampleUniqueness {
        unique_records: unique,
        share: unique as f64 / histogram.records() as f64,
    }
}

/// The lower class-size bounds of the record-risk histogram's bins: sizes 1, 2, 3-4, 5-9, 10-19,
/// 20-49, 50-99 and 100 or more (risks 1, 1/2, 1/3-1/4, 1/5-1/9, ...). The bin of 5-9 starts at
/// the default threshold: the records of the first three bins are the records at risk at 0.2.
pub const RISK_BIN_SIZES: [u64; 8] = [1, 2, 3, 5, 10, 20, 50, 100];

/// One bin of the record-risk histogram: the classes of `min_size` to `max_size` records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RiskBin {
    pub min_size: u64,
    /// The largest size of the bin; `None` for the last, open bin.
    pub max_size: Option<u64>,
    /// The risk of a record of the bin's smallest class: 1 / `min_size`.
    pub highest_risk: f64,
    /// The risk of a record of the bin's largest size: 1 / `max_size`; `None` for the open bin.
    pub lowest_risk: Option<f64>,
    pub classes: u64,
    pub records: u64,
}

/// The record-risk histogram: every bin of [`RISK_BIN_SIZES`], empty ones too, with the classes and
/// records whose size falls in it.
pub fn risk_bins(histogram: &Histogram) -> Vec<RiskBin> {
    let mut bins: Vec<RiskBin> = RISK_BIN_SIZES
        .iter()
        .enumerate()
        .map(|(i, &min_size)| {
            let max_size = RISK_BIN_SIZES.get(i + 1).map(|next| next - 1);
            RiskBin {
                min_size,
                max_size,
                highest_risk: 1.0 / min_size as f64,
                lowest_risk: max_size.map(|m| 1.0 / m as f64),
                classes: 0,
                records: 0,
            }
        })
        .collect();
    for &(size, count) in histogram.entries() {
        let at = RISK_BIN_SIZES
            .iter()
            .rposition(|&min| min <= size)
            .unwrap_or(0);
        bins[at].classes += count;
        bins[at].records += size * count;
    }
    bins
}

/// The classes of one size: how many there are, their records and each record's risk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassGroup {
    pub size: u64,
    pub classes: u64,
    pub records: u64,
    /// 1 / `size`.
    pub risk: f64,
}

/// The riskiest classes, grouped by size: the `most` smallest class sizes, smallest first.
pub fn riskiest(histogram: &Histogram, most: usize) -> Vec<ClassGroup> {
    histogram
        .entries()
        .iter()
        .take(most)
        .map(|&(size, classes)| ClassGroup {
            size,
            classes,
            records: size * classes,
            risk: 1.0 / size as f64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The bins and the riskiest classes against a count record by record: each record's risk
        /// 1/|its class| placed in the bin whose risk range holds it.
        #[test]
        fn risk_bins_and_riskiest_equal_a_record_by_record_count(
            sizes in prop::collection::vec(1u64..250, 0..40),
            most in 0usize..6,
        ) {
            let h = Histogram::from_sizes(sizes.iter().copied());
            let bins = risk_bins(&h);
            prop_assert_eq!(bins.len(), RISK_BIN_SIZES.len());
            for bin in &bins {
                let holds = |risk: f64| {
                    risk <= bin.highest_risk && bin.lowest_risk.is_none_or(|low| risk >= low)
                };
                // One risk per record, then one per class.
                let records = sizes
                    .iter()
                    .flat_map(|&size| std::iter::repeat_n(1.0 / size as f64, size as usize))
                    .filter(|&risk| holds(risk))
                    .count() as u64;
                let classes = sizes.iter().filter(|&&size| holds(1.0 / size as f64)).count() as u64;
                prop_assert_eq!(bin.records, records, "{:?}", bin);
                prop_assert_eq!(bin.classes, classes, "{:?}", bin);
            }
            prop_assert_eq!(bins.iter().map(|b| b.records).sum::<u64>(), sizes.iter().sum::<u64>());
            let mut distinct = sizes.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let top = riskiest(&h, most);
            prop_assert_eq!(top.len(), distinct.len().min(most));
            for (group, &size) in top.iter().zip(&distinct) {
                let classes = sizes.iter().filter(|&&s| s == size).count() as u64;
                prop_assert_eq!(group, &ClassGroup { size, classes, records: size * classes, risk: 1.0 / size as f64 });
            }
        }
    }

    #[test]
    fn risk_bins_by_hand() {
        // Sizes 1, 1, 2, 4, 120: bins 1 (2 classes, 2 records), 2 (1, 2), 3-4 (1, 4), 100+ (1, 120).
        let bins = risk_bins(&Histogram::from_sizes([1, 1, 2, 4, 120]));
        let counts: Vec<(u64, u64)> = bins.iter().map(|b| (b.classes, b.records)).collect();
        assert_eq!(
            counts,
            [
                (2, 2),
                (1, 2),
                (1, 4),
                (0, 0),
                (0, 0),
                (0, 0),
                (0, 0),
                (1, 120)
            ]
        );
        assert_eq!((bins[2].min_size, bins[2].max_size), (3, Some(4)));
        assert_eq!(bins[2].lowest_risk, Some(0.25));
        assert_eq!((bins[7].max_size, bins[7].lowest_risk), (None, None));
        assert!(
            risk_bins(&Histogram::default())
                .iter()
                .all(|b| b.records == 0)
        );
    }

    #[test]
    fn prosecutor_by_hand() {
        // Classes of sizes 1, 1, 2, 4 (8 records): highest 1, lowest 1/4, average 4/8; at a
        // threshold of 0.2, the classes of 1, 1 and 2 (4 records) are at risk, of 4 (1/4 > 0.2) too.
        let h = Histogram::from_sizes([1, 1, 2, 4]);
        let p = prosecutor(&h, 0.2);
        assert_eq!(p.highest, 1.0);
        assert_eq!(p.lowest, 0.25);
        assert_eq!(p.average, 0.5);
        assert_eq!(p.records_at_risk, 1.0);
        // At 0.25 the class of 4 is not above the threshold (strict).
        assert_eq!(prosecutor(&h, 0.25).records_at_risk, 0.5);
        // At 0.5 only the uniques.
        assert_eq!(prosecutor(&h, 0.5).records_at_risk, 0.25);
    }

    #[test]
    fn journalist_and_marketer_against_the_sample_equal_prosecutor() {
        let h = Histogram::from_sizes([1, 1, 2, 4]);
        let pairs: Vec<(u64, u64)> = [1, 1, 2, 4].iter().map(|&s| (s, s)).collect();
        assert_eq!(journalist(&pairs, 0.2), prosecutor(&h, 0.2));
        assert_eq!(marketer(&pairs).average, 0.5);
    }

    #[test]
    fn journalist_and_marketer_against_a_population_by_hand() {
        // Sample classes (1 in a population class of 10), (2 in 4): 3 records.
        let pairs = [(1, 10), (2, 4)];
        let j = journalist(&pairs, 0.2);
        assert_eq!(j.highest, 0.25);
        assert_eq!(j.lowest, 0.1);
        // max(2 / 14, (1/10 + 2/4) / 3) = max(0.142…, 0.2)
        assert!((j.average - 0.2).abs() < 1e-15);
        // 1/4 > 0.2: the 2 records of the second class.
        assert!((j.records_at_risk - 2.0 / 3.0).abs() < 1e-15);
        assert!((marketer(&pairs).average - 0.2).abs() < 1e-15);
    }

    #[test]
    fn sample_uniqueness_by_hand() {
        let u = sample_uniqueness(&Histogram::from_sizes([1, 1, 2, 4]));
        assert_eq!(u.unique_records, 2);
        assert_eq!(u.share, 0.25);
    }
}
