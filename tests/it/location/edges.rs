//! The cloaking box keeps its promises at the edges (issue 21 item 5), against the real daemon:
//! tolerances below what padding needs are rejected naming the field and the limit; requests whose
//! tolerance box would pass latitude +-85 or the antimeridian are rejected naming lat/lon (boxes are
//! never clamped, wrapped or shifted); and every box forwarded lies in [-90, 90] x [-180, 180] with
//! each edge at least 2 m off every member's coordinate, also at the smallest tolerance and right
//! next to the served boundaries.
use cloakd::location::geo::METRES_PER_DEGREE_LAT;
use cloakd::location::padding::{MAX_ABS_LAT, MIN_PAD_M, MIN_TOLERANCE_M};
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{BoundingBox, LocationRequest};
use tonic::Code;

use crate::support::{MobileClient, TestDaemon, request_at, subscribe_provider};

fn at(user: &str, request_no: u64, lat: f64, lon: f64, d_m: f64) -> LocationRequest {
    LocationRequest {
        lat,
        lon,
        dx_m: Some(d_m),
        dy_m: Some(d_m),
        ..request_at(user, request_no, 0.0, 2)
    }
}

async fn rejected(client: &mut MobileClient, request_no: u64) -> (String, String) {
    let event = client.next_event(10).await;
    assert_eq!(event.request_no, request_no);
    let Some(Outcome::Rejected(r)) = event.outcome else {
        panic!("request {request_no}: expected Rejected, got {event:?}");
    };
    assert_eq!(r.code, Code::InvalidArgument as i32, "{r:?}");
    (r.field, r.reason)
}

async fn cloaked(client: &mut MobileClient) -> BoundingBox {
    let event = client.next_event(10).await;
    let Some(Outcome::Cloaked(c)) = event.outcome else {
        panic!("expected Cloaked, got {event:?}");
    };
    c.r#box.unwrap()
}

/// Every edge at least MIN_PAD_M (less a millimetre of rounding) from the point, east-west measured
/// at the point's latitude, and the box inside the world.
fn assert_margin(b: &BoundingBox, lat: f64, lon: f64) {
    assert!(b.min_lat >= -90.0 && b.max_lat <= 90.0, "{b:?}");
    assert!(b.min_lon >= -180.0 && b.max_lon <= 180.0, "{b:?}");
    let per_lon = METRES_PER_DEGREE_LAT * lat.to_radians().cos();
    let gaps = [
        (lat - b.min_lat) * METRES_PER_DEGREE_LAT,
        (b.max_lat - lat) * METRES_PER_DEGREE_LAT,
        (lon - b.min_lon) * per_lon,
        (b.max_lon - lon) * per_lon,
    ];
    for gap in gaps {
        assert!(gap >= MIN_PAD_M - 1e-3, "edge {gap} m from a member: {b:?}");
    }
}

#[tokio::test]
async fn tolerances_below_what_padding_needs_are_rejected_naming_the_limit() {
    let daemon = TestDaemon::start_default().await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let cases = [
        ("dx_m", Some(1e-9), Some(500.0)),
        ("dx_m", Some(5e-324), Some(500.0)),
        ("dx_m", Some(1.0), Some(500.0)),
        ("dy_m", Some(500.0), Some(MIN_TOLERANCE_M - 0.01)),
    ];
    for (no, (field, dx_m, dy_m)) in cases.into_iter().enumerate() {
        let mut request = request_at("edge", no as u64, 0.0, 2);
        request.dx_m = dx_m;
        request.dy_m = dy_m;
        client.send(request).await;
        let (named, reason) = rejected(&mut client, no as u64).await;
        assert_eq!(named, field, "{reason}");
        assert!(
            reason.contains(&format!("[{MIN_TOLERANCE_M}, ")),
            "the limit is not named: {reason}"
        );
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn poles_and_the_antimeridian_are_refused_not_clamped() {
    let daemon = TestDaemon::start_default().await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let cases = [
        // The observations: two users at the south pole, a pair near 89.9999 N, a pair at
        // the antimeridian.
        ("lat", -90.0, -170.0, 500.0),
        ("lat", -90.0, 10.0, 500.0),
        ("lat", 89.9999, 8.0, 500.0),
        ("lat", MAX_ABS_LAT, 8.0, MIN_TOLERANCE_M),
        ("lon", 53.0, 179.9999, 500.0),
        ("lon", 53.0, -179.9999, 500.0),
        ("lon", 0.0, 180.0, MIN_TOLERANCE_M),
    ];
    for (no, (field, lat, lon, d_m)) in cases.into_iter().enumerate() {
        client.send(at("edge", no as u64, lat, lon, d_m)).await;
        let (named, reason) = rejected(&mut client, no as u64).await;
        assert_eq!(named, field, "{reason}");
        if lat.fract() != 0.0 {
            assert!(
                !reason.contains(&format!("{lat}")),
                "echoes a position: {reason}"
            );
        }
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn boxes_keep_the_margin_at_the_smallest_tolerance_and_the_boundaries() {
    let daemon = TestDaemon::start_default().await;
    let _provider = subscribe_provider(daemon.channel().await, "poi").await;
    // Pairs 4 m apart (less than the grouping tolerance at 10 m: half of it), each at the least tolerance or
    // just inside the served world.
    let d = MIN_TOLERANCE_M;
    let edge_lat = MAX_ABS_LAT - 1.5 * d / METRES_PER_DEGREE_LAT;
    let spots = [
        (53.14, 8.21, d),
        (0.0, 0.0, d),
        (-33.9, 18.4, d),
        (edge_lat, 8.0, d),
        (-edge_lat, -120.0, d),
        (10.0, 180.0 - 2e-4, d),
        (-10.0, -180.0 + 2e-4, d),
        (53.14, 9.0, 3000.0),
    ];
    for (spot, (lat, lon, d_m)) in spots.into_iter().enumerate() {
        let east = 4.0 / (METRES_PER_DEGREE_LAT * f64::to_radians(lat).cos());
        let points = [(lat, lon - east / 2.0), (lat, lon + east / 2.0)];
        let mut clients = Vec::new();
        for (i, (lat, lon)) in points.iter().enumerate() {
            let client = MobileClient::connect(daemon.channel().await).await;
            client
                .send(at(&format!("s{spot}u{i}"), 1, *lat, *lon, d_m))
                .await;
            clients.push(client);
        }
        for (client, (lat, lon)) in clients.iter_mut().zip(points) {
            let b = cloaked(client).await;
            assert_margin(&b, lat, lon);
        }
    }
    daemon.shutdown().await.unwrap();
}
