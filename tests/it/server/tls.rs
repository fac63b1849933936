//! TLS against the real daemon with certificates made in the test: the handshake and a token over
//! it, a client certificate as the credential under mutual TLS, refusal of plaintext and of untrusted
//! servers, and (with the real binary) certificates reloaded on SIGHUP while the listener stays up.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cloakd::auth::Role;
use cloakd::proto::LbsSubscription;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::TestDaemon;
use crate::support::security::{
    Bearer, TestPki, connect_when_listening, principal, secured_config, tls_channel, token_of,
};

async fn subscribe(
    channel: tonic::transport::Channel,
    token: Option<String>,
) -> Result<(), tonic::Status> {
    LbsGatewayClient::new(InterceptedService::new(channel, Bearer(token)))
        .subscribe(LbsSubscription {
            service: "poi".into(),
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn tls_handshake_then_token_authentication() {
    let pki = TestPki::new();
    let mut config = secured_config();
    config.server.tls = Some(pki.server_tls(false));
    let daemon = TestDaemon::start(config).await;

    let channel = tls_channel(daemon.addr, &pki.ca_pem, None).await.unwrap();
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");
    subscribe(channel.clone(), Some(token_of("lbs-poi")))
        .await
        .unwrap();
    let status = subscribe(channel, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // Plaintext HTTP/2 to the TLS port gets nowhere.
    let plain = tonic::transport::Endpoint::from_shared(daemon.endpoint())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let plaintext = match plain.connect().await {
        Ok(channel) => HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| ()),
        Err(err) => Err(tonic::Status::unavailable(err.to_string())),
    };
    assert!(plaintext.is_err(), "plaintext call succeeded on a TLS port");

    // A client that trusts another CA refuses the server.
    let other = TestPki::new();
    assert!(tls_channel(daemon.addr, &other.ca_pem, None).await.is_err());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_client_certificate_is_a_credential() {
    let pki = TestPki::new();
    let mut config = secured_config();
    config.server.tls = Some(pki.server_tls(true));
    let mut by_cert = principal("lbs-cert", Role::Provider, &["poi"]);
    by_cert.token_sha256 = None;
    by_cert.cert_dns_name = Some("lbs-cert.test".to_string().try_into().unwrap());
    config.auth.principals.push(by_cert);
    let daemon = TestDaemon::start(config).await;

    let (cert, key) = pki.issue("lbs-cert", &["lbs-cert.test"], true);
    let channel = tls_channel(daemon.addr, &pki.ca_pem, Some((&cert, &key)))
        .await
        .unwrap();
    subscribe(channel, None).await.unwrap();

    // A certificate from the right CA but for no principal's name is not a credential.
    let (cert, key) = pki.issue("stranger", &["stranger.test"], true);
    let channel = tls_channel(daemon.addr, &pki.ca_pem, Some((&cert, &key)))
        .await
        .unwrap();
    let status = subscribe(channel, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // Without a certificate, a token still works under mutual TLS.
    let channel = tls_channel(daemon.addr, &pki.ca_pem, None).await.unwrap();
    subscribe(channel, Some(token_of("lbs-poi"))).await.unwrap();
    daemon.shutdown().await.unwrap();
}

/// Issue 21 item 7: a client certificate names a principal only by an exact SAN match. A wildcard SAN
/// (`*.example.org`) does not expand to `lbs-poi.example.org`, and a certificate whose SANs name two
/// configured principals is refused with UNAUTHENTICATED naming the rule, whatever the config order.
#[tokio::test]
async fn client_certificate_identity_is_matched_exactly() {
    let pki = TestPki::new();
    let mut config = secured_config();
    config.server.tls = Some(pki.server_tls(true));
    for (name, dns) in [
        ("lbs-poi-cert", "lbs-poi.example.org"),
        ("lbs-other-cert", "lbs-other.example.org"),
    ] {
        let mut by_cert = principal(name, Role::Provider, &["poi"]);
        by_cert.token_sha256 = None;
        by_cert.cert_dns_name = Some(dns.to_string().try_into().unwrap());
        config.auth.principals.push(by_cert);
    }
    let daemon = TestDaemon::start(config).await;
    let call = |names: &'static [&'static str], stem: &'static str| {
        let (cert, key) = pki.issue(stem, names, true);
        let addr = daemon.addr;
        let ca = pki.ca_pem.clone();
        async move {
            let channel = tls_channel(addr, &ca, Some((&cert, &key))).await.unwrap();
            subscribe(channel, None).await
        }
    };

    // The exact name authenticates, in any letter case.
    call(&["lbs-poi.example.org"], "exact").await.unwrap();
    call(&["LBS-POI.Example.ORG"], "upper").await.unwrap();

    // A wildcard SAN is not expanded.
    let status = call(&["*.example.org"], "wildcard").await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("matched exactly"),
        "{}",
        status.message()
    );

    // Two configured principals in one certificate: refused, in either SAN order.
    for (names, stem) in [
        (
            &["lbs-poi.example.org", "lbs-other.example.org"][..],
            "both",
        ),
        (
            &["lbs-other.example.org", "lbs-poi.example.org"][..],
            "both-reversed",
        ),
    ] {
        let (cert, key) = pki.issue(stem, names, true);
        let channel = tls_channel(daemon.addr, &pki.ca_pem, Some((&cert, &key)))
            .await
            .unwrap();
        let status = subscribe(channel, None).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(
            status.message().contains("must name exactly one principal"),
            "{}",
            status.message()
        );
    }

    // A configured name beside unconfigured ones is still exactly one principal.
    call(&["lbs-poi.example.org", "unrelated.example.net"], "extra")
        .await
        .unwrap();
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn sighup_reloads_certificates_without_dropping_the_listener() {
    let pki = TestPki::new();
    let tls = pki.server_tls(false);
    let port = crate::support::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = pki.path("cloakd.toml");
    std::fs::write(
        &config,
        format!(
            "[telemetry]\nmetrics_listen = \"127.0.0.1:0\"\n[server]\nlisten = \"{addr}\"\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n[transactions]\ndata_dir = {:?}\n",
            tls.cert_file,
            tls.key_file,
            data.path()
        ),
    )
    .unwrap();
    let mut child = crate::support::bin()
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = connect_when_listening(|| tls_channel(addr, &pki.ca_pem, None)).await;

    // A new CA issues the server a new certificate; the files are replaced and SIGHUP sent.
    let next = TestPki::new();
    next.issue("server", &["localhost", "127.0.0.1"], false);
    std::fs::copy(next.path("server.crt"), &tls.cert_file).unwrap();
    std::fs::copy(next.path("server.key"), &tls.key_file).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tls_channel(addr, &next.ca_pem, None).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // New connections trusting only the old CA now fail; the daemon never stopped.
    assert!(tls_channel(addr, &pki.ca_pem, None).await.is_err());
    assert!(child.try_wait().unwrap().is_none(), "daemon exited");
    // The connection made before the reload still works.
    let health = HealthClient::new(first)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");

    // A broken file on the next SIGHUP keeps the current certificate.
    std::fs::write(&tls.cert_file, "not a certificate").unwrap();
    Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(tls_channel(addr, &next.ca_pem, None).await.is_ok());

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}
