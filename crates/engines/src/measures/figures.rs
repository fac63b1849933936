//! Brickell & Shmatikov's Figures 1-4 (KDD'08, §6.3): for each sanitization of a dataset, the
//! adversary's gain A_acc beside the researcher's gain U_san − U_base per classifier.
//!
//! - The datasets are the paper's: "Marital" (Q = age, occupation, education; S = marital-status)
//!   and "Occupation" (Q = age, sex, race; S = occupation), the other attributes of its Table 1
//!   released as they are.
//! - Figures 1 and 2 learn S itself (J48), Figures 3 and 4 a neutral attribute (salary, resp.
//!   marital-status) with J48, Random Forest and Naive Bayes.
//! - The sanitizations are the paper's Table 3 parameters: k = 10, 100, 1000; recursive (3, l)-diversity
//!   with l = 2, 5, 10, 15; t-closeness (EMD, equal ground distance for a nominal S) with t = 0.4, 0.3,
//!   0.2; delta-disclosure with delta = 1.2, 1.0, 0.8. Each is applied alone.
//!
//! The privacy side is computed here from the release's classes with the functions `table evaluate`
//! uses ([`ReleaseView`], [`privacy_loss`]), so the bars' A_acc equal its report for the same release.
//! The researcher's side ([`Researcher`]: U_base and U_san per release and classifier) is measured
//! by the caller with [`crate::measures::workload`] and passed in; without it the figure has the
//! adversary's bars only.
//!
//! Invariants: pure (no files, no clock); a sanitization the table cannot satisfy is left out with
//! its reason, never drawn; bars of a figure keep the sanitizations' order.
use std::sync::atomic::AtomicBool;

use crate::measures::privacy::{PrivacyLoss, privacy_loss};
use crate::measures::view::{ReleaseView, ViewError};
use crate::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
use crate::relational::release::{Release, ReleaseMethod};
use crate::relational::table::Table;
use crate::relational::{AlgorithmOptions, anonymize_with};

/// One of the paper's two datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataset {
    Marital,
    Occupation,
}

impl Dataset {
    /// The name in the paper (and the legends).
    pub fn name(self) -> &'static str {
        match self {
            Dataset::Marital => "Marital",
            Dataset::Occupation => "Occupation",
        }
    }

    /// The quasi-identifier.
    pub fn quasi(self) -> [&'static str; 3] {
        match self {
            Dataset::Marital => ["age", "occupation", "education"],
            Dataset::Occupation => ["age", "sex", "race"],
        }
    }

    /// The sensitive attribute.
    pub fn sensitive(self) -> &'static str {
        match self {
            Dataset::Marital => "marital-status",
            Dataset::Occupation => "occupation",
        }
    }

    /// The neutral workload attribute of Figures 3 and 4.
    pub fn neutral_workload(self) -> &'static str {
        match self {
            Dataset::Marital => "income",
            Dataset::Occupation => "marital-status",
        }
    }
}

/// What a figure shows.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureSpec {
    /// 1 to 4, as in the paper.
    pub number: u8,
    pub dataset: Dataset,
    /// The attribute the researcher learns.
    pub workload: String,
    /// The classifiers of the researcher's bars (`j48`, `rf`, `nb`).
    pub classifiers: Vec<String>,
}

impl FigureSpec {
    /// The paper's figure `number` (1 to 4), learning `workload` (for Figures 3 and 4; Figures 1 and
    /// 2 learn the sensitive attribute).
    pub fn paper(number: u8, neutral_workload: Option<&str>) -> Option<FigureSpec> {
        let (dataset, sensitive) = match number {
            1 => (Dataset::Marital, true),
            2 => (Dataset::Occupation, true),
            3 => (Dataset::Marital, false),
            4 => (Dataset::Occupation, false),
            _ => return None,
        };
        let (workload, classifiers) = if sensitive {
            (dataset.sensitive().to_string(), vec!["j48"])
        } else {
            (
                neutral_workload
                    .unwrap_or(dataset.neutral_workload())
                    .to_string(),
                vec!["j48", "rf", "nb"],
            )
        };
        Some(FigureSpec {
            number,
            dataset,
            workload,
            classifiers: classifiers.into_iter().map(String::from).collect(),
        })
    }

    /// The file name without its extension (`fig1-marital-marital-status`).
    pub fn stem(&self) -> String {
        format!(
            "fig{}-{}-{}",
            self.number,
            self.dataset.name().to_lowercase(),
            self.workload
        )
    }
}

/// A sanitization: a label for the figures and the privacy requirement.
#[derive(Debug, Clone, PartialEq)]
pub struct Sanitization {
    /// `k=10`, `l=5`, `t=0.2`, `δ=1.2`.
    pub label: String,
    /// The model (`k`, `l`, `t`, `delta`) and its parameter, for `figures.csv`.
    pub model: &'static str,
    pub parameter: f64,
    pub spec: PrivacySpec,
}

/// The recursive (c, l)-diversity constant of every l of the paper.
pub const RECURSIVE_C: f64 = 3.0;

impl Sanitization {
    pub fn k(k: u64) -> Sanitization {
        Sanitization {
            label: format!("k={k}"),
            model: "k",
            parameter: k as f64,
            spec: PrivacySpec {
                k: Some(k),
                ..PrivacySpec::default()
            },
        }
    }

    /// Recursive (3, l)-diversity.
    pub fn l(l: usize) -> Sanitization {
        Sanitization {
            label: format!("l={l}"),
            model: "l",
            parameter: l as f64,
            spec: PrivacySpec {
                l: Some(LDiversity::Recursive { l, c: RECURSIVE_C }),
                ..PrivacySpec::default()
            },
        }
    }

    /// t-closeness under the EMD (equal ground distance for a nominal sensitive attribute).
    pub fn t(t: f64) -> Sanitization {
        Sanitization {
            label: format!("t={t}"),
            model: "t",
            parameter: t,
            spec: PrivacySpec {
                t: Some(TCloseness {
                    t,
                    distance: Distance::Emd,
                }),
                ..PrivacySpec::default()
            },
        }
    }

    /// delta-disclosure (the paper's figures write s for delta).
    pub fn delta(delta: f64) -> Sanitization {
        Sanitization {
            label: format!("δ={delta}"),
            model: "delta",
            parameter: delta,
            spec: PrivacySpec {
                delta: Some(delta),
                ..PrivacySpec::default()
            },
        }
    }
}

/// The paper's parameters (its Table 3).
pub const PAPER_K: [u64; 3] = [10, 100, 1000];
pub const PAPER_L: [usize; 4] = [2, 5, 10, 15];
pub const PAPER_T: [f64; 3] = [0.4, 0.3, 0.2];
pub const PAPER_DELTA: [f64; 3] = [1.2, 1.0, 0.8];

/// The sanitizations of the given parameters, models in the order k, l, t, delta.
pub fn sanitizations(k: &[u64], l: &[usize], t: &[f64], delta: &[f64]) -> Vec<Sanitization> {
    k.iter()
        .map(|&k| Sanitization::k(k))
        .chain(l.iter().map(|&l| Sanitization::l(l)))
        .chain(t.iter().map(|&t| Sanitization::t(t)))
        .chain(delta.iter().map(|&d| Sanitization::delta(d)))
        .collect()
}

/// The privacy side of one sanitized release.
#[derive(Debug, Clone)]
pub struct Measured {
    pub sanitization: Sanitization,
    pub privacy: PrivacyLoss,
    pub classes: u64,
    /// The release (for the utility side).
    pub release: Release,
}

/// Why a release could not be measured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FigureError {
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("{0}")]
    Utility(String),
}

/// Ploss, A_know and A_acc of a release and its number of classes, as `table evaluate` measures
/// them.
pub fn release_privacy(table: &Table, release: &Release) -> Result<(PrivacyLoss, u64), ViewError> {
    let view = ReleaseView::new(table, release)?;
    Ok((
        privacy_loss(&view.class_histograms, view.domain),
        view.classes() as u64,
    ))
}

/// Anonymizes the table under each sanitization (generalization, the algorithm and seed given) and
/// measures the privacy side. A sanitization the table cannot satisfy is returned as `Err` with
/// the reason, in place.
pub fn measure(
    table: &Table,
    sanitizations: &[Sanitization],
    seed: u64,
    options: &AlgorithmOptions,
) -> Vec<Result<Measured, String>> {
    let never = AtomicBool::new(false);
    sanitizations
        .iter()
        .map(|s| {
            let (release, _) = anonymize_with(
                table,
                &s.spec,
                ReleaseMethod::Generalization,
                seed,
                options,
                &never,
            )
            .map_err(|e| e.to_string())?;
            let (privacy, classes) = release_privacy(table, &release).map_err(|e| e.to_string())?;
            Ok(Measured {
                sanitization: s.clone(),
                privacy,
                classes,
                release,
            })
        })
        .collect()
}

/// The researcher's side of a figure, measured by the learning workload
/// ([`crate::measures::workload`]) on the figure's table and releases.
#[derive(Debug, Clone, PartialEq)]
pub struct Researcher {
    /// U_base: the best accuracy over the trivial sanitizations and the classifiers.
    pub u_base: f64,
    /// What gave U_base (`"j48, sensitive removed"`).
    pub u_base_by: String,
    /// U_san of each classifier of the figure (in the spec's order), per measured release (in
    /// order).
    pub u_san: Vec<Vec<f64>>,
}

/// One group of bars: a sanitization.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureBar {
    pub label: String,
    pub a_acc: f64,
    pub a_know: f64,
    /// U_san − U_base per classifier of the figure; `None` without a utility side.
    pub utility_gain: Vec<Option<f64>>,
}

/// One of the paper's figures, measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub spec: FigureSpec,
    /// The adversary's accuracy from the trivial sanitization: max_s p(T, s).
    pub adversary_baseline: f64,
    /// U_base and what gave it, with a utility side.
    pub researcher_baseline: Option<(f64, String)>,
    pub bars: Vec<FigureBar>,
}

/// The adversary's accuracy on the trivially sanitized table: the share of the most frequent
/// sensitive value.
pub fn adversary_baseline(table: &Table) -> f64 {
    let counts = table.sensitive_distribution().counts;
    let total: u64 = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0);
    max as f64 / total.max(1) as f64
}

/// Builds a figure from the measured releases of its dataset's table; the researcher's bars come
/// from `researcher` when given (one row of U_san per measured release, one value per classifier).
pub fn figure(
    spec: &FigureSpec,
    table: &Table,
    measured: &[Measured],
    researcher: Option<&Researcher>,
) -> Result<Figure, FigureError> {
    if let Some(r) = researcher {
        let shape_ok = r.u_san.len() == measured.len()
            && r.u_san
                .iter()
                .all(|row| row.len() == spec.classifiers.len());
        if !shape_ok {
            return Err(FigureError::Utility(format!(
                "the researcher's side has {} releases, the figure {} (rule: one U_san per release and classifier)",
                r.u_san.len(),
                measured.len()
            )));
        }
    }
    let bars = measured
        .iter()
        .enumerate()
        .map(|(i, m)| FigureBar {
            label: m.sanitization.label.clone(),
            a_acc: m.privacy.a_acc,
            a_know: m.privacy.a_know,
            utility_gain: match researcher {
                Some(r) => r.u_san[i].iter().map(|u| Some(u - r.u_base)).collect(),
                None => vec![None; spec.classifiers.len()],
            },
        })
        .collect();
    Ok(Figure {
        spec: spec.clone(),
        adversary_baseline: adversary_baseline(table),
        researcher_baseline: researcher.map(|r| (r.u_base, r.u_base_by.clone())),
        bars,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paper_figures() {
        let specs: Vec<FigureSpec> = (1..=4)
            .map(|n| FigureSpec::paper(n, None).unwrap())
            .collect();
        assert_eq!(specs[0].workload, "marital-status");
        assert_eq!(specs[1].workload, "occupation");
        assert_eq!(specs[2].workload, "income");
        assert_eq!(specs[3].workload, "marital-status");
        assert_eq!(specs[0].classifiers, ["j48"]);
        assert_eq!(specs[3].classifiers, ["j48", "rf", "nb"]);
        assert_eq!(specs[2].stem(), "fig3-marital-income");
        assert!(FigureSpec::paper(5, None).is_none());
        let all = sanitizations(&PAPER_K, &PAPER_L, &PAPER_T, &PAPER_DELTA);
        let labels: Vec<&str> = all.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "k=10", "k=100", "k=1000", "l=2", "l=5", "l=10", "l=15", "t=0.4", "t=0.3", "t=0.2",
                "δ=1.2", "δ=1", "δ=0.8"
            ]
        );
        for s in &all {
            s.spec.validate().unwrap();
        }
    }
}
