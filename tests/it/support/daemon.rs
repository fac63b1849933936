//! The real daemon in the test's own runtime: `cloakd::daemon::serve` on an ephemeral loopback port,
//! with a fresh data directory and no metrics listener unless the test's config asks otherwise (many
//! daemons run at once in the test process and share its one metrics recorder).
use std::net::SocketAddr;
use std::time::Duration;

use cloakd::config::Config;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A daemon running in this test's runtime.
pub struct TestDaemon {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// A fresh transaction data directory when the config left the default `./data`.
    _data_dir: Option<tempfile::TempDir>,
}

impl TestDaemon {
    /// Starts `cloakd::daemon::serve` with `config` on an ephemeral loopback port.
    /// A config still pointing at the default `./data` gets a fresh temporary data directory instead.
    pub async fn start(mut config: Config) -> TestDaemon {
        let default_dir = Config::embedded_defaults().transactions.data_dir;
        let data_dir = (config.transactions.data_dir == default_dir).then(|| {
            let dir = tempfile::tempdir().unwrap();
            config.transactions.data_dir = dir.path().to_path_buf();
            dir
        });
        // Many daemons run at once in a test process: none takes the default metrics port.
        if config.telemetry == Config::embedded_defaults().telemetry {
            config.telemetry.metrics_listen = None;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cloakd::daemon::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        TestDaemon {
            addr,
            stop: Some(stop),
            task: Some(task),
            _data_dir: data_dir,
        }
    }

    /// Starts the daemon on the embedded defaults.
    pub async fn start_default() -> TestDaemon {
        Self::start(Config::embedded_defaults()).await
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A fresh connection to the daemon.
    pub async fn channel(&self) -> Channel {
        let endpoint = tonic::transport::Endpoint::from_shared(self.endpoint()).unwrap();
        for _ in 0..50 {
            if let Ok(channel) = endpoint.connect().await {
                return channel;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("daemon at {} did not accept connections", self.addr);
    }

    /// Graceful shutdown; returns what `serve` returned.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("daemon did not stop within 30 s")
            .expect("daemon task panicked")
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A config on the embedded defaults with `f` applied.
pub fn config_with(f: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::embedded_defaults();
    f(&mut config);
    config
}
