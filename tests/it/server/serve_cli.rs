//! `cloakd serve` as an operator runs it: the real binary on its embedded defaults (with --listen), health
//! over gRPC, graceful exit on SIGTERM, and configuration errors that name the key.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::free_port;

#[tokio::test]
async fn serve_answers_health_and_exits_cleanly_on_sigterm() {
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let mut child = crate::support::bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("CLOAKD_TRANSACTIONS__DATA_DIR", data.path())
        .env("CLOAKD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let channel = loop {
        match tonic::transport::Endpoint::from_shared(endpoint.clone())
            .unwrap()
            .connect()
            .await
        {
            Ok(channel) => break channel,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(err) => panic!("daemon never listened: {err}"),
        }
    };
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "daemon did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "exit status {exit:?}");
    // Logs into a pipe are plain text: no ANSI colour codes.
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("INFO"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a piped log: {stderr:?}"
    );
}

/// Runs `cloakd serve` with `args` and `env`, expects it to refuse to start, and returns its stderr.
fn refused(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> String {
    let output = crate::support::bin()
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "serve started with {args:?} {env:?}"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_configuration_is_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let with_file = [std::ffi::OsStr::new("--config"), path.as_os_str()];

    std::fs::write(&path, "[location]\nmin_k = 0\n").unwrap();
    let stderr = refused(&with_file, &[]);
    assert!(
        stderr.contains("location.min_k: must be at least 1"),
        "{stderr}"
    );

    std::fs::write(&path, "[location]\ndefault_kk = 3\n").unwrap();
    let stderr = refused(&with_file, &[]);
    assert!(stderr.contains("default_kk"), "{stderr}");

    let stderr = refused(&[], &[("CLOAKD_SERVER__LISTEN", "not-an-address")]);
    assert!(stderr.contains("server.listen"), "{stderr}");
}
