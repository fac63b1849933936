//! The GEO_IND model against the real daemon: answered at once, alone, with a reported point and an
//! area of retrieval; the provider sees the reported point, never the true one, and its answer is
//! routed back; epsilon outside the configured bounds is refused naming the field; a REQUESTS request
//! with a fallback level is answered under GEO_IND instead of expiring; `default_model = geo-ind`
//! serves requests that leave the model unset.
use cloakd::config::CloakModel as ConfigModel;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{CloakModel, Cloaked, LbsAnswer, LocationRequest};
use tonic::Code;

use crate::support::{
    MobileClient, TestDaemon, config_with, next_cloaked, request_at, subscribe_provider,
};

fn geo_ind(user: &str, request_no: u64, epsilon_per_km: Option<f64>) -> LocationRequest {
    LocationRequest {
        model: Some(CloakModel::GeoInd as i32),
        epsilon_per_km,
        ..request_at(user, request_no, 0.0, 2)
    }
}

async fn cloaked(client: &mut MobileClient, request_no: u64) -> Cloaked {
    let event = client.next_event(10).await;
    assert_eq!(event.request_no, request_no);
    match event.outcome {
        Some(Outcome::Cloaked(c)) => c,
        other => panic!("request {request_no}: expected Cloaked, got {other:?}"),
    }
}

/// The answer of one GEO_IND draw at 5 per km from the true position `truth`.
fn check_answer(c: &Cloaked, truth: (f64, f64)) {
    assert_eq!(c.group_size, 1, "{c:?}");
    assert_eq!(c.t_start_ms, c.t_end_ms);
    let reported = c.reported.expect("reported point");
    assert_ne!(
        (reported.lat, reported.lon),
        truth,
        "the true point reported"
    );
    // With a privacy budget (the default) answers may be reused, so each circle is drawn at
    // √0.95 = 0.97468: the radius of Gamma(2, 1/eps) there at eps = 5/km is 5.5566 / 5 km = 1111.3 m,
    // plus the grid diagonal (1.4 m).
    assert!(
        (c.retrieval_radius_m - 1112.7).abs() < 5.0,
        "{}",
        c.retrieval_radius_m
    );
    let b = c.r#box.expect("box");
    assert!(
        b.min_lat < reported.lat && reported.lat < b.max_lat,
        "{b:?}"
    );
    assert!(
        b.min_lon < reported.lon && reported.lon < b.max_lon,
        "{b:?}"
    );
    let half_height_m = (b.max_lat - b.min_lat) / 2.0 * 111_195.0;
    assert!((half_height_m - c.retrieval_radius_m).abs() < 2.0, "{b:?}");
    // Every GEO_IND answer says what is left of the user's budget (500 per km by default), after
    // this draw's charge.
    let left = c.budget_left.expect("budget_left on a GEO_IND answer");
    assert!((0.0..500.0).contains(&left), "budget_left {left}");
}

#[tokio::test]
async fn geo_ind_is_answered_at_once_alone_and_the_provider_sees_only_the_reported_point() {
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let request = geo_ind("a", 1, Some(5.0));
    let truth = (request.lat, request.lon);
    a.send(request).await;
    let answer = cloaked(&mut a, 1).await;
    check_answer(&answer, truth);

    let seen = next_cloaked(&mut provider, 10).await;
    assert_eq!(seen.pseudonym, answer.pseudonym);
    assert_eq!(seen.reported, answer.reported);
    assert_eq!(seen.retrieval_radius_m, answer.retrieval_radius_m);
    assert_eq!(seen.r#box, answer.r#box);
    assert_eq!(seen.payload, b"query from a #1".to_vec());
    // The unset default level (5 per km) gives the same radius (another user at the same spot: a
    // second request of "a" from there may reuse its last report, with a wider area; see
    // location::geo_budget).
    a.send(geo_ind("b", 2, None)).await;
    let second = cloaked(&mut a, 2).await;
    check_answer(&second, truth);
    assert_ne!(
        second.pseudonym, answer.pseudonym,
        "pseudonyms are one-time"
    );
    assert_eq!(
        next_cloaked(&mut provider, 10).await.pseudonym,
        second.pseudonym
    );

    // The provider's answer is routed back to the client.
    LbsGatewayClient::new(daemon.channel().await)
        .answer(tokio_stream::iter(vec![LbsAnswer {
            pseudonym: seen.pseudonym,
            payload: b"cafe".to_vec(),
            ack: false,
        }]))
        .await
        .unwrap();
    let event = a.next_event(10).await;
    assert_eq!(event.request_no, 1);
    let Some(Outcome::Reply(reply)) = event.outcome else {
        panic!("expected the reply, got {event:?}");
    };
    assert_eq!(reply.payload, b"cafe".to_vec());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn levels_outside_the_bounds_are_refused_naming_the_field() {
    let daemon = TestDaemon::start_default().await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut fallback_too_low = request_at("a", 3, 0.0, 2);
    fallback_too_low.fallback_epsilon_per_km = Some(0.01);
    let mut epsilon_on_requests = request_at("a", 4, 0.0, 2);
    epsilon_on_requests.epsilon_per_km = Some(5.0);
    let cases = [
        (
            geo_ind("a", 1, Some(500.0)),
            "epsilon_per_km",
            "max_epsilon_per_km",
        ),
        (
            geo_ind("a", 2, Some(f64::NAN)),
            "epsilon_per_km",
            "min_epsilon_per_km",
        ),
        (
            fallback_too_low,
            "fallback_epsilon_per_km",
            "min_epsilon_per_km",
        ),
        (
            epsilon_on_requests,
            "epsilon_per_km",
            "only used under GEO_IND",
        ),
    ];
    for (request, field, rule) in cases {
        let no = request.request_no;
        a.send(request).await;
        let event = a.next_event(10).await;
        assert_eq!(event.request_no, no);
        let Some(Outcome::Rejected(r)) = event.outcome else {
            panic!("request {no}: expected Rejected, got {event:?}");
        };
        assert_eq!(r.code, Code::InvalidArgument as i32, "{r:?}");
        assert_eq!(r.field, field, "{r:?}");
        assert!(r.reason.contains(rule), "{r:?}");
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_with_a_fallback_is_answered_under_geo_ind_instead_of_expiring() {
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut lonely = request_at("a", 7, 0.0, 2);
    lonely.dt_ms = Some(300);
    lonely.fallback_epsilon_per_km = Some(5.0);
    let truth = (lonely.lat, lonely.lon);
    a.send(lonely).await;
    let answer = cloaked(&mut a, 7).await;
    check_answer(&answer, truth);
    let seen = next_cloaked(&mut provider, 10).await;
    assert_eq!(seen.pseudonym, answer.pseudonym);
    assert_eq!(seen.reported, answer.reported);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn default_model_geo_ind_serves_requests_without_a_model() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.default_model = ConfigModel::GeoInd;
    }))
    .await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let request = request_at("a", 1, 0.0, 2);
    let truth = (request.lat, request.lon);
    a.send(request).await;
    check_answer(&cloaked(&mut a, 1).await, truth);
    daemon.shutdown().await.unwrap();
}

/// A second request from the same spot is answered with the first report (the reuse test passes
/// unless its noise exceeds the 20 km threshold: probability e^(-20)/2), charged only the test's
/// epsilon, and its area of retrieval is wide enough that a reuse is answered for a position
/// outside it with probability at most α_r = 1 − √0.95: 20 km + 1 km · ln(0.5 / α_r).
#[tokio::test]
async fn a_reused_answer_keeps_the_confidence_of_its_area_of_retrieval() {
    let daemon = TestDaemon::start(config_with(|c| {
        let budget = c
            .location
            .geo_ind
            .budget
            .as_mut()
            .expect("a budget by default");
        budget.predictive.test_epsilon_per_km = 1.0;
        budget.predictive.threshold_m = 20_000.0;
    }))
    .await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let request = geo_ind("a", 1, Some(5.0));
    let truth = (request.lat, request.lon);
    a.send(request).await;
    let first = cloaked(&mut a, 1).await;
    check_answer(&first, truth);
    a.send(geo_ind("a", 2, Some(5.0))).await;
    let second = cloaked(&mut a, 2).await;
    assert_eq!(second.reported, first.reported, "the last report reused");
    let expected = 20_000.0 + 1_000.0 * (0.5 / (1.0 - 0.95f64.sqrt())).ln();
    assert!(
        (second.retrieval_radius_m - expected).abs() < 1e-6,
        "{} against {expected}",
        second.retrieval_radius_m
    );
    let spent = first.budget_left.unwrap() - second.budget_left.unwrap();
    assert!(
        (spent - 1.0).abs() < 1e-9,
        "the test's epsilon only: {spent}"
    );
    daemon.shutdown().await.unwrap();
}
