//! The page's hierarchy builder, server side: a column's distinct values (what the builder groups)
//! and adding a built (or any) hierarchy file to a kept table.
//!
//! Invariants: a table is never changed in place: adding a hierarchy keeps a new version of the
//! table under the same id (its CSV shared, not copied), so a sweep already running keeps the
//! version it started with. A hierarchy is added only when it parses and, given a column, has a
//! leaf for every value of it; a path never replaces the table's CSV. The values answer is bounded
//! ([`MAX_VALUES`]) before it is built.
use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::error::{ApiError, Code};
use super::tables::StoredTable;
use super::{Caller, Workbench, json_response, parse_json, read_body, table_json};
use crate::relational::hierarchy::Hierarchy;
use crate::text::quote;

/// The most distinct values the builder is given (past it, build the hierarchy with a script and
/// upload it).
pub const MAX_VALUES: usize = 10_000;

/// The most bytes of a hierarchy added through the API.
const MAX_HIERARCHY_BYTES: usize = 4 << 20;

/// The kept table `id` of `owner` (404 naming `table` otherwise).
pub(super) fn table(
    workbench: &Workbench,
    owner: &str,
    id: &str,
) -> Result<Arc<StoredTable>, ApiError> {
    workbench
        .tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(owner, id)
        .ok_or_else(|| ApiError::not_found("table", "table", id))
}

/// The distinct values of `column` with their counts, in first-seen order, at most [`MAX_VALUES`].
pub fn column_values(table: &StoredTable, column: &str) -> Result<Vec<(String, u64)>, ApiError> {
    let distinct = table
        .columns
        .iter()
        .find(|c| c.name == column)
        .map_or(0, |c| c.distinct);
    if distinct > MAX_VALUES {
        return Err(ApiError::invalid(
            "column",
            format!(
                "column {} has {distinct} distinct values (rule: the page builds hierarchies of at most {MAX_VALUES}; upload a hierarchy file instead)",
                quote(column)
            ),
        ));
    }
    let mut index: HashMap<String, usize> = HashMap::with_capacity(distinct);
    let mut values: Vec<(String, u64)> = Vec::with_capacity(distinct);
    table.each_value(column, |value| match index.get(value) {
        Some(&i) => values[i].1 += 1,
        None if values.len() < MAX_VALUES => {
            index.insert(value.to_string(), values.len());
            values.push((value.to_string(), 1));
        }
        None => {}
    })?;
    Ok(values)
}

/// `GET /api/v1/tables/{id}/columns/{name}/values`.
pub async fn values(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path((id, column)): Path<(String, String)>,
) -> Response {
    let result = async {
        let stored = table(&workbench, &principal.name, &id)?;
        let kind = stored
            .columns
            .iter()
            .find(|c| c.name == column)
            .map(|c| c.kind);
        let values = tokio::task::spawn_blocking(move || column_values(&stored, &column))
            .await
            .map_err(ApiError::internal)??;
        Ok::<_, ApiError>(serde_json::json!({
            "kind": kind,
            "values": values.iter().map(|(v, n)| serde_json::json!({"value": v, "count": n})).collect::<Vec<_>>(),
        }))
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AddHierarchy {
    /// The file's path as a job names it (`hierarchies/age.csv`).
    path: String,
    /// The hierarchy, ARX's format (`;` or `,` between levels).
    text: String,
    /// When given, the hierarchy must have a leaf for every value of this column.
    column: Option<String>,
}

/// The table with hierarchy `path` added (or replaced), checked as [`AddHierarchy`] says.
fn with_hierarchy(table: &StoredTable, add: AddHierarchy) -> Result<StoredTable, ApiError> {
    let path = add.path;
    if path.is_empty()
        || path.len() > 255
        || path == table.name
        || path.contains(['\n', '\r', '\0'])
    {
        return Err(ApiError::invalid(
            "path",
            format!(
                "path: {} must be a file name of 1 to 255 bytes, not the table's (rule: a hierarchy's name)",
                quote(&path)
            ),
        ));
    }
    let hierarchy = Hierarchy::parse(&path, &add.text)
        .map_err(|e| ApiError::invalid("text", format!("text: {e}")))?;
    if let Some(column) = &add.column {
        let values = column_values(table, column)?;
        let missing: Vec<&str> = values
            .iter()
            .map(|(v, _)| v.as_str())
            .filter(|v| hierarchy.leaf(v).is_none())
            .collect();
        if let Some(first) = missing.first() {
            return Err(ApiError::invalid(
                "text",
                format!(
                    "text: {} has no leaf for {} values of column {}, {} the first (rule: a hierarchy has a leaf for every value of its column)",
                    quote(&path),
                    missing.len(),
                    quote(column),
                    quote(first)
                ),
            ));
        }
    }
    let mut hierarchies = table.hierarchies.clone();
    hierarchies.insert(path.clone(), add.text);
    let file = path.rsplit('/').next().unwrap_or(&path);
    let stem = file.strip_suffix(".csv").unwrap_or(file);
    let columns = table
        .columns
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if c.name == stem && !c.hierarchies.contains(&path) {
                c.hierarchies.push(path.clone());
            }
            c
        })
        .collect();
    Ok(StoredTable {
        name: table.name.clone(),
        csv: Arc::clone(&table.csv),
        delimiter: table.delimiter,
        hierarchies,
        rows: table.rows,
        columns,
        job: table.job.clone(),
    })
}

/// `POST /api/v1/tables/{id}/hierarchies`: adds a hierarchy file to the table; answers the table
/// as an upload does, under the same id.
pub async fn add(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let result = async {
        let stored = table(&workbench, &principal.name, &id)?;
        let (parts, body) = request.into_parts();
        let bytes = read_body(body, &parts.headers, MAX_HIERARCHY_BYTES).await?;
        let add: AddHierarchy = parse_json(&bytes)?;
        let next = tokio::task::spawn_blocking(move || with_hierarchy(&stored, add))
            .await
            .map_err(ApiError::internal)??;
        let body = table_json(&id, &next);
        let replaced = workbench
            .tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(&principal.name, &id, Arc::new(next));
        if !replaced {
            return Err(ApiError::new(
                Code::NotFound,
                Some("table"),
                format!("table {} was evicted meanwhile", quote(&id)),
            ));
        }
        Ok::<_, ApiError>(body)
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}
