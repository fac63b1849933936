//! One attribute's distribution in the input against a release (ARX's summary view): the values
//! and their counts in the table the analyst loaded and in the released table, the most frequent
//! first, for the page's side-by-side comparison of two releases.
//!
//! Invariants: counts are exact; each side lists at most [`TOP`] values, the rest summed in
//! `other`; the input side is read from the kept table's CSV (what the analyst loaded), the release
//! side from the released columns (bucketization's sensitive values from its sensitive table).
use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::error::ApiError;
use super::releases::computed;
use super::tables::StoredTable;
use super::{Caller, Workbench, json_response};
use crate::relational::release::Release;

/// Values listed per side.
pub const TOP: usize = 30;

/// The most frequent `TOP` of `counts` (ties by value), and the sum of the others.
fn top(counts: HashMap<String, u64>) -> (Vec<(String, u64)>, u64) {
    let mut all: Vec<(String, u64)> = counts.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other = all.iter().skip(TOP).map(|(_, n)| n).sum();
    all.truncate(TOP);
    (all, other)
}

/// Every value of `column` in the kept table's CSV, counted.
fn input_counts(table: &StoredTable, column: &str) -> Result<HashMap<String, u64>, ApiError> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    table.each_value(column, |value| match counts.get_mut(value) {
        Some(n) => *n += 1,
        None => {
            counts.insert(value.to_string(), 1);
        }
    })?;
    Ok(counts)
}

/// `column`'s values in the release, counted; `None` when the release does not publish it.
fn release_counts(release: &Release, column: &str) -> Option<HashMap<String, u64>> {
    if let Release::Bucketized {
        sensitive_table, ..
    } = release
        && sensitive_table.sensitive_name == column
    {
        let mut counts: HashMap<String, u64> = HashMap::new();
        for e in &sensitive_table.entries {
            *counts.entry(e.value.clone()).or_default() += e.count;
        }
        return Some(counts);
    }
    let c = release
        .quasi_table()
        .columns
        .iter()
        .find(|c| c.name == column)?;
    let mut by_code = vec![0u64; c.dictionary.len()];
    for &code in &c.codes {
        by_code[code as usize] += 1;
    }
    Some(
        c.dictionary
            .iter()
            .cloned()
            .zip(by_code)
            .filter(|(_, n)| *n > 0)
            .collect(),
    )
}

fn side(values: &[(String, u64)], other: u64) -> serde_json::Value {
    serde_json::json!({
        "values": values.iter().map(|(v, n)| serde_json::json!({"value": v, "count": n})).collect::<Vec<_>>(),
        "other": other,
    })
}

/// `GET /api/v1/sweeps/{id}/releases/{n}/distribution/{column}`.
pub async fn distribution(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path((id, n, column)): Path<(String, String, String)>,
) -> Response {
    let result = async {
        let (sweep, _, done) = computed(&workbench, &principal.name, &id, &n).await?;
        let source = Arc::clone(&sweep.source);
        let name = column.clone();
        let input = tokio::task::spawn_blocking(move || input_counts(&source, &name))
            .await
            .map_err(ApiError::internal)??;
        let (input, input_other) = top(input);
        let release = match release_counts(&done.release, &column) {
            Some(counts) => {
                let (values, other) = top(counts);
                side(&values, other)
            }
            None => serde_json::Value::Null,
        };
        Ok::<_, ApiError>(serde_json::json!({
            "column": column,
            "input": side(&input, input_other),
            "release": release,
        }))
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}
