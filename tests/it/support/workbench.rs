//! Shared by the workbench's tests (`workbench::api`, `workbench::browser`): the real daemon with its
//! workbench listener (`daemon::serve_reporting` on 127.0.0.1:0 with `ui.listen = "127.0.0.1:0"`),
//! and the Adult example as the independent relational checker reads it with the privacy requirement
//! of one frontier point.
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use cloakd::config::Config;
use tokio::sync::oneshot;

use super::relational_checker::{CheckQuasi, Original, hierarchy_lines, parse_csv};
use super::{Distance, LDiversity, PrivacySpec, TCloseness, repo};

/// The real daemon serving the workbench on its own loopback listener.
pub struct Workbench {
    pub ui: SocketAddr,
    /// The daemon's gRPC listener.
    pub grpc: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
}

impl Workbench {
    /// Starts the daemon with `config`, its data in a temporary directory, no metrics listener and
    /// the workbench on a free loopback port.
    pub async fn start(mut config: Config) -> Workbench {
        let data = tempfile::tempdir().unwrap();
        config.transactions.data_dir = data.path().to_path_buf();
        config.telemetry.metrics_listen = None;
        config.ui.listen = Some("127.0.0.1:0".parse().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = listener.local_addr().unwrap();
        let (bound_tx, bound_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cloakd::daemon::serve_reporting(
            config,
            listener,
            async move {
                let _ = stopped.await;
            },
            bound_tx,
        ));
        let ui = tokio::time::timeout(Duration::from_secs(30), bound_rx)
            .await
            .expect("the workbench listener is up within 30 s")
            .expect("the daemon reports its listeners")
            .ui
            .expect("the workbench listener is on");
        Workbench {
            ui,
            grpc,
            stop: Some(stop),
            task,
            _data: data,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.ui)
    }

    /// Stops the daemon and waits (at most 30 s) for it to end cleanly.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("daemon stops within 30 s")
            .expect("daemon task")
            .expect("daemon ends cleanly");
    }
}

/// The Adult example as the checker reads it: QIs age (numeric) and the five hierarchies of
/// examples/adult.toml, sensitive occupation.
pub fn adult_original() -> Original {
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(repo().join("examples/data/adult.csv.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    let (header, rows) = parse_csv(text.as_bytes());
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let mut quasi = vec![(col("age"), CheckQuasi::Numeric)];
    for name in ["workclass", "education", "marital-status", "race", "sex"] {
        let h =
            std::fs::read_to_string(repo().join(format!("examples/data/hierarchies/{name}.csv")))
                .unwrap();
        quasi.push((col(name), CheckQuasi::Categorical(hierarchy_lines(&h))));
    }
    let sensitive = col("occupation");
    Original {
        header,
        rows,
        quasi,
        sensitive,
        sensitive_numeric: false,
        id: None,
    }
}

/// The privacy requirement of one frontier point (`cloakd table frontier`'s models).
pub fn spec_of(model: &str, parameter: f64) -> PrivacySpec {
    let mut spec = PrivacySpec::default();
    match model {
        "k-anonymity" => spec.k = Some(parameter.round() as u64),
        "l-diversity" => spec.l = Some(LDiversity::Probabilistic(parameter)),
        "t-closeness" => {
            spec.t = Some(TCloseness {
                t: parameter,
                distance: Distance::Js,
            })
        }
        "delta-disclosure" => spec.delta = Some(parameter),
        other => panic!("unknown model {other}"),
    }
    spec
}

/// An HTTP/1.1 reply read whole off a raw connection.
pub struct RawReply {
    pub status: u16,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    /// The body, de-chunked when it came chunked.
    pub body: Vec<u8>,
}

/// Parses the bytes of one whole HTTP/1.1 reply (the tests that speak raw HTTP to the listener).
pub fn parse_reply(raw: &[u8]) -> RawReply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|t| t == "chunked")
    {
        let mut out = Vec::new();
        let mut rest = body.as_slice();
        loop {
            let at = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..at]).unwrap().trim(), 16)
                .unwrap();
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[at + 2..at + 2 + size]);
            rest = &rest[at + 4 + size..];
        }
        body = out;
    }
    RawReply {
        status,
        headers,
        body,
    }
}
