//! The daemon: wires the configuration, the engines' services, gRPC health checking and server
//! reflection onto one listener, and shuts down gracefully.
//!
//! [`serve`] is a library function (tests call it on `127.0.0.1:0`); [`run`] adds the listener and
//! SIGINT/SIGTERM handling for `cloakd serve`.
use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::server::NamedService;

use crate::config::Config;
use crate::proto::lbs_gateway_server::LbsGatewayServer;
use crate::proto::location_broker_server::LocationBrokerServer;
use crate::proto::release_feed_server::ReleaseFeedServer;
use crate::proto::table_anonymizer_server::TableAnonymizerServer;
use crate::proto::transaction_ingest_server::TransactionIngestServer;
use crate::service::location::LocationServices;
use crate::service::table::TableService;
use crate::service::transactions::TransactionServices;

/// Serves every cloakd service on `listener` until `shutdown` completes, then drains: health turns
/// NOT_SERVING, the engines' actors finish (pending location requests are told they were not
/// forwarded), and open streams get `server.shutdown_grace_ms` to end before the server stops.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener
        .local_addr()
        .context("listener has no local address")?;
    let (stop_tx, stop_rx) = watch::channel(false);

    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;

    let max_message_bytes = config.server.max_message_bytes;
    let location = LocationServices::start(config.location.clone(), stop_rx.clone())
        .with_max_message_bytes(max_message_bytes);
    let transactions = TransactionServices::start(config.transactions.clone(), stop_rx.clone())
        .await
        .context("opening the transaction store (transactions.data_dir)")?;
    let transactions = transactions.with_max_message_bytes(max_message_bytes);
    let table_jobs = crate::service::table::table_jobs(&config.tables);
    let table = crate::service::table::table_anonymizer(
        &config.tables,
        table_jobs.clone(),
        max_message_bytes,
    );
    let evaluator = crate::service::evaluation::table_evaluator(&config.tables, table_jobs);
    // Health names every service ("" is the daemon as a whole).
    let served: Vec<&'static str> = vec![
        "",
        <LocationBrokerServer<LocationServices> as NamedService>::NAME,
        <LbsGatewayServer<LocationServices> as NamedService>::NAME,
        <TransactionIngestServer<TransactionServices> as NamedService>::NAME,
        <ReleaseFeedServer<TransactionServices> as NamedService>::NAME,
        <TableAnonymizerServer<TableService> as NamedService>::NAME,
        <crate::proto::table_evaluator_server::TableEvaluatorServer<
            crate::service::evaluation::Evaluator,
        > as NamedService>::NAME,
    ];
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

    tracing::info!(%addr, "cloakd listening");
    let server_cfg = &config.server;
    let incoming = crate::connections::accept(
        listener,
        server_cfg.max_connections,
        server_cfg.handshake_timeout,
        stop_rx.clone(),
    );
    let server = tonic::transport::Server::builder()
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
        .add_service(health_service)
        .add_service(reflection)
        .add_service(location.broker_server())
        .add_service(location.gateway_server())
        .add_service(transactions.ingest_server())
        .add_service(transactions.feed_server())
        .add_service(table)
        .add_service(evaluator)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = server_stop_rx.await;
        });
    tokio::pin!(server);
    // Wait for the server; once shutdown has begun, give open streams the grace period only.
    let mut stopping = stop_rx.clone();
    tokio::select! {
        result = &mut server => return result.context("gRPC server failed"),
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    match tokio::time::timeout(grace, &mut server).await {
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

/// Binds `listen` (or the configured address) and serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let listen: SocketAddr = config.server.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (server.listen)"))?;
    serve(config, listener, shutdown_signal()).await
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
