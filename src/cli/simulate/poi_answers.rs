//! `cloakd simulate --pois FILE`: every simulated client asks a POI query (`--poi-query`), the
//! simulated provider answers with the reference provider's candidate list
//! ([`crate::provider::PoiProvider`]), and each client refines it with its true point
//! ([`crate::poi::refine`]); the refined answer is checked against the exact answer of that point
//! over the whole POI file ([`crate::poi::PoiIndex::answer_at`]). Reported: answers, exact answers,
//! refused queries and candidate-list sizes.
use std::path::Path;
use std::sync::Arc;

use prost::Message;

use crate::poi::{Limits, PoiIndex, Query};
use crate::proto::poi::{Nearest, PoiCandidates, PoiQuery, Range, poi_query};
use crate::provider::{PoiProvider, load_pois};

pub struct PoiCheck {
    pub provider: Arc<PoiProvider>,
    query: Query,
    category: String,
    payload: Vec<u8>,
}

/// What the clients got.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PoiReport {
    pub query: String,
    /// Replies decoded as candidate lists.
    pub answers: u64,
    /// Replies whose refinement equals the exact answer of the client's point.
    pub exact: u64,
    /// Replies carrying `PoiCandidates.error` (e.g. a list too long for one answer).
    pub refused: u64,
    pub candidates_p50: usize,
    pub candidates_p95: usize,
    #[serde(skip)]
    sizes: Vec<usize>,
}

/// `nearest:CATEGORY:N` or `range:CATEGORY:METRES`.
fn parse_query(spec: &str) -> anyhow::Result<(String, Query)> {
    let parts: Vec<&str> = spec.split(':').collect();
    let bad = || {
        anyhow::anyhow!("--poi-query: {spec:?} is not nearest:CATEGORY:N or range:CATEGORY:METRES")
    };
    let [kind, category, value] = parts[..] else {
        return Err(bad());
    };
    let query = match kind {
        "nearest" => Query::Nearest {
            count: value.parse().map_err(|_| bad())?,
        },
        "range" => Query::Range {
            radius_m: value.parse().map_err(|_| bad())?,
        },
        _ => return Err(bad()),
    };
    query
        .validate(&Limits::default())
        .map_err(|e| anyhow::anyhow!("--poi-query: {e}"))?;
    Ok((category.to_string(), query))
}

impl PoiCheck {
    pub fn new(pois: &Path, spec: &str) -> anyhow::Result<PoiCheck> {
        let (category, query) = parse_query(spec)?;
        let index = PoiIndex::new(load_pois(pois)?);
        let payload = PoiQuery {
            category: category.clone(),
            query: Some(match query {
                Query::Nearest { count } => poi_query::Query::Nearest(Nearest { count }),
                Query::Range { radius_m } => poi_query::Query::Range(Range { radius_m }),
            }),
        }
        .encode_to_vec();
        Ok(PoiCheck {
            provider: Arc::new(PoiProvider {
                index,
                limits: Limits::default(),
                max_payload_bytes: 16_384,
            }),
            query,
            category,
            payload,
        })
    }

    pub fn payload(&self) -> Vec<u8> {
        self.payload.clone()
    }

    /// Checks one reply of the client at (lat, lon).
    pub fn check(&self, reply: &[u8], lat: f64, lon: f64, report: &mut PoiReport) {
        let Ok(list) = PoiCandidates::decode(reply) else {
            return;
        };
        report.answers += 1;
        if !list.error.is_empty() {
            report.refused += 1;
            return;
        }
        report.sizes.push(list.pois.len());
        let refined = crate::poi::refine::refine_indexes(
            list.pois.iter().map(|p| (p.lat, p.lon, p.id.as_str())),
            lat,
            lon,
            &self.query,
        );
        let index = &self.provider.index;
        let exact = index.answer_at(&self.category, &self.query, lat, lon);
        if refined.len() == exact.len()
            && refined
                .iter()
                .zip(&exact)
                .all(|(&r, &e)| list.pois[r].id == index.poi(e).id)
        {
            report.exact += 1;
        }
    }

    pub fn finish(&self, mut report: PoiReport) -> PoiReport {
        report.query = format!("{:?} {}", self.query, self.category);
        report.sizes.sort_unstable();
        let at = |q: f64| {
            let v = &report.sizes;
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0)
        };
        (report.candidates_p50, report.candidates_p95) = (at(0.5), at(0.95));
        report
    }
}
