//! Weka's stratified cross-validation folds, row for row.
//!
//! Invariants: for a seed, the rows are shuffled by `Instances.randomize(new Random(seed))`, grouped
//! by class with `Instances.stratify`'s own swap loop, dealt into folds by its `stratStep`, and cut
//! by `testCV`; each fold's training rows are `trainCV`'s, shuffled by the same generator in fold
//! order. Every row is in exactly one test fold; a fold's training rows are all the others.
use super::java_random::JavaRandom;
use super::{Dataset, LearningError};

/// The folds of one cross-validation.
#[derive(Debug, Clone)]
pub struct Folds {
    /// The rows after shuffling and stratification; test fold `i` is a contiguous slice.
    order: Vec<u32>,
    /// Each fold's training rows, in the order Weka trains on them.
    trains: Vec<Vec<u32>>,
}

impl Folds {
    pub fn folds(&self) -> usize {
        self.trains.len()
    }

    /// Fold `i`'s training rows and test rows.
    pub fn fold(&self, i: usize) -> (&[u32], &[u32]) {
        let (first, len) = test_range(self.order.len(), self.trains.len(), i);
        (&self.trains[i], &self.order[first..first + len])
    }
}

/// Weka's `testCV` cut: the first row and the number of rows of test fold `i`.
fn test_range(rows: usize, folds: usize, i: usize) -> (usize, usize) {
    let base = rows / folds;
    let rest = rows % folds;
    if i < rest {
        (i * base + i, base + 1)
    } else {
        (i * base + rest, base)
    }
}

/// Weka's `randomize`: a Fisher-Yates shuffle from the end.
fn randomize(rows: &mut [u32], random: &mut JavaRandom) {
    for j in (1..rows.len()).rev() {
        let k = random.next_int_below(j as i32 + 1) as usize;
        rows.swap(j, k);
    }
}

/// The stratified folds Weka's `Evaluation.crossValidateModel` uses for `seed` (`-x folds -s seed`)
/// on `data` with nominal class attribute `class`.
pub fn stratified_folds(
    data: &Dataset,
    class: usize,
    folds: usize,
    seed: u64,
) -> Result<Folds, LearningError> {
    if class >= data.attributes().len() {
        return Err(LearningError::NoSuchAttribute(class));
    }
    if !data.attribute(class).is_nominal() {
        return Err(LearningError::NumericClass(crate::text::quote(
            &data.attribute(class).name,
        )));
    }
    let rows = data.rows();
    if folds < 2 || folds > rows {
        return Err(LearningError::Folds { folds, rows });
    }
    let labels = data.nominal_codes(class);
    let mut random = JavaRandom::new(seed as i64);
    let mut order: Vec<u32> = (0..rows as u32).collect();
    randomize(&mut order, &mut random);

    // `Instances.stratify`: gather each class behind the first row of it, by Weka's swaps.
    let mut index = 1;
    while index < rows {
        let first = labels[order[index - 1] as usize];
        let scan_from = index;
        for j in scan_from..rows {
            if labels[order[j] as usize] == first {
                order.swap(index, j);
                index += 1;
            }
        }
        index += 1;
    }
    // `stratStep`: deal the grouped rows round-robin into the folds.
    let mut dealt = Vec::with_capacity(rows);
    let mut start = 0;
    while dealt.len() < rows {
        dealt.extend(order[start..].iter().step_by(folds));
        start += 1;
    }
    let order = dealt;

    let trains = (0..folds)
        .map(|i| {
            let (first, len) = test_range(rows, folds, i);
            let mut train = Vec::with_capacity(rows - len);
            train.extend_from_slice(&order[..first]);
            train.extend_from_slice(&order[first + len..]);
            randomize(&mut train, &mut random);
            train
        })
        .collect();
    Ok(Folds { order, trains })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(labels: &[&str]) -> Dataset {
        Dataset::from_rows(
            &["class"],
            &[false],
            labels.iter().map(|l| [*l].into_iter()),
        )
        .unwrap()
    }

    #[test]
    fn every_row_is_tested_once_and_folds_are_stratified() {
        let labels: Vec<&str> = (0..103)
            .map(|i| if i % 4 == 0 { "a" } else { "b" })
            .collect();
        let data = data(&labels);
        let folds = stratified_folds(&data, 0, 10, 1).unwrap();
        let mut seen = vec![0; 103];
        for i in 0..10 {
            let (train, test) = folds.fold(i);
            assert_eq!(train.len() + test.len(), 103);
            for &row in test {
                seen[row as usize] += 1;
                assert!(!train.contains(&row));
            }
            let a = test.iter().filter(|&&r| r % 4 == 0).count();
            assert!((2..=3).contains(&a), "fold {i} has {a} of class a");
        }
        assert!(seen.iter().all(|&s| s == 1));
    }

    #[test]
    fn refuses_too_many_folds_and_numeric_classes() {
        let data = data(&["a", "b"]);
        assert!(matches!(
            stratified_folds(&data, 0, 3, 1),
            Err(LearningError::Folds { folds: 3, rows: 2 })
        ));
        let numeric = Dataset::from_rows(&["x"], &[true], [["1"].into_iter()]).unwrap();
        assert!(matches!(
            stratified_folds(&numeric, 0, 2, 1),
            Err(LearningError::NumericClass(_))
        ));
    }

    /// Weka 3.6.14's `randomize(new Random(1))`, `stratify(5)`, `trainCV`/`testCV` on 23 rows
    /// (row i has class c0 when i % 5 == 0, else c((i*i+1) % 3)), printed by a Java program.
    #[test]
    fn matches_weka_row_for_row() {
        let labels: Vec<String> = (0..23u32)
            .map(|i| format!("c{}", if i % 5 == 0 { 0 } else { (i * i + 1) % 3 }))
            .collect();
        let data = Dataset::from_rows(
            &["class"],
            &[false],
            labels.iter().map(|l| [l.as_str()].into_iter()),
        )
        .unwrap();
        let folds = stratified_folds(&data, 0, 5, 1).unwrap();
        let weka: [(&[u32], &[u32]); 5] = [
            (
                &[22, 8, 13, 20, 18],
                &[
                    12, 1, 3, 11, 2, 15, 10, 16, 4, 0, 17, 21, 5, 19, 14, 9, 7, 6,
                ],
            ),
            (
                &[2, 17, 1, 5, 6],
                &[
                    13, 18, 14, 0, 21, 11, 20, 12, 8, 10, 19, 22, 9, 7, 4, 15, 16, 3,
                ],
            ),
            (
                &[7, 19, 15, 3, 21],
                &[
                    22, 18, 17, 9, 6, 2, 16, 8, 4, 12, 1, 0, 10, 5, 14, 20, 11, 13,
                ],
            ),
            (
                &[11, 16, 10, 12],
                &[
                    19, 6, 4, 13, 0, 2, 15, 1, 3, 21, 7, 5, 9, 20, 8, 17, 18, 22, 14,
                ],
            ),
            (
                &[14, 4, 0, 9],
                &[
                    10, 1, 12, 3, 6, 11, 17, 20, 8, 18, 15, 5, 22, 19, 16, 7, 2, 13, 21,
                ],
            ),
        ];
        for (i, (test, train)) in weka.iter().enumerate() {
            assert_eq!(folds.fold(i), (*train, *test), "fold {i}");
        }
    }
}
