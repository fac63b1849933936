//! `cloakd config check FILE` and `cloakd config default`: validate a configuration before a start or
//! a SIGHUP reload, and print the embedded defaults.
//!
//! `check` applies exactly what `cloakd serve --config FILE` applies (embedded defaults, then FILE,
//! then `CLOAKD_*` environment variables), validates it with the same rules, and prints the effective
//! configuration as TOML with secrets redacted: token hashes, passwords and the paths of private keys
//! never reach a terminal or a CI log.
use std::path::PathBuf;

use clap::Subcommand;

use crate::config::{Config, DEFAULT_TOML};

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate FILE (with the CLOAKD_* environment applied, as `serve` would) and print the
    /// effective configuration, secrets redacted. Exits non-zero naming the key on any error.
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the embedded default configuration (config/default.toml), every key documented.
    Default,
}

/// What a redacted value is printed as.
pub const REDACTED: &str = "<redacted>";

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    match args.command {
        ConfigCommand::Default => {
            print!("{DEFAULT_TOML}");
            Ok(())
        }
        ConfigCommand::Check { file } => {
            print!("{}", check(&file, std::env::vars())?);
            Ok(())
        }
    }
}

/// Validates `file` over the defaults and `env`; returns the effective configuration as TOML.
pub fn check(
    file: &std::path::Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<String> {
    let mut document = Config::load_document(Some(file), env)?;
    Config::from_document(document.clone())?;
    redact(&mut document);
    let body = toml::to_string(&document)?;
    Ok(format!(
        "# {}: valid. Effective configuration (defaults, then this file, then CLOAKD_* variables);\n# secrets are shown as \"{REDACTED}\".\n{body}",
        file.display()
    ))
}

/// Whether a key's value is a secret (or points at one) and must not be printed.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "token",
        "sha256",
        "secret",
        "password",
        "credential",
        "private",
    ]
    .iter()
    .any(|word| key.contains(word))
        || key == "key"
        || key.ends_with("_key")
        || key.starts_with("key_")
        || key.contains("_key_")
}

/// Replaces every secret value in `table` (recursively, arrays of tables included).
pub fn redact(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        if is_secret(key) && !value.is_table() && !is_array_of_tables(value) {
            *value = toml::Value::String(REDACTED.into());
            continue;
        }
        redact_value(value);
    }
}

fn is_array_of_tables(value: &toml::Value) -> bool {
    value
        .as_array()
        .is_some_and(|items| !items.is_empty() && items.iter().all(toml::Value::is_table))
}

fn redact_value(value: &mut toml::Value) {
    match value {
        toml::Value::Table(table) => redact(table),
        toml::Value::Array(items) => items.iter_mut().for_each(redact_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_the_rest_is_kept() {
        let mut doc: toml::Table = toml::from_str(
            r#"
            [server]
            listen = "0.0.0.0:7443"
            [server.tls]
            cert_file = "/etc/cloakd/tls.crt"
            key_file = "/etc/cloakd/tls.key"
            [[auth.tokens]]
            principal = "shop-1"
            sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
            [auth]
            bootstrap_token = "s3cret"
            "#,
        )
        .unwrap();
        redact(&mut doc);
        let text = toml::to_string(&doc).unwrap();
        for secret in ["9f86d081", "s3cret", "tls.key"] {
            assert!(!text.contains(secret), "{secret} printed:\n{text}");
        }
        for kept in ["0.0.0.0:7443", "tls.crt", "shop-1"] {
            assert!(text.contains(kept), "{kept} lost:\n{text}");
        }
    }

    #[test]
    fn check_prints_the_effective_configuration_or_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[location]\ndefault_k = 7\n").unwrap();
        let env = [("CLOAKD_LOCATION__MAX_K".to_string(), "20".to_string())];
        let printed = check(&path, env).unwrap();
        let doc: toml::Table = toml::from_str(&printed).unwrap();
        assert_eq!(doc["location"]["default_k"].as_integer(), Some(7));
        assert_eq!(doc["location"]["max_k"].as_integer(), Some(20));
        assert_eq!(doc["location"]["min_k"].as_integer(), Some(2));
        std::fs::write(&path, "[location]\ndefault_k = 700\n").unwrap();
        let err = check(&path, []).unwrap_err().to_string();
        assert!(err.starts_with("location.default_k"), "{err}");
    }
}
