//! Shared by the security tests: principals with tokens, bearer-token clients, and a certificate
//! authority made in the test (rcgen) for TLS and mutual TLS.
use std::path::PathBuf;

use cloakd::auth::{Principal, Role, StreamPattern};
use cloakd::config::{Config, PrincipalConfig, TlsConfig};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The token of principal `name` in these tests.
pub fn token_of(name: &str) -> String {
    format!("tok-{name}-0123456789abcdef")
}

/// A principal config authenticated by [`token_of`].
pub fn principal(name: &str, role: Role, scope: &[&str]) -> PrincipalConfig {
    let scope: Vec<String> = scope.iter().map(|s| s.to_string()).collect();
    let mut hash = [0u8; 32];
    hex::decode_to_slice(cloakd::auth::hash_token(&token_of(name)), &mut hash).unwrap();
    PrincipalConfig {
        principal: Principal {
            name: name.to_string(),
            role: Some(role),
            services: if role == Role::Provider {
                scope.clone()
            } else {
                vec![]
            },
            user_ids: if role == Role::Mobile {
                scope.iter().cloned().collect()
            } else {
                Default::default()
            },
            streams: if matches!(role, Role::Producer | Role::Consumer) {
                scope.iter().map(|s| StreamPattern::parse(s)).collect()
            } else {
                vec![]
            },
        },
        token_sha256: Some(hash),
        cert_dns_name: None,
    }
}

/// The embedded defaults with `auth.required = true` and one principal of every role:
/// mobile `app-a` (users alice, bob), mobile `app-b` (carol, dave, erin), providers `lbs-poi` and
/// `lbs-poi-2` (poi) and `lbs-traffic` (traffic), producer `shop` (orders*), consumer `reader`
/// (orders-eu), analyst `analyst`, operator `ops`.
pub fn secured_config() -> Config {
    let mut config = Config::embedded_defaults();
    config.auth.required = true;
    config.auth.principals = vec![
        principal("app-a", Role::Mobile, &["alice", "bob"]),
        principal("app-b", Role::Mobile, &["carol", "dave", "erin"]),
        principal("lbs-poi", Role::Provider, &["poi"]),
        principal("lbs-poi-2", Role::Provider, &["poi"]),
        principal("lbs-traffic", Role::Provider, &["traffic"]),
        principal("shop", Role::Producer, &["orders*"]),
        principal("reader", Role::Consumer, &["orders-eu"]),
        principal("analyst", Role::Analyst, &[]),
        principal("ops", Role::Operator, &[]),
    ];
    config
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(pub Option<String>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// A channel whose calls carry `name`'s token (`None`: no credential).
pub fn as_principal(channel: Channel, name: Option<&str>) -> InterceptedService<Channel, Bearer> {
    InterceptedService::new(channel, Bearer(name.map(token_of)))
}

/// A certificate authority with PEM files of a server certificate for `localhost`/127.0.0.1 and
/// client certificates, all written under one directory.
pub struct TestPki {
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "cloakd test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_pem = ca.pem();
        std::fs::write(dir.path().join("ca.crt"), &ca_pem).unwrap();
        TestPki { dir, ca_pem, ca }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Issues a certificate for `names` (server or client use) and writes `<stem>.crt`/`<stem>.key`.
    pub fn issue(&self, stem: &str, names: &[&str], client: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, stem);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        std::fs::write(self.path(&format!("{stem}.crt")), &cert_pem).unwrap();
        std::fs::write(self.path(&format!("{stem}.key")), &key_pem).unwrap();
        (cert_pem, key_pem)
    }

    /// `[server.tls]` for a fresh `localhost` server certificate, optionally with mutual TLS.
    pub fn server_tls(&self, mutual: bool) -> TlsConfig {
        self.issue("server", &["localhost", "127.0.0.1"], false);
        TlsConfig {
            cert_file: self.path("server.crt"),
            key_file: self.path("server.key"),
            client_ca_file: mutual.then(|| self.path("ca.crt")),
        }
    }
}

/// Connects over TLS to `addr` (server name `localhost`), trusting `ca_pem`, optionally with a
/// client identity.
pub async fn tls_channel(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

/// Retries `connect` until a daemon started as a separate process listens (30 s at most).
pub async fn connect_when_listening<F, Fut>(mut connect: F) -> Channel
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Channel, tonic::transport::Error>>,
{
    let started = std::time::Instant::now();
    loop {
        match connect().await {
            Ok(channel) => return channel,
            Err(_) if started.elapsed() < std::time::Duration::from_secs(30) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(err) => panic!("the daemon never listened: {err}"),
        }
    }
}
