//! The daemon: wires the configuration, the engines' services, gRPC health checking and server
//! reflection onto one listener, the Prometheus metrics onto their own (`telemetry.metrics_listen`),
//! the analyst's workbench onto its own (`ui.listen`, [`crate::workbench`]), and shuts down
//! gracefully.
//!
//! [`serve`] is a library function (tests call it on `127.0.0.1:0`); [`run`] adds the listener and
//! SIGINT/SIGTERM handling for `cloakd serve`. Every service sits behind the one [`AuthLayer`]
//! (health excepted), and with `[server.tls]` behind TLS. One SIGHUP handler reloads the
//! configuration the daemon was started with ([`crate::reload`]; [`serve_reloadable`]) and then the
//! TLS certificates.
//! On a non-loopback address the daemon refuses to start without TLS and `auth.required = true`
//! unless `server.allow_insecure = true`.
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{AuthLayer, Authenticator};
use crate::config::Config;
use crate::reload::{ConfigSource, Reloader};
use crate::service::location::LocationServices;
use crate::service::transactions::TransactionServices;

/// Serves every cloakd service on `listener` until `shutdown` completes, then drains: health turns
/// NOT_SERVING, the engines' actors finish (pending location requests are told they were not
/// forwarded), and open streams get `server.shutdown_grace_ms` to end before the server stops.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_inner(config, None, listener, shutdown, None).await
}

/// The addresses the daemon bound besides its gRPC listener (what a test of
/// `ui.listen = "127.0.0.1:0"` or `telemetry.metrics_listen = "127.0.0.1:0"` connects to).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bound {
    /// The workbench's listener (`ui.listen`), when on.
    pub ui: Option<SocketAddr>,
    /// The metrics listener (`telemetry.metrics_listen`), when on.
    pub metrics: Option<SocketAddr>,
}

/// [`serve`], telling `bound` the addresses of the other listeners once they are bound (before
/// anything is served on them); dropped unsent if the daemon fails before.
pub async fn serve_reporting(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    bound: tokio::sync::oneshot::Sender<Bound>,
) -> anyhow::Result<()> {
    serve_inner(config, None, listener, shutdown, Some(bound)).await
}

/// [`serve`], and SIGHUP reloads the configuration from `reload.source` (see [`crate::reload`]):
/// what `cloakd serve` runs. `config` is what `reload.running` validates to.
pub async fn serve_reloadable(
    config: Config,
    reload: Reloadable,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_inner(config, Some(reload), listener, shutdown, None).await
}

async fn serve_inner(
    config: Config,
    reload: Option<Reloadable>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    bound: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> anyhow::Result<()> {
    let addr = listener
        .local_addr()
        .context("listener has no local address")?;
    check_exposure(&config, addr)?;
    let tls = match &config.server.tls {
        Some(files) => Some(crate::tls::TlsReloader::new(files.clone())?),
        None => None,
    };
    let auth = AuthLayer::new(std::sync::Arc::new(Authenticator::new(&config.auth)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut bound_addrs = Bound::default();
    let metrics = match config.telemetry.metrics_listen {
        Some(metrics_addr) => {
            crate::telemetry::handle();
            let metrics_listener = crate::telemetry::bind(metrics_addr).await?;
            bound_addrs.metrics = metrics_listener.local_addr().ok();
            Some(tokio::spawn(crate::telemetry::serve(
                metrics_listener,
                stop_rx.clone(),
            )))
        }
        None => None,
    };
    let table_jobs = crate::jobs::TableJobs::new(&config.tables);
    let ui = match config.ui.listen {
        Some(ui_addr) => {
            let ui_listener = crate::workbench::bind(ui_addr).await?;
            bound_addrs.ui = ui_listener.local_addr().ok();
            let workbench = crate::workbench::Workbench::new(
                ui_listener.local_addr()?,
                &config.ui,
                &config.tables,
                std::sync::Arc::new(Authenticator::new(&config.auth)),
                table_jobs.clone(),
            );
            Some(tokio::spawn(crate::workbench::serve(
                ui_listener,
                workbench,
                stop_rx.clone(),
            )))
        }
        None => None,
    };
    if let Some(bound) = bound {
        let _ = bound.send(bound_addrs);
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    // Reflection in both versions: grpcurl and grpcui ask v1, Python's grpcio-reflection and older
    // tools ask v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .context("building the reflection service (v1)")?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .context("building the reflection service (v1alpha)")?;

    // With [cluster] nats_url set, connect before serving anything: a replica that cannot reach
    // NATS refuses to start instead of serving alone.
    let cluster = crate::cluster::connect(&config.cluster)
        .await
        .context("connecting to the NATS cluster ([cluster])")?;
    // One running replica per node id: a second one with the same cluster.node_id stops here.
    let registration = match &cluster {
        Some(cluster) => Some(
            cluster
                .register()
                .await
                .context("registering this replica's cluster.node_id on NATS")?,
        ),
        None => None,
    };
    let max_message_bytes = config.server.max_message_bytes;
    // The privacy budget of GEO_IND answers: opened before any request is taken.
    let ledger = match config.location.geo_ind.budget {
        None => None,
        Some(budget) => Some(
            crate::ledger::open(
                crate::ledger::Policy {
                    budget: budget.budget,
                    window_ms: budget.window_ms,
                },
                crate::ledger::Batching {
                    queue: budget.ledger_queue,
                    max_batch: budget.ledger_max_batch,
                },
                &config.transactions.data_dir,
                cluster.as_ref(),
            )
            .await
            .context("opening the privacy budget ledger (location.geo_ind.budget)")?,
        ),
    };
    let location = match &cluster {
        Some(cluster) => LocationServices::start_clustered(
            config.location.clone(),
            stop_rx.clone(),
            cluster,
            ledger,
        )
        .await
        .context("joining the location cells of the cluster ([cluster])")?,
        None => LocationServices::start(config.location.clone(), stop_rx.clone(), ledger),
    }
    .with_max_message_bytes(max_message_bytes);
    let transactions = match &cluster {
        None => TransactionServices::start(config.transactions.clone(), stop_rx.clone())
            .await
            .context("opening the transaction store (transactions.data_dir)")?,
        Some(nats) => {
            TransactionServices::start_cluster(config.transactions.clone(), nats, stop_rx.clone())
                .await
                .context("opening the transaction streams on NATS JetStream ([cluster])")?
        }
    };
    let transactions = transactions.with_max_message_bytes(max_message_bytes);
    let table = crate::service::anonymizer::table_anonymizer(
        &config.tables,
        table_jobs.clone(),
        max_message_bytes,
    );
    let evaluator = crate::service::evaluation::table_evaluator(&config.tables, table_jobs.clone());
    // Registered before the daemon says it listens, so a SIGHUP from then on never kills it.
    let reloader = reload.map(|reload| {
        Reloader::new(reload.source, reload.running)
            .with_target(Arc::new(location.reload_target()))
            .with_target(Arc::new(transactions.reload_target()))
    });
    let hangups = tokio::spawn(on_hangup(reloader, tls.clone(), stop_rx.clone())?);
    // Health names every service ("" is the daemon as a whole).
    let served: Vec<&'static str> = std::iter::once("")
        .chain(crate::auth::SERVED.iter().map(|(name, _)| *name))
        .collect();
    for name in &served {
        health
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }

    let grace = config.server.shutdown_grace;
    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = {
        let health = health.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            for name in &served {
                health
                    .set_service_status(*name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
            let _ = stop_tx.send(true);
            let _ = server_stop_tx.send(());
        }
    };
    tokio::spawn(drain);

    tracing::info!(
        %addr,
        tls = tls.is_some(),
        cluster = cluster.as_ref().map(|c| c.node_id.as_str()),
        auth_required = config.auth.required,
        "cloakd listening"
    );
    let server_cfg = &config.server;
    let connections = crate::connections::Connections::new();
    let incoming = crate::connections::accept(
        listener,
        crate::connections::AcceptLimits {
            max_connections: server_cfg.max_connections,
            handshake_timeout: server_cfg.handshake_timeout,
            idle_timeout: server_cfg.idle_connection_timeout,
        },
        std::sync::Arc::clone(&connections),
        stop_rx.clone(),
    );
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(server_cfg.max_concurrent_streams)
        // Fixed windows rather than BDP-adapted ones: h2's budget for small DATA frames is half the
        // connection window, so a large fixed window keeps clients that pipeline small messages
        // (request streams are always drained) far from GOAWAY ENHANCE_YOUR_CALM.
        .initial_connection_window_size(server_cfg.http2_connection_window_bytes)
        .initial_stream_window_size(server_cfg.http2_stream_window_bytes)
        .http2_keepalive_interval(Some(server_cfg.keepalive_interval))
        .http2_keepalive_timeout(Some(server_cfg.keepalive_timeout))
        .http2_max_pending_accept_reset_streams(Some(
            server_cfg.http2_max_pending_accept_reset_streams,
        ))
        .http2_max_local_error_reset_streams(Some(server_cfg.http2_max_local_error_reset_streams))
        // Outermost first: the metrics layer also counts calls the auth layer refuses.
        .layer(crate::telemetry::grpc_layer::GrpcMetricsLayer::new(&[
            crate::proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]))
        .layer(auth)
        // Counts each connection's open calls, for server.idle_connection_timeout_ms.
        .layer(crate::connections::StreamTrackingLayer::new(connections))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(location.broker_server())
        .add_service(location.gateway_server())
        .add_service(transactions.ingest_server())
        .add_service(transactions.feed_server())
        .add_service(table)
        .add_service(evaluator);
    let stopped = async move {
        let _ = server_stop_rx.await;
    };
    let server: std::pin::Pin<
        Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match &tls {
        Some(tls) => Box::pin(router.serve_with_incoming_shutdown(
            tls.incoming(incoming, server_cfg.handshake_timeout),
            stopped,
        )),
        None => Box::pin(router.serve_with_incoming_shutdown(incoming, stopped)),
    };
    tokio::pin!(server);
    // Wait for the server; once shutdown has begun, give open streams the grace period only. The
    // server also ends on the stop signal, often before this select sees the signal: either way
    // the shutdown goes on below, so the node id registration is always released.
    let mut stopping = stop_rx.clone();
    let ended = tokio::select! {
        result = &mut server => Some(result),
        _ = stopping.wait_for(|stop| *stop) => None,
    };
    let served = match ended {
        Some(result) if !*stop_rx.borrow() => {
            if let Some(registration) = registration {
                registration.release().await;
            }
            return result.context("gRPC server failed");
        }
        Some(result) => Ok(result),
        None => tokio::time::timeout(grace, &mut server).await,
    };
    hangups.abort();
    if let Some(metrics) = metrics {
        match tokio::time::timeout(grace, metrics).await {
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "metrics listener failed"),
            Ok(_) => {}
            Err(_) => tracing::warn!("metrics listener still open after server.shutdown_grace_ms"),
        }
    }
    if let Some(ui) = ui {
        match tokio::time::timeout(grace, ui).await {
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "workbench listener failed"),
            Ok(_) => {}
            Err(_) => {
                tracing::warn!("workbench listener still open after server.shutdown_grace_ms")
            }
        }
    }
    if let Some(registration) = registration {
        registration.release().await;
    }
    match served {
        Ok(result) => result.context("gRPC server failed"),
        Err(_) => {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "streams still open after server.shutdown_grace_ms; closing them"
            );
            Ok(())
        }
    }
}

/// Refuses a non-loopback address unless TLS is configured and authentication required, or the
/// operator allowed insecure operation (then warns).
pub fn check_exposure(config: &Config, addr: SocketAddr) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    let mut missing = Vec::new();
    if config.server.tls.is_none() {
        missing.push("[server.tls] is not configured");
    }
    if !config.auth.required {
        missing.push("auth.required is false");
    }
    if missing.is_empty() {
        return Ok(());
    }
    if config.server.allow_insecure {
        tracing::warn!(
            %addr,
            "serving on a non-loopback address insecurely ({}; server.allow_insecure = true)",
            missing.join(", ")
        );
        return Ok(());
    }
    anyhow::bail!(
        "refusing to listen on non-loopback address {addr}: {}. Configure [server.tls] and set auth.required = true, or set server.allow_insecure = true to serve insecurely",
        missing.join(" and ")
    )
}

/// Where the running configuration came from and what it was, so SIGHUP can reload it.
#[derive(Debug, Clone)]
pub struct Reloadable {
    pub source: ConfigSource,
    /// The merged document the daemon runs on.
    pub running: toml::Table,
}

/// The SIGHUP handler: on every SIGHUP, reloads the configuration (if the daemon has a
/// [`Reloader`]) and then the TLS certificates (if configured), until shutdown. The signal is
/// registered before this returns.
fn on_hangup(
    mut reloader: Option<Reloader>,
    tls: Option<crate::tls::TlsReloader>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot listen for SIGHUP (configuration and certificate reload)")?;
    Ok(async move {
        loop {
            #[cfg(unix)]
            let hangup = hangups.recv();
            #[cfg(not(unix))]
            let hangup = std::future::pending::<Option<()>>();
            tokio::select! {
                received = hangup => if received.is_none() { return },
                _ = stop.wait_for(|stop| *stop) => return,
            }
            tracing::info!("SIGHUP: reloading");
            if let Some(reloader) = reloader.as_mut() {
                reloader.reload();
            }
            if let Some(tls) = &tls {
                reload_certificates(tls);
            }
        }
    })
}

/// Re-reads `[server.tls]`; what SIGHUP does. A failure is logged and the old certificates stay.
pub fn reload_certificates(tls: &crate::tls::TlsReloader) {
    match tls.reload() {
        Ok(()) => tracing::info!("TLS certificates reloaded"),
        Err(err) => {
            tracing::error!(%err, "TLS certificates not reloaded; the previous ones stay in force")
        }
    }
}

/// Binds `server.listen` and serves until SIGINT or SIGTERM; SIGHUP reloads `reload`'s source.
pub async fn run(config: Config, reload: Reloadable) -> anyhow::Result<()> {
    let listen: SocketAddr = config.server.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (server.listen)"))?;
    serve_reloadable(config, reload, listener, shutdown_signal()).await
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
