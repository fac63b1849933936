//! `cloakd provider`: the reference LBS provider of points of interest. It subscribes to one service
//! of a running broker's `LbsGateway` (with its own credentials, like any provider), decodes each
//! cloaked request's payload as a `cloakd.v1.poi.PoiQuery` and answers with a `PoiCandidates` list that
//! holds the exact answer for every point of the cloaking box ([`crate::poi`]). It never sees a point:
//! only the box, the interval and the payload.
//!
//! A query that does not decode, breaks a limit, or whose list would not fit the broker's payload limit
//! is answered with `PoiCandidates.error` naming the field and the rule (and no POIs); the provider
//! keeps serving. It exits when the broker ends the Subscribe stream (0 for a clean end, an error
//! naming the status otherwise).
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::poi::table::{TableLimits, read_pois};
use crate::poi::{Limits, PoiIndex, Query, QueryError, query_box};
use crate::proto::lbs_gateway_client::LbsGatewayClient;
use crate::proto::poi::{Poi, PoiCandidates, PoiQuery, poi_query};
use crate::proto::{CloakedRequest, LbsAnswer, LbsSubscription};

#[derive(Debug, clap::Args)]
pub struct ProviderArgs {
    /// POI file: CSV with the header `id,lat,lon,category,name` (optionally gzip'd); see
    /// docs/provider.md for generating one or exporting one from OpenStreetMap.
    #[arg(long, value_name = "FILE")]
    pub pois: PathBuf,
    /// The service to serve (one of the broker's location.services).
    #[arg(long, default_value = "poi")]
    pub service: String,
    /// The broker, as a URL (`https://...` with --ca for TLS).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// File holding the provider's bearer token (default: $CLOAKD_TOKEN; none: no credential).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that issued the broker's certificate (TLS).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Name to verify in the broker's certificate, if not the host of --addr.
    #[arg(long)]
    pub server_name: Option<String>,
    /// Largest `count` of a nearest query.
    #[arg(long, default_value_t = Limits::default().max_count)]
    pub max_count: u32,
    /// Largest `radius_m` of a range query, in metres.
    #[arg(long, default_value_t = Limits::default().max_radius_m)]
    pub max_radius_m: f64,
    /// Largest side of a cloaking box answered, in metres.
    #[arg(long, default_value_t = Limits::default().max_box_m)]
    pub max_box_m: f64,
    /// Most POIs in one candidate list (longer lists are refused with an error).
    #[arg(long, default_value_t = Limits::default().max_candidates)]
    pub max_candidates: usize,
    /// Largest answer payload in bytes: the broker's location.max_payload_bytes.
    #[arg(long, default_value_t = 16_384)]
    pub max_payload_bytes: usize,
}

/// The provider's state: the indexed POIs and its limits. [`PoiProvider::answer`] is the whole
/// per-request work, shared by the process, `cloakd simulate` and the tests.
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
            Err(e) => PoiCandidates {
                pois: Vec::new(),
                error: e.to_string(),
            },
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
        let b = request.r#box.ok_or_else(|| refuse("box", "missing"))?;
        let b = query_box(b.min_lat, b.min_lon, b.max_lat, b.max_lon, &self.limits)?;
        let list = self
            .index
            .candidates(&query.category, &q, &b, &self.limits)?;
        let reply = PoiCandidates {
            pois: list
                .pois
                .iter()
                .map(|&i| to_proto(self.index.poi(i)))
                .collect(),
            error: String::new(),
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

/// Reads a POI file (plain or gzip; records bounded by `lines::BoundedLines`).
pub fn load_pois(path: &std::path::Path) -> anyhow::Result<Vec<crate::poi::Poi>> {
    let file = crate::workload::open_maybe_gz(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let bounded = crate::lines::BoundedLines::new(file, crate::lines::Records::Csv);
    read_pois(bounded, &TableLimits::default()).with_context(|| format!("{}", path.display()))
}

/// Adds `authorization: Bearer <token>` to every call when a token is given.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> anyhow::Result<Bearer> {
        token
            .map(|t| {
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("the token must be printable ASCII"))
            })
            .transpose()
            .map(Bearer)
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The channel of `--addr`, with TLS when `ca` is given.
pub async fn connect(
    addr: &str,
    ca: Option<&std::path::Path>,
    server_name: Option<&str>,
) -> anyhow::Result<Channel> {
    let mut endpoint = Endpoint::from_shared(addr.to_string())
        .with_context(|| format!("--addr: {addr:?} is not a URL"))?
        .tcp_nodelay(true);
    if let Some(ca) = ca {
        let pem =
            std::fs::read(ca).with_context(|| format!("--ca: cannot read {}", ca.display()))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(name) = server_name {
            tls = tls.domain_name(name);
        }
        endpoint = endpoint.tls_config(tls).context("--ca")?;
    }
    endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))
}

/// Subscribes to `service` and answers every cloaked request until the broker ends the stream.
/// Returns how many requests were answered.
pub async fn serve(
    provider: Arc<PoiProvider>,
    channel: Channel,
    bearer: Bearer,
    service: &str,
) -> anyhow::Result<u64> {
    let mut gateway = LbsGatewayClient::new(InterceptedService::new(channel, bearer));
    let mut feed = gateway
        .subscribe(LbsSubscription {
            service: service.to_string(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("Subscribe: {} {}", s.code(), s.message()))?
        .into_inner();
    let (tx, rx) = mpsc::channel::<LbsAnswer>(4096);
    let mut answers = gateway.clone();
    let answering = tokio::spawn(async move { answers.answer(ReceiverStream::new(rx)).await });
    let mut served = 0u64;
    let ended = loop {
        match feed.message().await {
            Ok(Some(request)) => {
                let payload = provider.answer(&request);
                let answer = LbsAnswer {
                    pseudonym: request.pseudonym,
                    payload,
                    ack: false,
                };
                if tx.send(answer).await.is_err() {
                    break Ok(());
                }
                served += 1;
            }
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        }
    };
    drop(tx);
    let summary = answering.await.context("the Answer task failed")?;
    if let Err(status) = ended {
        anyhow::bail!("Subscribe ended: {} {}", status.code(), status.message());
    }
    summary.map_err(|s| anyhow::anyhow!("Answer: {} {}", s.code(), s.message()))?;
    Ok(served)
}

fn read_token(path: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let token = match path {
        Some(path) => crate::lines::read_text_file(path)
            .with_context(|| format!("--token-file: cannot read {}", path.display()))?,
        None => std::env::var("CLOAKD_TOKEN").unwrap_or_default(),
    };
    let token = token.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

pub fn run(args: ProviderArgs) -> anyhow::Result<()> {
    let limits = Limits {
        max_count: args.max_count,
        max_radius_m: args.max_radius_m,
        max_box_m: args.max_box_m,
        max_candidates: args.max_candidates,
    };
    let pois = load_pois(&args.pois)?;
    anyhow::ensure!(!pois.is_empty(), "{}: no POIs", args.pois.display());
    let index = PoiIndex::new(pois);
    tracing::info!(
        pois = index.len(),
        categories = index.categories().len(),
        service = %args.service,
        "POIs indexed"
    );
    let bearer = Bearer::new(read_token(args.token_file.as_deref())?.as_deref())?;
    let provider = Arc::new(PoiProvider {
        index,
        limits,
        max_payload_bytes: args.max_payload_bytes,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let channel = connect(&args.addr, args.ca.as_deref(), args.server_name.as_deref()).await?;
        tracing::info!(addr = %args.addr, "connected");
        let served = serve(provider, channel, bearer, &args.service).await?;
        tracing::info!(served, "the broker ended the subscription");
        Ok(())
    })
}
