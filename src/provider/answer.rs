//! The answer to one cloaked request, the provider's whole per-request work: decode the payload as
//! a `cloakd.v1.poi.PoiQuery`, check it against the limits, compute the box's candidate list
//! ([`crate::poi`]), or for a GEO_IND request (`reported` set) the list of its area of retrieval, the
//! circle of `retrieval_radius_m` around the reported point, and encode it as a `PoiCandidates`.
//! Shared by the provider process (on its worker pool), `cloakd simulate` and the tests.
//!
//! Invariants: every payload, whatever its bytes, gets exactly one `PoiCandidates`: a list, or no
//! POIs and `error` naming the field and the rule (quoting input only through [`crate::text::quote`]);
//! the encoded answer never exceeds `max_payload_bytes` (an error text is cut to fit), so the broker
//! never refuses it. Nothing here panics on input. The overloaded answer ([`overloaded`]) is the one
//! answer with `overloaded = true`.
use anyhow::Context;
use prost::Message;

use crate::poi::pois_csv::{TableLimits, read_pois};
use crate::poi::{Limits, PoiIndex, Query, QueryError, query_box, query_disc};
use crate::proto::CloakedRequest;
use crate::proto::poi::{Poi, PoiCandidates, PoiQuery, poi_query};
use crate::text::quote;

/// Most categories an unknown-category error lists (the most frequent first), and most bytes of
/// their names, so the error stays short whatever the POI file holds.
const KNOWN_SHOWN: usize = 32;
const KNOWN_BYTES: usize = 1_024;

/// The provider's state: the indexed POIs and its limits.
pub struct PoiProvider {
    pub index: PoiIndex,
    pub limits: Limits,
    pub max_payload_bytes: usize,
}

impl PoiProvider {
    /// The answer to one cloaked request: candidates, or an error naming the field and the rule.
    pub fn respond(&self, request: &CloakedRequest) -> PoiCandidates {
        match self.candidates(request) {
            Ok(c) => c,
            Err(e) => refusal(e.to_string(), false, self.max_payload_bytes),
        }
    }

    /// [`PoiProvider::respond`], encoded as the LbsAnswer payload.
    pub fn answer(&self, request: &CloakedRequest) -> Vec<u8> {
        self.respond(request).encode_to_vec()
    }

    fn candidates(&self, request: &CloakedRequest) -> Result<PoiCandidates, QueryError> {
        let refuse = |field, rule: &str| QueryError {
            field,
            rule: rule.to_string(),
        };
        let query = PoiQuery::decode(request.payload.as_slice())
            .map_err(|_| refuse("payload", "must be a cloakd.v1.poi.PoiQuery"))?;
        if query.category.is_empty() {
            return Err(refuse("category", "must not be empty"));
        }
        let q = match query.query {
            Some(poi_query::Query::Nearest(n)) => Query::Nearest { count: n.count },
            Some(poi_query::Query::Range(r)) => Query::Range {
                radius_m: r.radius_m,
            },
            None => return Err(refuse("query", "must be nearest or range")),
        };
        q.validate(&self.limits)?;
        // A GEO_IND request: the lists of its area of retrieval, the circle around the reported
        // point, tighter than its bounding box's.
        let list = match request.reported {
            Some(p) => {
                let disc = query_disc(p.lat, p.lon, request.retrieval_radius_m, &self.limits)?;
                if !self.index.has_category(&query.category) {
                    return Err(self.unknown_category(&query.category));
                }
                self.index
                    .disc_candidates(&query.category, &q, &disc, &self.limits)?
            }
            None => {
                let b = request.r#box.ok_or_else(|| refuse("box", "missing"))?;
                let b = query_box(b.min_lat, b.min_lon, b.max_lat, b.max_lon, &self.limits)?;
                if !self.index.has_category(&query.category) {
                    return Err(self.unknown_category(&query.category));
                }
                self.index
                    .candidates(&query.category, &q, &b, &self.limits)?
            }
        };
        let reply = PoiCandidates {
            pois: list
                .pois
                .iter()
                .map(|&i| to_proto(self.index.poi(i)))
                .collect(),
            error: String::new(),
            overloaded: false,
        };
        let bytes = reply.encoded_len();
        if bytes > self.max_payload_bytes {
            return Err(QueryError {
                field: "query",
                rule: format!(
                    "the candidate list ({} POIs, {bytes} bytes) exceeds the {} bytes an answer may hold; ask for fewer or nearer POIs, or with a smaller tolerance",
                    reply.pois.len(),
                    self.max_payload_bytes
                ),
            });
        }
        Ok(reply)
    }

    /// `category: unknown category "X"; this provider knows "a", "b" and N more`, the known ones
    /// most frequent first, at most [`KNOWN_SHOWN`] of them and [`KNOWN_BYTES`] of names.
    fn unknown_category(&self, category: &str) -> QueryError {
        let known = self.index.categories();
        let mut list = String::new();
        let mut shown = 0;
        for (name, _) in &known {
            let name = quote(name);
            if shown > 0 && (shown == KNOWN_SHOWN || list.len() + name.len() > KNOWN_BYTES) {
                break;
            }
            if shown > 0 {
                list.push_str(", ");
            }
            list.push_str(&name);
            shown += 1;
        }
        if shown < known.len() {
            list.push_str(&format!(" and {} more", known.len() - shown));
        }
        QueryError {
            field: "category",
            rule: format!(
                "unknown category {}; this provider knows {list}",
                quote(category)
            ),
        }
    }
}

/// A `PoiCandidates` with no POIs and `error` (cut at a character boundary so the encoded answer
/// fits `max_payload_bytes`).
fn refusal(mut error: String, overloaded: bool, max_payload_bytes: usize) -> PoiCandidates {
    // Tag and length of the error field, and the overloaded flag: at most 2 + 10 + 2 bytes.
    let room = max_payload_bytes.saturating_sub(14);
    if error.len() > room {
        let mut end = room;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        error.truncate(end);
    }
    PoiCandidates {
        pois: Vec::new(),
        error,
        overloaded,
    }
}

/// The answer to a request the provider did not try because its queue was full: no POIs,
/// `overloaded = true`, and `error` = `provider: overloaded: N queries are waiting for M worker
/// threads; ask again later`.
pub fn overloaded(queued: usize, threads: usize, max_payload_bytes: usize) -> Vec<u8> {
    refusal(
        format!(
            "provider: overloaded: {queued} queries are waiting for {threads} worker threads; ask again later"
        ),
        true,
        max_payload_bytes,
    )
    .encode_to_vec()
}

pub fn to_proto(p: &crate::poi::Poi) -> Poi {
    Poi {
        id: p.id.clone(),
        lat: p.lat,
        lon: p.lon,
        category: p.category.clone(),
        name: p.name.clone(),
    }
}

/// Reads a POI file (plain or gzip; records bounded by `lines::BoundedLines`). An error names the
/// file, the line and the field (a repeated id names both lines).
pub fn load_pois(path: &std::path::Path) -> anyhow::Result<Vec<crate::poi::Poi>> {
    let file = crate::data_files::open_maybe_gz(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let bounded = crate::lines::BoundedLines::new(file, crate::lines::Records::Csv);
    read_pois(bounded, &TableLimits::default()).with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::BoundingBox;
    use crate::proto::poi::{Nearest, Range};
    use proptest::prelude::*;

    fn provider(max_payload_bytes: usize) -> PoiProvider {
        let pois = (0..400)
            .map(|i| crate::poi::Poi {
                id: format!("p{i:03}"),
                lat: 53.0 + f64::from(i % 20) * 0.01,
                lon: 8.0 + f64::from(i / 20) * 0.01,
                category: ["cafe", "bank", "fuel", "bank"][i as usize % 4].to_string(),
                name: String::new(),
            })
            .collect();
        PoiProvider {
            index: PoiIndex::new(pois),
            limits: Limits::default(),
            max_payload_bytes,
        }
    }

    fn request(payload: Vec<u8>, r#box: Option<BoundingBox>) -> CloakedRequest {
        CloakedRequest {
            payload,
            r#box,
            ..Default::default()
        }
    }

    fn near_box() -> Option<BoundingBox> {
        Some(BoundingBox {
            min_lat: 53.05,
            min_lon: 8.05,
            max_lat: 53.06,
            max_lon: 8.07,
        })
    }

    fn query(category: &str, q: poi_query::Query) -> Vec<u8> {
        PoiQuery {
            category: category.to_string(),
            query: Some(q),
        }
        .encode_to_vec()
    }

    #[test]
    fn an_unknown_category_names_it_and_the_known_ones() {
        let p = provider(16_384);
        let reply = p.respond(&request(
            query("caffe", poi_query::Query::Nearest(Nearest { count: 1 })),
            near_box(),
        ));
        assert!(reply.pois.is_empty());
        assert_eq!(
            reply.error,
            "category: unknown category \"caffe\"; this provider knows \"bank\", \"cafe\", \"fuel\""
        );
        let known = p.respond(&request(
            query("cafe", poi_query::Query::Nearest(Nearest { count: 1 })),
            near_box(),
        ));
        assert_eq!(known.error, "");
        assert!(!known.pois.is_empty());
    }

    #[test]
    fn a_geo_ind_request_is_answered_for_its_circle_not_its_box() {
        let p = provider(16_384);
        // A circle of 1.2 km around a reported point, and its bounding box.
        let (lat, lon, radius_m) = (53.1, 8.1, 1_200.0);
        let disc = query_disc(lat, lon, radius_m, &Limits::default()).unwrap();
        let (min_lat, min_lon, max_lat, max_lon) = disc.bounding_box();
        let bounding = Some(BoundingBox {
            min_lat,
            min_lon,
            max_lat,
            max_lon,
        });
        let ask = |q: poi_query::Query| {
            let boxed = p.respond(&request(query("bank", q), bounding));
            let circled = p.respond(&CloakedRequest {
                reported: Some(crate::proto::GeoPoint { lat, lon }),
                retrieval_radius_m: radius_m,
                ..request(query("bank", q), bounding)
            });
            assert_eq!((boxed.error.as_str(), circled.error.as_str()), ("", ""));
            let ids = |c: &PoiCandidates| c.pois.iter().map(|p| p.id.clone()).collect::<Vec<_>>();
            (ids(&boxed), ids(&circled))
        };
        for q in [
            poi_query::Query::Nearest(Nearest { count: 3 }),
            poi_query::Query::Range(Range { radius_m: 300.0 }),
        ] {
            let (boxed, circled) = ask(q);
            assert!(!circled.is_empty());
            assert!(circled.iter().all(|id| boxed.contains(id)), "{q:?}");
            assert!(circled.len() <= boxed.len(), "{q:?}: {circled:?} {boxed:?}");
        }
        // Range 300 m: banks within 1.5 km of the centre (2 rows x 3 columns of the grid) against
        // those within 300 m of the bounding box (2 x 5).
        let (boxed, circled) = ask(poi_query::Query::Range(Range { radius_m: 300.0 }));
        assert_eq!((circled.len(), boxed.len()), (6, 10));
        // A radius out of bounds is refused naming its field.
        let bad = p.respond(&CloakedRequest {
            reported: Some(crate::proto::GeoPoint { lat, lon }),
            retrieval_radius_m: f64::NAN,
            ..request(
                query("bank", poi_query::Query::Nearest(Nearest { count: 1 })),
                bounding,
            )
        });
        assert!(
            bad.error.starts_with("retrieval_radius_m: "),
            "{}",
            bad.error
        );
    }

    #[test]
    fn the_known_categories_are_capped() {
        let pois = (0..100)
            .map(|i| crate::poi::Poi {
                id: format!("p{i}"),
                lat: 53.0,
                lon: 8.0 + f64::from(i) * 0.001,
                category: format!("{}-{i:03}", "c".repeat(60)),
                name: String::new(),
            })
            .collect();
        let p = PoiProvider {
            index: PoiIndex::new(pois),
            limits: Limits::default(),
            max_payload_bytes: 16_384,
        };
        let e = p.unknown_category("x").to_string();
        assert!(e.len() < KNOWN_BYTES + 200, "{}", e.len());
        assert!(e.ends_with(&format!(" and {} more", 100 - 15)), "{e}");
    }

    #[test]
    fn the_overloaded_answer_is_flagged_and_fits() {
        let reply = PoiCandidates::decode(overloaded(64, 2, 16_384).as_slice()).unwrap();
        assert!(reply.overloaded && reply.pois.is_empty());
        assert_eq!(
            reply.error,
            "provider: overloaded: 64 queries are waiting for 2 worker threads; ask again later"
        );
        assert!(overloaded(64, 2, 40).len() <= 40);
    }

    /// A payload: a valid query, a mutation of one (bytes flipped, cut, extended), or random bytes.
    fn payloads() -> impl Strategy<Value = Vec<u8>> {
        let category = prop_oneof![
            Just("cafe".to_string()),
            Just("bank".to_string()),
            Just(String::new()),
            "\\PC{0,80}",
        ];
        let q = prop_oneof![
            (0u32..80).prop_map(|count| poi_query::Query::Nearest(Nearest { count })),
            prop_oneof![
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(-1.0),
                0.0f64..60_000.0
            ]
            .prop_map(|radius_m| poi_query::Query::Range(Range { radius_m })),
        ];
        let valid = (category, proptest::option::of(q))
            .prop_map(|(category, query)| PoiQuery { category, query }.encode_to_vec());
        let mutated = (
            valid.clone(),
            proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            any::<prop::sample::Index>(),
            proptest::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(mut bytes, flips, cut, tail)| {
                for (at, byte) in flips {
                    if !bytes.is_empty() {
                        let i = at.index(bytes.len());
                        bytes[i] = byte;
                    }
                }
                let keep = cut.index(bytes.len() + 1);
                bytes.truncate(keep);
                bytes.extend(tail);
                bytes
            });
        prop_oneof![
            valid,
            mutated,
            proptest::collection::vec(any::<u8>(), 0..64)
        ]
    }

    fn boxes() -> impl Strategy<Value = Option<BoundingBox>> {
        let coordinate = prop_oneof![
            -200.0f64..200.0,
            52.9f64..53.3,
            7.9f64..8.3,
            Just(f64::NAN),
            Just(f64::NEG_INFINITY),
        ];
        proptest::option::of(
            (
                coordinate.clone(),
                coordinate.clone(),
                coordinate.clone(),
                coordinate,
            )
                .prop_map(|(min_lat, min_lon, max_lat, max_lon)| BoundingBox {
                    min_lat,
                    min_lon,
                    max_lat,
                    max_lon,
                }),
        )
    }

    /// The fields an error may name.
    const FIELDS: [&str; 11] = [
        "payload",
        "category",
        "query",
        "nearest.count",
        "range.radius_m",
        "box",
        "box.min_lat",
        "box.max_lat",
        "box.min_lon",
        "box.max_lon",
        "provider",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Whatever the payload and the box, the answer is one decodable `PoiCandidates` within the
        /// payload limit: a list of POIs of the asked category, or no POIs and an error naming a
        /// field and a rule.
        #[test]
        fn every_payload_gets_an_answer_or_a_named_error(
            payload in payloads(),
            b in boxes(),
            max_payload_bytes in prop_oneof![Just(16_384usize), 64usize..2_048],
        ) {
            let p = provider(max_payload_bytes);
            let asked = PoiQuery::decode(payload.as_slice()).ok();
            let bytes = p.answer(&request(payload, b));
            prop_assert!(bytes.len() <= max_payload_bytes);
            let reply = PoiCandidates::decode(bytes.as_slice()).unwrap();
            prop_assert!(!reply.overloaded);
            if reply.error.is_empty() {
                let asked = asked.unwrap();
                prop_assert!(reply.pois.iter().all(|poi| poi.category == asked.category));
            } else {
                prop_assert!(reply.pois.is_empty());
                let (field, rule) = reply.error.split_once(": ").unwrap();
                prop_assert!(FIELDS.contains(&field), "{}", reply.error);
                prop_assert!(!rule.is_empty());
            }
        }
    }
}
