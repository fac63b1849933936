//! The learning workload of Brickell & Shmatikov (KDD 2008, sections 5 and 6): how well a classifier
//! learned from a table predicts one of its attributes, measured by stratified k-fold
//! cross-validation exactly as Weka runs it.
//!
//! Invariants: an engine like the others (no runtime, files or clock). A [`Dataset`] is columnar,
//! has no missing values, and its nominal values keep the order in which they were declared (the
//! order an ARFF export writes them, which decides Weka's ties). Folds are Weka's, row for row
//! ([`folds`]): the same seed gives the same test folds as `weka.classifiers.Evaluation -x N -s
//! SEED`, so an accuracy differs from Weka's only where the classifier does. A [`Learner`] fits on a
//! list of row indices of one dataset (no copy per fold) and never sees the test rows; every run is
//! determined by the dataset, the rows and the seed.
use std::sync::atomic::{AtomicBool, Ordering};

pub mod dataset;
pub mod folds;
pub mod forest;
pub mod j48;
pub mod java_random;
pub mod naive_bayes;
mod normal;

pub use dataset::{Attribute, AttributeKind, Dataset, DatasetError};
pub use folds::stratified_folds;
pub use forest::RandomForest;
pub use j48::{J48, J48Model};
pub use naive_bayes::NaiveBayes;

/// A classifier before training: its parameters.
pub trait Learner {
    type Model: Model;
    /// Fits a model predicting the nominal attribute `class` of `data` from every other attribute,
    /// on the rows `rows` (indices into `data`, in the order training should see them). `seed`
    /// drives any randomness of the learner.
    fn fit(&self, data: &Dataset, class: usize, rows: &[u32], seed: u64) -> Self::Model;
}

/// A trained classifier.
pub trait Model {
    /// The predicted class (a value index of the class attribute) of row `row` of `data`.
    fn predict(&self, data: &Dataset, row: u32) -> u32;
}

/// The outcome of a cross-validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accuracy {
    /// Test rows predicted right, over all folds.
    pub correct: u64,
    /// Test rows, over all folds (every row of the dataset once).
    pub total: u64,
}

impl Accuracy {
    /// The share of test rows predicted right, in [0, 1] (0 for no rows).
    pub fn rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

/// Why a cross-validation cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LearningError {
    #[error("the class attribute {0} is not nominal (rule: a workload learns a nominal attribute)")]
    NumericClass(String),
    #[error("{folds} folds but {rows} rows (rule: 2 <= folds <= rows)")]
    Folds { folds: usize, rows: usize },
    #[error("no attribute at index {0} (rule: the class is one of the dataset's attributes)")]
    NoSuchAttribute(usize),
}

/// Stratified `folds`-fold cross-validation of `learner` predicting `class`, Weka's folds for `seed`
/// ([`stratified_folds`]); each fold's model is fitted on the other folds' rows with seed `seed`.
pub fn cross_validate<L: Learner + Sync>(
    learner: &L,
    data: &Dataset,
    class: usize,
    folds: usize,
    seed: u64,
) -> Result<Accuracy, LearningError> {
    let never = AtomicBool::new(false);
    Ok(
        cross_validate_unless(learner, data, class, folds, seed, &never)?
            .expect("a cross-validation that cannot be cancelled completes"),
    )
}

/// [`cross_validate`], giving up (`Ok(None)`) before the next fold once `cancelled` turns true.
///
/// The folds run on up to [`std::thread::available_parallelism`] scoped threads
/// ([`cross_validate_on`]).
pub fn cross_validate_unless<L: Learner + Sync>(
    learner: &L,
    data: &Dataset,
    class: usize,
    folds: usize,
    seed: u64,
    cancelled: &AtomicBool,
) -> Result<Option<Accuracy>, LearningError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    cross_validate_on(learner, data, class, folds, seed, threads, cancelled)
}

/// [`cross_validate_unless`] on up to `threads` scoped threads (fold `i` on thread `i mod
/// threads`; 0 counts as 1), for a caller that shares a thread budget among several
/// cross-validations. Each fold's model depends only on its rows and the seed, and the counts are
/// summed as integers, so the result does not depend on the number of threads.
pub fn cross_validate_on<L: Learner + Sync>(
    learner: &L,
    data: &Dataset,
    class: usize,
    folds: usize,
    seed: u64,
    threads: usize,
    cancelled: &AtomicBool,
) -> Result<Option<Accuracy>, LearningError> {
    let split = stratified_folds(data, class, folds, seed)?;
    let threads = threads.clamp(1, split.folds());
    let run = |thread: usize| -> Option<Accuracy> {
        let labels = data.nominal_codes(class);
        let mut accuracy = Accuracy {
            correct: 0,
            total: 0,
        };
        for fold in (thread..split.folds()).step_by(threads) {
            if cancelled.load(Ordering::Relaxed) {
                return None;
            }
            let (train, test) = split.fold(fold);
            let model = learner.fit(data, class, train, seed);
            for &row in test {
                accuracy.total += 1;
                if model.predict(data, row) == labels[row as usize] {
                    accuracy.correct += 1;
                }
            }
        }
        Some(accuracy)
    };
    let parts: Vec<Option<Accuracy>> = if threads <= 1 {
        vec![run(0)]
    } else {
        let run = &run;
        std::thread::scope(|scope| {
            let handles: Vec<_> = (1..threads).map(|t| scope.spawn(move || run(t))).collect();
            let mut parts = vec![run(0)];
            parts.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))),
            );
            parts
        })
    };
    let mut accuracy = Accuracy {
        correct: 0,
        total: 0,
    };
    for part in parts {
        let Some(part) = part else {
            return Ok(None);
        };
        accuracy.correct += part.correct;
        accuracy.total += part.total;
    }
    Ok(Some(accuracy))
}
