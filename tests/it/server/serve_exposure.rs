//! Secure by default, with the real binary: on a non-loopback address `cloakd serve` refuses to start
//! without TLS and `auth.required = true`, says what is missing, and starts (with a warning) only when
//! the operator sets `server.allow_insecure = true`. `cloakd auth hash-token` prints the config line.
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::bin;

/// `cloakd serve` on 0.0.0.0 with `data` as its data directory and `env` added to its environment.
fn serve(data: &std::path::Path, env: &[(&str, &str)]) -> std::process::Child {
    bin()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("CLOAKD_TRANSACTIONS__DATA_DIR", data)
        // Not the default 9464: a daemon already running on this machine must not fail the test.
        .env("CLOAKD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn refuses_a_non_loopback_address_without_tls_and_auth() {
    let data = tempfile::tempdir().unwrap();
    let output = serve(data.path(), &[]).wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing to listen"), "{stderr}");
    assert!(
        stderr.contains("[server.tls] is not configured"),
        "{stderr}"
    );
    assert!(stderr.contains("auth.required is false"), "{stderr}");
    assert!(stderr.contains("server.allow_insecure"), "{stderr}");
}

#[test]
fn starts_insecurely_only_when_allowed_and_warns() {
    let data = tempfile::tempdir().unwrap();
    let mut child = serve(data.path(), &[("CLOAKD_SERVER__ALLOW_INSECURE", "true")]);
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut warned = false;
    let mut listening = false;
    while !(warned && listening) {
        let Ok(line) = lines_rx.recv_timeout(Duration::from_secs(30)) else {
            break;
        };
        warned |= line.contains("WARN") && line.contains("server.allow_insecure = true");
        listening |= line.contains("cloakd listening");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert!(warned, "no warning about insecure operation");
    assert!(listening, "daemon did not start");
}

#[test]
fn hash_token_prints_the_line_to_paste() {
    let mut child = bin()
        .args(["auth", "hash-token"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"test\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "token_sha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n"
    );
    let empty = bin()
        .args(["auth", "hash-token"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!empty.status.success());
}
