//! TLS termination with rustls (ring provider; no OpenSSL) in front of the gRPC server, with
//! certificates reloaded without dropping the listener.
//!
//! The daemon owns the accept loop ([`crate::connections`], which applies the connection limits):
//! each accepted connection is handshaken with the *current* `rustls::ServerConfig` (read from
//! `[server.tls]`), in its own task and within `server.handshake_timeout_ms`, and handed to tonic as
//! an already encrypted stream (`serve_with_incoming_shutdown`; tonic records the peer's
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
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::config::TlsConfig;

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

    /// Runs the TLS handshake on each of `connections` (in its own task, within `handshake_timeout`)
    /// with the configuration in force when it arrived, and yields those that completed it. The
    /// task ends when the returned stream is dropped or `connections` ends.
    pub fn incoming<IO, S>(
        &self,
        mut connections: S,
        handshake_timeout: Duration,
    ) -> ReceiverStream<Result<TlsStream<IO>, std::io::Error>>
    where
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        S: Stream<Item = Result<IO, std::io::Error>> + Unpin + Send + 'static,
    {
        let (ready, incoming) = mpsc::channel(64);
        let tls = self.clone();
        tokio::spawn(async move {
            loop {
                let connection = tokio::select! {
                    connection = connections.next() => connection,
                    _ = ready.closed() => break,
                };
                let connection = match connection {
                    Some(Ok(connection)) => connection,
                    Some(Err(_)) => continue,
                    None => break,
                };
                let acceptor = tls.acceptor();
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(connection)).await
                    {
                        Ok(Ok(stream)) => {
                            let _ = ready.send(Ok(stream)).await;
                        }
                        Ok(Err(err)) => tracing::info!(%err, "TLS handshake failed"),
                        Err(_) => tracing::info!(
                            "TLS handshake not completed within server.handshake_timeout_ms"
                        ),
                    }
                });
            }
        });
        ReceiverStream::new(incoming)
    }
}
