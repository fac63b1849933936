//! δ-presence (Nergiz, Atzori & Clifton 2007) against a population table: for each released
//! class, δ = |the class in the sample| / |the population records it stands for|, the probability
//! that a population record matching the class is in the sample. A release is (δ_min, δ_max)-present
//! when every class's δ lies in [δ_min, δ_max].
//!
//! Invariants: pure; the pairs come from [`crate::risk::matching::match_population`], which refuses
//! a population not containing the sample, so every δ is in (0, 1]; population records matching no
//! released class (δ = 0 for them: they cannot be in the release) are counted apart, not in δ_min.
use serde::Serialize;

/// The bounds a release is checked against (either may be absent).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PresenceBounds {
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// δ-presence of the released classes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Presence {
    pub delta_min: f64,
    pub delta_max: f64,
    /// Records-weighted mean δ over the released records.
    pub delta_average: f64,
    /// The bounds checked, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_max: Option<f64>,
    /// Whether every class's δ lies within the given bounds (absent without bounds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within_bounds: Option<bool>,
    /// Classes whose δ lies outside the given bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes_outside: Option<u64>,
    /// Population records matching no released class (δ = 0: not in the sample).
    pub population_unmatched: u64,
}

/// δ-presence from the per-class (sample, population) sizes; `None` without classes.
pub fn presence(pairs: &[(u64, u64)], unmatched: u64, bounds: PresenceBounds) -> Option<Presence> {
    if pairs.is_empty() {
        return None;
    }
    let delta = |&(s, p): &(u64, u64)| s as f64 / p as f64;
    let deltas: Vec<f64> = pairs.iter().map(delta).collect();
    let n: u64 = pairs.iter().map(|p| p.0).sum();
    let outside = (bounds.min.is_some() || bounds.max.is_some()).then(|| {
        deltas
            .iter()
            .filter(|&&d| bounds.min.is_some_and(|m| d < m) || bounds.max.is_some_and(|m| d > m))
            .count() as u64
    });
    Some(Presence {
        delta_min: deltas.iter().copied().fold(f64::INFINITY, f64::min),
        delta_max: deltas.iter().copied().fold(0.0, f64::max),
        delta_average: pairs
            .iter()
            .zip(&deltas)
            .map(|(p, d)| p.0 as f64 * d)
            .sum::<f64>()
            / n as f64,
        bound_min: bounds.min,
        bound_max: bounds.max,
        within_bounds: outside.map(|o| o == 0),
        classes_outside: outside,
        population_unmatched: unmatched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_by_hand() {
        // Classes of 1 in 4, 2 in 2 and 1 in 10 population records: δ = 0.25, 1, 0.1.
        let pairs = [(1, 4), (2, 2), (1, 10)];
        let p = presence(&pairs, 3, PresenceBounds::default()).unwrap();
        assert_eq!((p.delta_min, p.delta_max), (0.1, 1.0));
        assert!((p.delta_average - (0.25 + 2.0 + 0.1) / 4.0).abs() < 1e-15);
        assert_eq!(p.within_bounds, None);
        assert_eq!(p.population_unmatched, 3);
        let bounded = presence(
            &pairs,
            0,
            PresenceBounds {
                min: Some(0.2),
                max: Some(0.5),
            },
        )
        .unwrap();
        assert_eq!(
            (bounded.within_bounds, bounded.classes_outside),
            (Some(false), Some(2))
        );
        let loose = PresenceBounds {
            min: Some(0.1),
            max: Some(1.0),
        };
        assert_eq!(
            presence(&pairs, 0, loose).unwrap().within_bounds,
            Some(true)
        );
        assert!(presence(&[], 0, loose).is_none());
    }
}
