//! TLS termination with rustls (ring provider; no OpenSSL) in front of the gRPC server, with
//! certificates reloaded without dropping the listener.
//!
//! The daemon owns the accept loop: each accepted TCP connection is handshaken with the *current*
//! `rustls::ServerConfig` (read from `[server.tls]`), in its own task and under a timeout, and handed
//! to tonic as an already encrypted stream (`serve_with_incoming_shutdown`; tonic records the peer's
//! certificates, which the auth layer reads). [`TlsReloader::reload`] re-reads the PEM files and swaps
//! the configuration: connections accepted afterwards get the new certificate and client CA, open ones
//! keep theirs, and a file that fails to load leaves the previous configuration in force.
//!
//! Under `client_ca_file` (mutual TLS) a client certificate is verified against that CA but not
//! required at the TLS layer: clients without one may still authenticate with a bearer token.
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::TlsConfig;

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; past it the accept loop waits.
pub const MAX_HANDSHAKES: usize = 1024;

/// A TLS file that could not be used, naming the configuration key.
#[derive(Debug, thiserror::Error)]
#[error("{key} ({path}): {problem}")]
pub struct TlsError {
    pub key: &'static str,
    pub path: String,
    pub problem: String,
}

fn tls_error(key: &'static str, path: &Path, problem: impl ToString) -> TlsError {
    TlsError {
        key,
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

fn read_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(key, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(key, path, e))?;
    if certs.is_empty() {
        return Err(tls_error(key, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Builds the rustls server configuration from the files `tls` names.
pub fn load(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs("server.tls.cert_file", &tls.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| tls_error("server.tls.key_file", &tls.key_file, e))?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("server.tls", &tls.cert_file, e))?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs("server.tls.client_ca_file", path)? {
                roots
                    .add(cert)
                    .map_err(|e| tls_error("server.tls.client_ca_file", path, e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| tls_error("server.tls.client_ca_file", path, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| tls_error("server.tls.key_file", &tls.key_file, e))?;
    // gRPC runs over HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS configuration in force, replaceable while the listener runs.
#[derive(Debug, Clone)]
pub struct TlsReloader {
    files: TlsConfig,
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl TlsReloader {
    /// Loads the files once; fails (naming the key) if they cannot be used.
    pub fn new(files: TlsConfig) -> Result<TlsReloader, TlsError> {
        let config = load(&files)?;
        Ok(TlsReloader {
            files,
            current: Arc::new(RwLock::new(config)),
        })
    }

    /// Re-reads the files; on failure the previous configuration stays in force.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = load(&self.files)?;
        match self.current.write() {
            Ok(mut current) => *current = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
        Ok(())
    }

    fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(current) => Arc::clone(&current),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        TlsAcceptor::from(config)
    }

    /// Accepts connections on `listener` and yields them once their handshake completed. The accept
    /// loop ends (closing the listener) when the returned stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
        let (ready, incoming) = mpsc::channel(64);
        let tls = self.clone();
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = ready.closed() => break,
                };
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
                    break;
                };
                let acceptor = tls.acceptor();
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            drop(permit);
                            let _ = ready.send(Ok(stream)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::info!(%peer, %err, "TLS handshake failed");
                        }
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        ReceiverStream::new(incoming)
    }
}
