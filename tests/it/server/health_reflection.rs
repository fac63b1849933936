//! The daemon answers gRPC health checks and server reflection on its port, and shuts down gracefully.
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::TestDaemon;

#[tokio::test]
async fn health_reports_every_service_serving() {
    let daemon = TestDaemon::start_default().await;
    let mut health = HealthClient::new(daemon.channel().await);
    for service in [
        "",
        "cloakd.v1.LocationBroker",
        "cloakd.v1.LbsGateway",
        "cloakd.v1.TableAnonymizer",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "cloakd.v1.Nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let daemon = TestDaemon::start_default().await;
    let mut client = ServerReflectionClient::new(daemon.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "cloakd.v1.LocationBroker",
        "cloakd.v1.LbsGateway",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    drop(responses);
    daemon.shutdown().await.unwrap();
}

/// `grpc.reflection.v1alpha`, which Python's grpcio-reflection client and older grpcurl builds ask:
/// it lists the services and resolves a service to the file that defines it.
#[tokio::test]
async fn reflection_v1alpha_lists_and_resolves_the_services() {
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let daemon = TestDaemon::start_default().await;
    let mut client = ServerReflectionClient::new(daemon.channel().await);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("cloakd.v1.TransactionIngest".into()),
    ]
    .map(|message| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    });
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("v1alpha reflection is served")
        .into_inner();
    let listed = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("unexpected reflection response {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "cloakd.v1.LocationBroker",
        "cloakd.v1.TransactionIngest",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    let resolved = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = resolved.message_response else {
        panic!("unexpected reflection response {resolved:?}");
    };
    let file = <prost_types::FileDescriptorProto as prost::Message>::decode(
        files.file_descriptor_proto[0].as_slice(),
    )
    .unwrap();
    assert!(
        file.service.iter().any(|s| s.name() == "TransactionIngest"),
        "{:?}",
        file.name
    );
    drop(responses);
    daemon.shutdown().await.unwrap();
}
