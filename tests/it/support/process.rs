//! The real `cloakd` binary as an operator runs it: a config file, JSON logs on stderr (parsed here for
//! the addresses it listens on and for later assertions), `/metrics` scraped over plain HTTP, and
//! signals sent with `kill`.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::binary;

pub struct DaemonProcess {
    child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub config_path: PathBuf,
    logs: Arc<Mutex<Vec<serde_json::Value>>>,
    _dir: tempfile::TempDir,
}

impl DaemonProcess {
    /// Starts `cloakd --log-format json serve --config FILE` where FILE holds `config_toml` followed by
    /// loopback listeners on ephemeral ports and a fresh data directory.
    pub fn start(config_toml: &str) -> DaemonProcess {
        Self::start_with(&binary(), config_toml)
    }

    /// As [`Self::start`], with another build of `cloakd` (e.g. an older one, to measure before and
    /// after a change in one run).
    pub fn start_with(binary: &std::path::Path, config_toml: &str) -> DaemonProcess {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, with_test_sections(config_toml, dir.path())).unwrap();
        let mut child = Command::new(binary)
            .args([
                "--log-format",
                "json",
                "--log-filter",
                "info",
                "serve",
                "--config",
            ])
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        {
            let logs = Arc::clone(&logs);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let value = serde_json::from_str(&line)
                        .unwrap_or_else(|_| serde_json::json!({ "unparsed": line }));
                    logs.lock().unwrap().push(value);
                }
            });
        }
        let mut daemon = DaemonProcess {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            metrics_addr: "0.0.0.0:0".parse().unwrap(),
            config_path,
            logs,
            _dir: dir,
        };
        let listening = daemon.wait_for_log(|l| l["message"] == "cloakd listening");
        daemon.addr = listening["addr"].as_str().unwrap().parse().unwrap();
        let metrics = daemon.wait_for_log(|l| l["message"] == "metrics listening (GET /metrics)");
        daemon.metrics_addr = metrics["metrics_addr"].as_str().unwrap().parse().unwrap();
        daemon
    }

    /// The first log line matching `predicate`, waiting up to 30 s for it.
    pub fn wait_for_log(
        &mut self,
        predicate: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = self.logs.lock().unwrap().iter().find(|l| predicate(l)) {
                return line.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "cloakd exited ({status}); logs: {:#?}",
                    self.logs.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no such log line in 30 s; logs: {:#?}",
                self.logs.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<serde_json::Value> {
        self.logs.lock().unwrap().clone()
    }

    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// `GET /metrics`, parsed.
    pub fn scrape(&self) -> Metrics {
        let mut stream = std::net::TcpStream::connect(self.metrics_addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics_addr
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain"),
            "{head}"
        );
        Metrics::parse(body)
    }

    /// Scrapes until `done` holds (the daemon updates some series just after the client saw the
    /// event), failing the test if it never does within 30 s.
    pub fn eventually(&self, done: impl Fn(&Metrics) -> bool) -> Metrics {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let metrics = self.scrape();
            if done(&metrics) {
                return metrics;
            }
            assert!(
                Instant::now() < deadline,
                "metrics never reached the expected state:\n{}",
                metrics.text
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) {
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "cloakd exited with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cloakd did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `config_toml` with the listeners and the data directory a test needs appended to its sections.
fn with_test_sections(config_toml: &str, dir: &std::path::Path) -> String {
    let mut doc: toml::Table = toml::from_str(config_toml).unwrap();
    let mut set = |section: &str, key: &str, value: toml::Value| {
        let table = doc
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap();
        table.entry(key).or_insert(value);
    };
    set("server", "listen", "127.0.0.1:0".into());
    set("telemetry", "metrics_listen", "127.0.0.1:0".into());
    set(
        "transactions",
        "data_dir",
        dir.join("data").display().to_string().into(),
    );
    toml::to_string(&doc).unwrap()
}

/// One sample: series name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// One scrape, parsed into samples.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub text: String,
    series: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut series = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name_labels, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            let (name, labels) = match name_labels.split_once('{') {
                Some((name, rest)) => {
                    let rest = rest.trim_end_matches('}');
                    let labels = rest
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').unwrap();
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
                None => (name_labels.to_string(), Vec::new()),
            };
            series.push((name, labels, value));
        }
        Metrics {
            text: text.to_string(),
            series,
        }
    }

    /// Sum of every series of `name` whose labels include `labels` (0 when there is none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// Whether any series of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.series.iter().any(|(n, _, _)| n == name)
    }
}
