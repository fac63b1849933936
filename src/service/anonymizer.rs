//! gRPC adapter of batch relational anonymization (`cloakd.v1.TableAnonymizer`): receives one job and
//! its rows over a client stream, runs [`crate::relational::anonymize`] on a blocking thread and streams
//! the released rows, the sensitive table (bucketization) and the report back in chunks.
//!
//! Invariants: at most `tables.max_concurrent_jobs` jobs hold a slot at once (more get
//! RESOURCE_EXHAUSTED), from the first message until the last response is sent; a job whose caller
//! goes away or whose deadline (or `tables.max_job_ms`) passes stops its anonymization at the next
//! Mondrian split and frees its slot then, releasing nothing; a job's upload is
//! refused with RESOURCE_EXHAUSTED as soon as it passes `tables.max_rows` rows or `tables.max_bytes`
//! bytes of values, so memory stays bounded; responses go through a bounded channel (backpressure from
//! a slow reader); bad input is INVALID_ARGUMENT naming the field or row and column and the rule, an
//! unsatisfiable model FAILED_PRECONDITION with the reason; nothing is released on any error.
use std::collections::HashMap;
use std::pin::Pin;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::TablesConfig;
use crate::connections::LimitExceeded;
use crate::jobs::JobStopped;
use crate::jobs::{JobFailure, JobRecord, Outcome, TableJobs, anonymize_job};
use crate::proto::anonymize_request::Part as RequestPart;
use crate::proto::anonymize_response::Part as ResponsePart;
use crate::proto::table_anonymizer_server::{TableAnonymizer, TableAnonymizerServer};
use crate::proto::{
    AnonymizeRequest, AnonymizeResponse, ReleasedHeader, Row, RowChunk, SensitiveChunk,
    SensitiveRow, TableJob, TableReport,
};
use crate::relational::hierarchy::{Hierarchy, HierarchyError};
use crate::relational::job::{
    AlgorithmField, AlgorithmOverrides, ColumnSpec, JobError, JobSpec, RoleSpec,
};
use crate::relational::models::{LDiversity, PrivacySpec, RiskBounds, TCloseness, UniquenessBound};
use crate::relational::release::{Release, ReleaseMethod};
use crate::relational::report::Report;
use crate::relational::table::{TableBuilder, TableError, Unlisted};
use crate::relational::{AnonymizeError, check_risk_release};
use crate::service::{InboundError, drain, job_status};

/// Why a table job was refused.
#[derive(Debug, thiserror::Error)]
pub enum TableServiceError {
    #[error("{field}: {rule}")]
    InvalidJob { field: String, rule: String },
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Hierarchy(#[from] HierarchyError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("{limit}: {rule}")]
    Limit { limit: &'static str, rule: String },
    #[error("tables.max_concurrent_jobs: {0}")]
    Busy(#[from] LimitExceeded),
    #[error(
        "tables.upload_idle_ms: no message for {idle_ms} ms while the job uploads; the job was cancelled"
    )]
    UploadIdle { idle_ms: u64 },
    #[error(transparent)]
    Inbound(#[from] InboundError),
    #[error(transparent)]
    Anonymize(#[from] AnonymizeError),
    #[error("tables.max_job_ms: {0}")]
    Stopped(#[from] JobStopped),
    #[error("internal error: {0}")]
    Internal(String),
}

impl TableServiceError {
    /// The error's class ([`JobFailure`]).
    fn failure(&self) -> JobFailure {
        match self {
            TableServiceError::Limit { .. }
            | TableServiceError::Busy(_)
            | TableServiceError::Table(TableError::TooManyRows { .. }) => JobFailure::Exhausted,
            TableServiceError::UploadIdle { .. } => JobFailure::OverBudget,
            TableServiceError::Inbound(inbound) => inbound.failure(),
            TableServiceError::Anonymize(e) => JobFailure::of_anonymize(e),
            TableServiceError::Stopped(e) => JobFailure::of_stopped(e),
            TableServiceError::Internal(_) => JobFailure::Internal,
            TableServiceError::InvalidJob { .. }
            | TableServiceError::Job(_)
            | TableServiceError::Hierarchy(_)
            | TableServiceError::Table(_) => JobFailure::Invalid,
        }
    }
}

impl From<TableServiceError> for Status {
    fn from(e: TableServiceError) -> Status {
        match e {
            TableServiceError::Inbound(inbound) => inbound.status(),
            e => job_status(e.failure(), e.to_string()),
        }
    }
}

fn invalid(field: &str, rule: impl Into<String>) -> TableServiceError {
    TableServiceError::InvalidJob {
        field: field.to_string(),
        rule: rule.into(),
    }
}

/// The TableAnonymizer service.
#[derive(Debug, Clone)]
pub struct TableService {
    limits: TablesConfig,
    jobs: TableJobs,
    max_message_bytes: usize,
}

/// The service, ready to mount in the daemon's tonic server; `jobs` is the daemon's one
/// [`TableJobs`], shared with the evaluator and the workbench.
pub fn table_anonymizer(
    config: &TablesConfig,
    jobs: TableJobs,
    max_message_bytes: usize,
) -> TableAnonymizerServer<TableService> {
    TableAnonymizerServer::new(TableService {
        limits: config.clone(),
        jobs,
        max_message_bytes,
    })
    .max_decoding_message_size(max_message_bytes)
}

/// The next request message, within `tables.upload_idle_ms`.
async fn next_message(
    limits: &TablesConfig,
    max_message_bytes: usize,
    requests: &mut Streaming<AnonymizeRequest>,
) -> Result<Option<AnonymizeRequest>, TableServiceError> {
    match tokio::time::timeout(limits.upload_idle, requests.message()).await {
        Ok(Ok(message)) => Ok(message),
        Ok(Err(status)) => Err(InboundError::classify(&status, max_message_bytes).into()),
        Err(_) => Err(TableServiceError::UploadIdle {
            idle_ms: u64::try_from(limits.upload_idle.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// The job of a request: from TOML text or from the structured fields, refused before its rows
/// arrive when its release method cannot honour its risk bounds.
fn job_spec(job: &TableJob) -> Result<JobSpec, TableServiceError> {
    let spec = parse_job(job)?;
    check_risk_release(&spec.privacy, spec.release).map_err(|rule| invalid("job.release", rule))?;
    Ok(spec)
}

fn parse_job(job: &TableJob) -> Result<JobSpec, TableServiceError> {
    if !job.job_toml.trim().is_empty() {
        let mut spec = JobSpec::parse("job.job_toml", &job.job_toml)?;
        if job.seed != 0 {
            spec.seed = job.seed;
        }
        override_algorithm(&mut spec, job)?;
        return Ok(spec);
    }
    let mut columns = Vec::with_capacity(job.columns.len());
    for (i, c) in job.columns.iter().enumerate() {
        let field = |f: &str| format!("job.columns[{i}].{f}");
        if c.name.is_empty() {
            return Err(invalid(&field("name"), "must not be empty"));
        }
        let numeric = match c.kind.as_str() {
            "" | "categorical" => false,
            "numeric" => true,
            other => {
                return Err(invalid(
                    &field("kind"),
                    format!("unknown kind {other:?} (known: numeric, categorical)"),
                ));
            }
        };
        let role = match c.role.as_str() {
            "quasi" if numeric => RoleSpec::QuasiNumeric,
            "quasi" if c.hierarchy.is_empty() => {
                return Err(invalid(
                    &field("hierarchy"),
                    "a categorical quasi-identifier needs a hierarchy",
                ));
            }
            "quasi" => RoleSpec::QuasiCategorical {
                hierarchy: c.hierarchy.clone(),
            },
            "sensitive" => RoleSpec::Sensitive { numeric },
            "identifier" => RoleSpec::Identifier,
            "insensitive" => RoleSpec::Insensitive,
            other => {
                return Err(invalid(
                    &field("role"),
                    format!(
                        "unknown role {other:?} (known: quasi, sensitive, identifier, insensitive)"
                    ),
                ));
            }
        };
        columns.push(ColumnSpec {
            name: c.name.clone(),
            role,
            span: 0..0,
        });
    }
    let p = job.privacy.clone().unwrap_or_default();
    let privacy = PrivacySpec {
        k: (p.k > 0).then_some(p.k),
        l: if p.l.is_empty() {
            None
        } else {
            Some(
                p.l.parse::<LDiversity>()
                    .map_err(|e| invalid("job.privacy.l", e.to_string()))?,
            )
        },
        t: if p.t.is_empty() {
            None
        } else {
            Some(
                p.t.parse::<TCloseness>()
                    .map_err(|e| invalid("job.privacy.t", e.to_string()))?,
            )
        },
        delta: if p.delta == 0.0 { None } else { Some(p.delta) },
        risk: RiskBounds {
            highest: p.max_risk_highest,
            average: p.max_risk_average,
            population_uniqueness: p
                .population_uniqueness
                .as_ref()
                .map(|u| {
                    Ok::<_, TableServiceError>(UniquenessBound {
                        model: u.model.parse().map_err(|e: String| {
                            invalid("job.privacy.population_uniqueness.model", e)
                        })?,
                        population: u.population,
                        max: u.max,
                    })
                })
                .transpose()?,
        },
    };
    // The ranges' rules are the job files' ([`PrivacySpec::validate`]), named by the proto field.
    privacy
        .validate()
        .map_err(|e| invalid(&format!("job.privacy.{}", e.spec), e.rule))?;
    let release = if job.release.is_empty() {
        ReleaseMethod::Generalization
    } else {
        job.release
            .parse()
            .map_err(|e: String| invalid("job.release", e))?
    };
    let mut spec = JobSpec {
        source_name: "job".to_string(),
        input: None,
        delimiter: b',',
        unlisted: if job.keep_unlisted {
            Unlisted::Keep
        } else {
            Unlisted::Drop
        },
        columns,
        privacy,
        release,
        seed: job.seed,
        algorithm: crate::relational::AlgorithmOptions::default(),
        formulas: crate::relational::release::Formulas::default(),
        sweep: None,
    };
    override_algorithm(&mut spec, job)?;
    Ok(spec)
}

/// The job's `algorithm`, `metric` and `max_suppression` over the spec's, by the CLI's rules
/// ([`JobSpec::override_algorithm`]); an error names the field.
fn override_algorithm(spec: &mut JobSpec, job: &TableJob) -> Result<(), TableServiceError> {
    let named = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let (algorithm, metric) = (named(&job.algorithm), named(&job.metric));
    spec.override_algorithm(AlgorithmOverrides {
        algorithm: algorithm.as_deref(),
        metric: metric.as_deref(),
        max_suppression: job.max_suppression,
    })
    .map_err(|e| {
        let field = match e.field {
            AlgorithmField::Algorithm => "job.algorithm",
            AlgorithmField::Metric => "job.metric",
            AlgorithmField::MaxSuppression => "job.max_suppression",
        };
        invalid(field, e.rule)
    })
}

/// Reads the job message and the row chunks into a table builder, within the limits.
async fn receive(
    limits: &TablesConfig,
    max_message_bytes: usize,
    requests: &mut Streaming<AnonymizeRequest>,
) -> Result<(JobSpec, TableBuilder), TableServiceError> {
    let first = next_message(limits, max_message_bytes, requests)
        .await?
        .ok_or_else(|| invalid("job", "the request stream is empty"))?;
    let Some(RequestPart::Job(job)) = first.part else {
        return Err(invalid("job", "the first message must carry the job"));
    };
    let spec = job_spec(&job)?;
    let texts: HashMap<&str, &str> = job
        .hierarchies
        .iter()
        .map(|h| (h.name.as_str(), h.csv.as_str()))
        .collect();
    let schema = spec.schema(|name, column| -> Result<Hierarchy, TableServiceError> {
        let text = texts.get(name).ok_or_else(|| {
            invalid(
                "job.hierarchies",
                format!(
                    "no hierarchy named {} (for column {})",
                    crate::text::quote(name),
                    crate::text::quote(column)
                ),
            )
        })?;
        Ok(Hierarchy::parse(
            &format!("job.hierarchies[{}]", crate::text::quote(name)),
            text,
        )?)
    })?;
    if job.header.is_empty() {
        return Err(invalid(
            "job.header",
            "required: the column names of the rows",
        ));
    }
    let header: Vec<&str> = job.header.iter().map(String::as_str).collect();
    let mut builder = TableBuilder::new(schema, &header, "rows", 0)?.with_max_rows(limits.max_rows);
    let mut bytes = 0usize;
    while let Some(message) = next_message(limits, max_message_bytes, requests).await? {
        match message.part {
            Some(RequestPart::Rows(chunk)) => {
                for row in chunk.rows {
                    bytes += row.values.iter().map(String::len).sum::<usize>();
                    if bytes > limits.max_bytes {
                        return Err(TableServiceError::Limit {
                            limit: "tables.max_bytes",
                            rule: format!("the job's rows exceed {} bytes", limits.max_bytes),
                        });
                    }
                    let line = builder.rows() as u64 + 1;
                    builder.push_row(row.values.iter().map(String::as_str), line)?;
                }
            }
            Some(RequestPart::Job(_)) => {
                return Err(invalid("job", "sent twice (rule: one job per stream)"));
            }
            None => return Err(invalid("part", "empty message")),
        }
    }
    Ok((spec, builder))
}

fn report_message(report: &Report) -> TableReport {
    TableReport {
        release: report.release.clone(),
        rows: report.rows,
        classes: report.classes,
        k: report.k,
        l_distinct: report.l_distinct,
        l_entropy: report.l_entropy,
        t_emd: report.t_emd,
        t_js: report.t_js,
        delta: report.delta,
        discernibility: report.discernibility,
        avg_class_size: report.avg_class_size,
        seconds: report.seconds,
        json: serde_json::to_string(report).unwrap_or_default(),
        algorithm: report.algorithm.clone(),
        homogeneous_classes: report.attacks.homogeneity.classes,
        homogeneous_share: report.attacks.homogeneity.share_of_records,
        background_posterior: report.attacks.background_knowledge.posterior,
        background_delta_bound: report.attacks.background_knowledge.delta_bound,
        rows_at_input_position: report
            .attacks
            .unsorted_matching
            .as_ref()
            .map_or(0, |m| m.rows_at_input_position),
        row_order_p_value: report
            .attacks
            .unsorted_matching
            .as_ref()
            .map_or(1.0, |m| m.p_value),
    }
}

/// Streams the release in chunks; stops quietly if the client goes away.
async fn send_release(
    tx: mpsc::Sender<Result<AnonymizeResponse, Status>>,
    release: Release,
    report: Report,
    rows_per_chunk: usize,
) {
    let send = |part| {
        let tx = tx.clone();
        async move {
            tx.send(Ok(AnonymizeResponse { part: Some(part) }))
                .await
                .is_ok()
        }
    };
    let (table, sensitive) = match &release {
        Release::Generalized(t) => (t, None),
        Release::Bucketized {
            quasi_table,
            sensitive_table,
        } => (quasi_table, Some(sensitive_table)),
    };
    let header = ReleasedHeader {
        columns: table.header().iter().map(|s| s.to_string()).collect(),
        sensitive_columns: sensitive
            .map(|s| {
                vec![
                    s.group_name.clone(),
                    s.sensitive_name.clone(),
                    "count".to_string(),
                ]
            })
            .unwrap_or_default(),
    };
    if !send(ResponsePart::Header(header)).await {
        return;
    }
    let chunk = rows_per_chunk.max(1);
    for start in (0..table.rows).step_by(chunk) {
        let rows = (start..(start + chunk).min(table.rows))
            .map(|r| Row {
                values: table.row(r).map(String::from).collect(),
            })
            .collect();
        if !send(ResponsePart::Rows(RowChunk { rows })).await {
            return;
        }
    }
    if let Some(s) = sensitive {
        for entries in s.entries.chunks(chunk) {
            let rows = entries
                .iter()
                .map(|e| SensitiveRow {
                    group: e.group,
                    value: e.value.clone(),
                    count: e.count,
                })
                .collect();
            if !send(ResponsePart::Sensitive(SensitiveChunk { rows })).await {
                return;
            }
        }
    }
    send(ResponsePart::Report(report_message(&report))).await;
}

type AnonymizeStream = Pin<Box<dyn Stream<Item = Result<AnonymizeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl TableAnonymizer for TableService {
    type AnonymizeStream = AnonymizeStream;

    async fn anonymize(
        &self,
        request: Request<Streaming<AnonymizeRequest>>,
    ) -> Result<Response<AnonymizeStream>, Status> {
        // Dropped unfinished (counted as cancelled) when tonic drops this future.
        let record = JobRecord::start("anonymize");
        let result = self.run_job(request).await;
        record.finish(Outcome::of(
            result.as_ref().map_err(TableServiceError::failure),
        ));
        result.map_err(Status::from)
    }
}

impl TableService {
    /// One anonymization job: receive the table, anonymize it, stream the release back.
    async fn run_job(
        &self,
        request: Request<Streaming<AnonymizeRequest>>,
    ) -> Result<Response<AnonymizeStream>, TableServiceError> {
        let slot = self.jobs.acquire()?;
        let mut requests = request.into_inner();
        let (spec, builder) =
            match receive(&self.limits, self.max_message_bytes, &mut requests).await {
                Ok(received) => received,
                Err(e) => {
                    drain(requests);
                    return Err(e);
                }
            };
        let stopped = |e: &TableServiceError| {
            matches!(e, TableServiceError::Anonymize(AnonymizeError::Cancelled))
        };
        let (anonymized, slot) = self
            .jobs
            .run("anonymize", slot, stopped, move |cancelled, _budget| {
                let table = builder.finish()?;
                Ok(anonymize_job(&table, &spec, cancelled)?)
            })
            .await?;
        let (release, report) = anonymized?;
        let (tx, rx) = mpsc::channel(4);
        let rows_per_chunk = self.limits.rows_per_chunk;
        tokio::spawn(async move {
            let _slot = slot;
            send_release(tx, release, report, rows_per_chunk).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::table_anonymizer_client::TableAnonymizerClient;
    use crate::proto::{HierarchyText, PrivacySpec as ProtoPrivacy};

    async fn start(config: TablesConfig) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(table_anonymizer(
                    &config,
                    TableJobs::new(&config),
                    crate::service::DEFAULT_MAX_MESSAGE_BYTES,
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }

    fn config() -> TablesConfig {
        TablesConfig {
            max_rows: 1000,
            max_bytes: 1 << 20,
            max_concurrent_jobs: 2,
            rows_per_chunk: 3,
            ..crate::config::Config::embedded_defaults().tables
        }
    }

    fn job(k: u64, release: &str) -> TableJob {
        TableJob {
            header: vec!["id".into(), "age".into(), "sex".into(), "disease".into()],
            columns: vec![
                crate::proto::ColumnSpec {
                    name: "age".into(),
                    role: "quasi".into(),
                    kind: "numeric".into(),
                    hierarchy: String::new(),
                },
                crate::proto::ColumnSpec {
                    name: "sex".into(),
                    role: "quasi".into(),
                    kind: String::new(),
                    hierarchy: "sex".into(),
                },
                crate::proto::ColumnSpec {
                    name: "disease".into(),
                    role: "sensitive".into(),
                    kind: String::new(),
                    hierarchy: String::new(),
                },
            ],
            privacy: Some(ProtoPrivacy {
                k,
                ..Default::default()
            }),
            release: release.into(),
            seed: 1,
            hierarchies: vec![HierarchyText {
                name: "sex".into(),
                csv: "Male;*\nFemale;*\n".into(),
            }],
            ..Default::default()
        }
    }

    fn rows(n: usize) -> Vec<AnonymizeRequest> {
        (0..n)
            .collect::<Vec<_>>()
            .chunks(4)
            .map(|c| AnonymizeRequest {
                part: Some(RequestPart::Rows(RowChunk {
                    rows: c
                        .iter()
                        .map(|&i| Row {
                            values: vec![
                                i.to_string(),
                                (20 + i % 40).to_string(),
                                if i % 2 == 0 { "Male" } else { "Female" }.into(),
                                format!("d{}", i % 5),
                            ],
                        })
                        .collect(),
                })),
            })
            .collect()
    }

    async fn call(
        endpoint: &str,
        messages: Vec<AnonymizeRequest>,
    ) -> Result<Vec<AnonymizeResponse>, Status> {
        let mut client = TableAnonymizerClient::connect(endpoint.to_string())
            .await
            .unwrap();
        let mut stream = client
            .anonymize(tokio_stream::iter(messages))
            .await?
            .into_inner();
        let mut out = Vec::new();
        while let Some(m) = stream.message().await? {
            out.push(m);
        }
        Ok(out)
    }

    fn with_job(job: TableJob, mut rest: Vec<AnonymizeRequest>) -> Vec<AnonymizeRequest> {
        rest.insert(
            0,
            AnonymizeRequest {
                part: Some(RequestPart::Job(job)),
            },
        );
        rest
    }

    #[tokio::test]
    async fn streams_a_release_and_its_report() {
        let endpoint = start(config()).await;
        let out = call(&endpoint, with_job(job(3, ""), rows(30)))
            .await
            .unwrap();
        let Some(ResponsePart::Header(h)) = &out[0].part else {
            panic!("header first")
        };
        assert_eq!(h.columns, ["age", "sex", "disease"]);
        let released: Vec<&Row> = out
            .iter()
            .filter_map(|m| match &m.part {
                Some(ResponsePart::Rows(c)) => Some(&c.rows),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(released.len(), 30);
        let mut classes: HashMap<(String, String), u64> = HashMap::new();
        for r in &released {
            *classes
                .entry((r.values[0].clone(), r.values[1].clone()))
                .or_default() += 1;
        }
        assert!(classes.values().all(|&s| s >= 3));
        let Some(ResponsePart::Report(report)) = &out.last().unwrap().part else {
            panic!("report last")
        };
        assert_eq!(report.rows, 30);
        assert_eq!(report.classes, classes.len() as u64);

        let out = call(&endpoint, with_job(job(3, "bucketization"), rows(30)))
            .await
            .unwrap();
        let counted: u64 = out
            .iter()
            .filter_map(|m| match &m.part {
                Some(ResponsePart::Sensitive(c)) => {
                    Some(c.rows.iter().map(|r| r.count).sum::<u64>())
                }
                _ => None,
            })
            .sum();
        assert_eq!(counted, 30);
    }

    #[tokio::test]
    async fn bad_input_and_limits_get_their_status_codes() {
        let endpoint = start(config()).await;
        let mut bad_row = rows(4);
        if let Some(RequestPart::Rows(c)) = &mut bad_row[0].part {
            c.rows[2].values[1] = "old".into();
        }
        let e = call(&endpoint, with_job(job(2, ""), bad_row))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message()
                .contains("rows:3:2: \"old\" in column \"age\" is not a number"),
            "{}",
            e.message()
        );

        let e = call(&endpoint, with_job(job(2, "shuffle"), rows(4)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("job.release"), "{}", e.message());

        let e = call(&endpoint, with_job(job(50, ""), rows(10)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("k-anonymity (k=50) cannot be met"));

        let e = call(&endpoint, with_job(job(2, ""), rows(1001)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);

        let e = call(&endpoint, rows(4)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);

        let mut toml_job = job(0, "");
        toml_job.columns.clear();
        toml_job.job_toml = "[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\nsex = { role = \"quasi\", hierarchy = \"sex\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 0\n".into();
        let e = call(&endpoint, with_job(toml_job.clone(), rows(4)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message()
                .starts_with("job.job_toml:6:5: k must be at least 1"),
            "{}",
            e.message()
        );
        toml_job.job_toml = toml_job.job_toml.replace("k = 0", "k = 2");
        assert!(call(&endpoint, with_job(toml_job, rows(8))).await.is_ok());
    }

    #[test]
    fn risk_bounds_are_converted_and_checked_by_the_job_files_rules() {
        use crate::proto::PopulationUniquenessBound;
        use crate::relational::models::UniquenessModel;
        let bounded = |edit: fn(&mut ProtoPrivacy)| {
            let mut j = job(0, "");
            edit(j.privacy.as_mut().unwrap());
            j
        };
        let spec = job_spec(&bounded(|p| {
            p.max_risk_highest = Some(0.5);
            p.max_risk_average = Some(0.25);
            p.population_uniqueness = Some(PopulationUniquenessBound {
                model: "dankar".into(),
                population: 1e6,
                max: 0.01,
            });
        }))
        .unwrap();
        assert_eq!(spec.privacy.k, None);
        assert_eq!(
            spec.privacy.risk,
            RiskBounds {
                highest: Some(0.5),
                average: Some(0.25),
                population_uniqueness: Some(UniquenessBound {
                    model: UniquenessModel::Dankar,
                    population: 1e6,
                    max: 0.01,
                }),
            }
        );
        let refused = |j: TableJob| job_spec(&j).unwrap_err().to_string();
        for (edit, message) in [
            (
                (|p: &mut ProtoPrivacy| p.max_risk_highest = Some(0.0)) as fn(&mut ProtoPrivacy),
                "job.privacy.max_risk_highest: max_risk_highest must lie in (0, 1]",
            ),
            (
                |p| p.max_risk_average = Some(1.5),
                "job.privacy.max_risk_average: max_risk_average must lie in (0, 1]",
            ),
            (
                |p| p.max_risk_average = Some(f64::NAN),
                "job.privacy.max_risk_average: max_risk_average must lie in (0, 1]",
            ),
            (
                |p| {
                    p.population_uniqueness = Some(PopulationUniquenessBound {
                        model: "poisson".into(),
                        population: 10.0,
                        max: 0.1,
                    })
                },
                "job.privacy.population_uniqueness.model: unknown population model \"poisson\"",
            ),
            (
                |p| {
                    p.population_uniqueness = Some(PopulationUniquenessBound {
                        model: "snb".into(),
                        population: 0.0,
                        max: 0.1,
                    })
                },
                "job.privacy.population_uniqueness.population: population must be a finite number >= 1",
            ),
            (
                |p| {
                    p.population_uniqueness = Some(PopulationUniquenessBound {
                        model: "snb".into(),
                        population: 10.0,
                        max: -0.1,
                    })
                },
                "job.privacy.population_uniqueness.max: max must lie in [0, 1]",
            ),
        ] {
            let m = refused(bounded(edit));
            assert!(m.starts_with(message), "{m}");
        }
        // Bucketization publishes the exact QIs: refused before any row, as the engine refuses it.
        let mut bucket = bounded(|p| p.max_risk_highest = Some(0.5));
        bucket.release = "bucketization".into();
        let e = job_spec(&bucket).unwrap_err();
        assert_eq!(Status::from(e).code(), tonic::Code::InvalidArgument);
        let m = refused(bucket);
        assert!(
            m.starts_with("job.release: max_risk_highest, max_risk_average and population_uniqueness bound generalization and trivial releases"),
            "{m}"
        );
    }
}
