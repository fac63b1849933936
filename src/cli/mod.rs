//! Command line: `cloakd serve`, `cloakd table ...`, `cloakd transactions ...`, `cloakd config ...`,
//! `cloakd store ...`, `cloakd poi generate`, `cloakd auth`. The load tools (`simulate`, `soak`,
//! `publish-load`) and the reference provider's process (`provider`) are commands of the binary
//! alone (`src/main.rs` declares them and adds them to these), not of the library.
use clap::Subcommand;

pub mod config;
pub mod poi;
pub mod store;
pub mod table;
pub mod transactions;

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line (timestamp, level, target, message, fields), for log collectors.
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CLOAKD_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Which events to log, in `RUST_LOG` syntax: a level (`info`), or per-module directives
    /// (`warn,cloakd::service=debug`). Defaults to `RUST_LOG`, else `info`.
    #[arg(long, global = true, value_name = "FILTER", env = "RUST_LOG")]
    pub log_filter: Option<String>,
}

// One value per process, parsed once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (on the embedded defaults unless --config / --listen say otherwise).
    Serve(ServeArgs),
    /// Batch table anonymization: `cloakd table anonymize JOB.toml --output OUT.csv`.
    Table(table::TableArgs),
    /// Batch anonymization of set-valued records (personalized rho-uncertainty).
    Transactions(transactions::TransactionsArgs),
    /// Configuration: `cloakd config check FILE` (validate, print the effective configuration with
    /// secrets redacted) and `cloakd config default` (print the embedded defaults).
    Config(config::ConfigArgs),
    /// Points of interest: `cloakd poi generate` writes a seeded synthetic POI file along a road network.
    Poi(poi::PoiArgs),
    /// Credentials: `cloakd auth hash-token < token-file` prints the `token_sha256` line to paste.
    Auth(AuthArgs),
    /// The embedded transaction store: `cloakd store check DIR` (read-only) and `cloakd store
    /// repair DIR [--dry-run]` (explicit, with a backup).
    Store(store::StoreArgs),
}

#[derive(Debug, clap::Args)]
pub struct AuthArgs {
    #[command(subcommand)]
    pub command: AuthCommand,
}

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Reads a token on stdin (one line; surrounding whitespace is ignored) and prints
    /// `token_sha256 = "<hex sha256>"` for an `[[auth.principals]]` entry. The token is never echoed.
    HashToken,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A TOML file whose keys override the embedded defaults (see config/default.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on, overriding server.listen.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Turn on the analyst's workbench in the browser on this (loopback) address, overriding
    /// ui.listen: `cloakd serve --ui 127.0.0.1:8080`, then open http://127.0.0.1:8080/.
    #[arg(long, value_name = "ADDR")]
    pub ui: Option<std::net::SocketAddr>,
}

/// Logging to stderr in the chosen format, filtered by `--log-filter` / `RUST_LOG` (default `info`).
/// A filter that does not parse is an error naming the flag, not a silent fallback.
/// Whether text logs carry ANSI colours: only on a terminal, and never when `NO_COLOR` is set to a
/// non-empty value (no-color.org), so a log file or a pipe holds plain text.
pub fn colour_logs(no_color: Option<std::ffi::OsString>, stderr_is_terminal: bool) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

pub fn init_tracing(args: &LogArgs) -> anyhow::Result<()> {
    let directives = args.log_filter.as_deref().unwrap_or("info");
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(directives)
        .map_err(|e| anyhow::anyhow!("--log-filter / RUST_LOG {directives:?}: {e}"))?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_logs(
            std::env::var_os("NO_COLOR"),
            std::io::stderr().is_terminal(),
        ))
        .with_writer(std::io::stderr);
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    Ok(())
}

/// Runs one of the library's commands.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve(args),
        Command::Table(args) => table::run(args),
        Command::Transactions(args) => transactions::run(args),
        Command::Config(args) => config::run(args),
        Command::Poi(args) => poi::run(args),
        Command::Store(args) => {
            if store::run(args, &mut std::io::stdout().lock())? {
                Ok(())
            } else {
                anyhow::bail!("the data directory has problems (listed above)")
            }
        }
        Command::Auth(args) => match args.command {
            AuthCommand::HashToken => hash_token(std::io::stdin().lock(), std::io::stdout().lock()),
        },
    }
}

fn hash_token(input: impl std::io::Read, mut output: impl std::io::Write) -> anyhow::Result<()> {
    let mut token = String::new();
    std::io::Read::read_to_string(
        &mut crate::lines::BoundedLines::new(input, crate::lines::Records::Lines),
        &mut token,
    )
    .map_err(|e| anyhow::anyhow!("cannot read the token from stdin: {e}"))?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!(
            "no token on stdin (pipe the token in: `cloakd auth hash-token < token-file`)"
        );
    }
    if token.contains(char::is_whitespace) {
        anyhow::bail!("the token must be one word without whitespace");
    }
    writeln!(
        output,
        "token_sha256 = \"{}\"",
        crate::auth::hash_token(token)
    )?;
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // The same sources, read the same way, again on every SIGHUP.
    let source = crate::reload::ConfigSource::of_process(args.config, args.listen, args.ui);
    let (running, config) = source.load()?;
    let reload = crate::daemon::Reloadable { source, running };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cloakd")
        .build()?;
    let grace = config.server.shutdown_grace;
    let result = runtime.block_on(crate::daemon::run(config, reload));
    // A window still being anonymized on a blocking thread is not waited for longer than the grace
    // period: it was not released, so it is redone after the restart (same seed, same release).
    runtime.shutdown_timeout(grace);
    result
}
