//! Naive Bayes as Weka 3.6's `weka.classifiers.bayes.NaiveBayes` with its defaults: the class prior
//! and each nominal attribute's per-class value counts are Weka's `DiscreteEstimator` with the
//! Laplace correction (every count starts at 1); each numeric attribute is Weka's `NormalEstimator`
//! per class, with the precision NaiveBayes derives from the training rows (the mean gap between
//! successive distinct values, 0.01 when there is at most one distinct value).
//!
//! Invariants: a model depends only on the training rows and their order (the order decides the
//! last bits of a numeric estimator's sums, as in Weka); a prediction multiplies the class prior by
//! each attribute's probability floored at 1e-75, rescaling by 1e75 when the largest product falls
//! below 1e-75 (Weka's underflow guard), and returns the first class of highest product (Weka's
//! `Utils.maxIndex`).
use super::dataset::Column;
use super::normal::normal_probability;
use super::{Dataset, Learner, Model};

/// Weka's NaiveBayes with its defaults (no kernel estimator, no discretization).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NaiveBayes;

/// Weka's `NormalEstimator`: a normal density over values rounded to `precision`, integrated over
/// the rounding interval.
#[derive(Debug, Clone, PartialEq)]
struct NormalEstimator {
    precision: f64,
    sum_of_weights: f64,
    sum_of_values: f64,
    sum_of_values_sq: f64,
    mean: f64,
    standard_dev: f64,
}

impl NormalEstimator {
    fn new(precision: f64) -> NormalEstimator {
        NormalEstimator {
            precision,
            sum_of_weights: 0.0,
            sum_of_values: 0.0,
            sum_of_values_sq: 0.0,
            mean: 0.0,
            standard_dev: precision / (2.0 * 3.0),
        }
    }

    /// Java's `Math.rint(data / precision) * precision`.
    fn round(&self, data: f64) -> f64 {
        (data / self.precision).round_ties_even() * self.precision
    }

    fn add(&mut self, data: f64) {
        let data = self.round(data);
        self.sum_of_weights += 1.0;
        self.sum_of_values += data;
        self.sum_of_values_sq += data * data;
        self.mean = self.sum_of_values / self.sum_of_weights;
        let std_dev = ((self.sum_of_values_sq - self.mean * self.sum_of_values).abs()
            / self.sum_of_weights)
            .sqrt();
        // Weka: near zero, the scale is unknown yet and the default stays.
        if std_dev > 1e-10 {
            self.standard_dev = (self.precision / (2.0 * 3.0)).max(std_dev);
        }
    }

    fn probability(&self, data: f64) -> f64 {
        let data = self.round(data);
        let z_lower = (data - self.mean - self.precision / 2.0) / self.standard_dev;
        let z_upper = (data - self.mean + self.precision / 2.0) / self.standard_dev;
        normal_probability(z_upper) - normal_probability(z_lower)
    }
}

/// What one attribute contributes, per class.
#[derive(Debug, Clone, PartialEq)]
enum Estimators {
    /// The class attribute itself (contributes nothing).
    Class,
    /// `counts[class][value]` (Laplace: starting at 1) and each class's total.
    Discrete {
        counts: Vec<Vec<f64>>,
        sums: Vec<f64>,
    },
    Normal(Vec<NormalEstimator>),
}

/// A trained Naive Bayes model.
#[derive(Debug, Clone, PartialEq)]
pub struct NaiveBayesModel {
    /// The class prior (Laplace-corrected counts over their sum).
    prior: Vec<f64>,
    attributes: Vec<Estimators>,
}

/// NaiveBayes' precision of a numeric attribute on the training rows: the sum of the gaps between
/// successive distinct sorted values over their number, 0.01 without any gap.
fn numeric_precision(values: &[f64], rows: &[u32]) -> f64 {
    let mut sorted: Vec<f64> = rows.iter().map(|&r| values[r as usize]).collect();
    sorted.sort_by(f64::total_cmp);
    let mut delta_sum = 0.0;
    let mut distinct = 0u32;
    if let Some(&first) = sorted.first() {
        let mut last = first;
        for &value in &sorted[1..] {
            if value != last {
                delta_sum += value - last;
                last = value;
                distinct += 1;
            }
        }
    }
    if distinct > 0 {
        delta_sum / f64::from(distinct)
    } else {
        0.01
    }
}

impl Learner for NaiveBayes {
    type Model = NaiveBayesModel;

    fn fit(&self, data: &Dataset, class: usize, rows: &[u32], _seed: u64) -> NaiveBayesModel {
        let classes = data.attribute(class).values();
        let labels = data.nominal_codes(class);
        let mut class_counts = vec![1.0; classes];
        for &row in rows {
            class_counts[labels[row as usize] as usize] += 1.0;
        }
        let class_sum = classes as f64 + rows.len() as f64;
        let prior = class_counts.iter().map(|c| c / class_sum).collect();
        let attributes = (0..data.attributes().len())
            .map(|a| {
                if a == class {
                    return Estimators::Class;
                }
                match data.column(a) {
                    Column::Nominal(codes) => {
                        let values = data.attribute(a).values();
                        let mut counts = vec![vec![1.0; values]; classes];
                        let mut sums = vec![values as f64; classes];
                        for &row in rows {
                            let c = labels[row as usize] as usize;
                            counts[c][codes[row as usize] as usize] += 1.0;
                            sums[c] += 1.0;
                        }
                        Estimators::Discrete { counts, sums }
                    }
                    Column::Numeric(values) => {
                        let precision = numeric_precision(values, rows);
                        let mut estimators = vec![NormalEstimator::new(precision); classes];
                        for &row in rows {
                            estimators[labels[row as usize] as usize].add(values[row as usize]);
                        }
                        Estimators::Normal(estimators)
                    }
                }
            })
            .collect();
        NaiveBayesModel { prior, attributes }
    }
}

impl NaiveBayesModel {
    /// The unnormalized class scores of row `row` (Weka's `distributionForInstance` before its final
    /// normalization).
    fn scores(&self, data: &Dataset, row: u32) -> Vec<f64> {
        let row = row as usize;
        let mut probs = self.prior.clone();
        for (a, estimators) in self.attributes.iter().enumerate() {
            let mut max = 0.0f64;
            match (estimators, data.column(a)) {
                (Estimators::Class, _) => continue,
                (Estimators::Discrete { counts, sums }, Column::Nominal(codes)) => {
                    let value = codes[row] as usize;
                    for (c, p) in probs.iter_mut().enumerate() {
                        let q = if sums[c] == 0.0 {
                            0.0
                        } else {
                            counts[c][value] / sums[c]
                        };
                        *p *= q.max(1e-75);
                        max = max.max(*p);
                    }
                }
                (Estimators::Normal(normals), Column::Numeric(values)) => {
                    let value = values[row];
                    for (p, normal) in probs.iter_mut().zip(normals) {
                        *p *= normal.probability(value).max(1e-75);
                        max = max.max(*p);
                    }
                }
                _ => unreachable!("a model predicts rows of the dataset it was fitted on"),
            }
            if max > 0.0 && max < 1e-75 {
                for p in &mut probs {
                    *p *= 1e75;
                }
            }
        }
        probs
    }
}

/// The first index of the largest value (Weka's `Utils.maxIndex`).
pub(crate) fn max_index(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

impl Model for NaiveBayesModel {
    fn predict(&self, data: &Dataset, row: u32) -> u32 {
        max_index(&self.scores(data, row)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learning::cross_validate;

    #[test]
    fn normal_probability_is_the_normal_distribution_function() {
        assert!((normal_probability(0.0) - 0.5).abs() < 1e-15);
        assert!((normal_probability(1.0) - 0.841_344_746_068_542_9).abs() < 1e-14);
        assert!((normal_probability(-2.5) - 0.006_209_665_325_776_132).abs() < 1e-15);
        assert!(normal_probability(40.0) == 1.0);
        assert!(normal_probability(-40.0) == 0.0);
    }

    #[test]
    fn precision_is_the_mean_gap_between_distinct_values() {
        assert_eq!(numeric_precision(&[1.0, 3.0, 3.0, 7.0], &[0, 1, 2, 3]), 3.0);
        assert_eq!(numeric_precision(&[5.0, 5.0], &[0, 1]), 0.01);
        assert_eq!(numeric_precision(&[1.0, 9.0], &[0]), 0.01);
    }

    /// Counts by hand: two classes, one nominal attribute; Laplace keeps an unseen value possible.
    #[test]
    fn nominal_counts_are_laplace_corrected() {
        let rows = [["x", "a"], ["x", "a"], ["y", "b"], ["x", "b"], ["y", "b"]];
        let data = Dataset::from_rows(
            &["v", "class"],
            &[false, false],
            rows.iter().map(|r| r.iter().copied()),
        )
        .unwrap();
        let model = NaiveBayes.fit(&data, 1, &[0, 1, 2, 3, 4], 1);
        // P(a) = 3/7, P(b) = 4/7; P(x|a) = 3/4, P(x|b) = 2/5; P(y|a) = 1/4, P(y|b) = 3/5.
        let s = model.scores(&data, 0);
        assert!((s[0] - 3.0 / 7.0 * 3.0 / 4.0).abs() < 1e-15, "{s:?}");
        assert!((s[1] - 4.0 / 7.0 * 2.0 / 5.0).abs() < 1e-15, "{s:?}");
        assert_eq!(model.predict(&data, 0), 0);
        assert_eq!(model.predict(&data, 2), 1);
        let accuracy = cross_validate(&NaiveBayes, &data, 1, 2, 1).unwrap();
        assert_eq!(accuracy.total, 5);
    }

    #[test]
    fn a_numeric_attribute_separates_two_normal_classes() {
        let rows: Vec<[String; 2]> = (0..60)
            .map(|i| {
                let class = if i % 2 == 0 { "lo" } else { "hi" };
                let value = if i % 2 == 0 { i % 7 } else { 20 + i % 5 };
                [value.to_string(), class.to_string()]
            })
            .collect();
        let data = Dataset::from_rows(
            &["v", "class"],
            &[true, false],
            rows.iter().map(|r| r.iter().map(String::as_str)),
        )
        .unwrap();
        let accuracy = cross_validate(&NaiveBayes, &data, 1, 10, 1).unwrap();
        assert_eq!(accuracy.correct, 60);
    }
}
