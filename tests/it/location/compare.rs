//! `cloakd simulate --compare` (the yardstick of the cloaking models) against the real daemon: a tiny
//! slice of the Oldenburg trace replayed under REQUESTS, PRESENCE and GEO_IND at two epsilons, with
//! the reference POI provider answering; the JSON report must have one run per model (and epsilon),
//! each with answers, a positive quality loss, box area and adversary error; every refined POI answer
//! of a box is exact (a box holds the true point), and under GEO_IND every request is answered, the
//! exact answer is in at least the confidence's share of the lists of the areas of retrieval, and a
//! smaller epsilon costs more quality and leaves the adversary further off; the chart must name the
//! models.
use crate::support::{TestDaemon, repo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_reports_every_model_side_by_side() {
    let daemon = TestDaemon::start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("compare.json");
    let chart = dir.path().join("compare.svg");
    let pois = dir.path().join("pois.csv");
    // A grid of cafes over the slice's area, every 400 m or so.
    let mut csv = String::from("id,lat,lon,category,name\n");
    for i in 0..40 {
        for j in 0..40 {
            let (lat, lon) = (53.07 + 0.0036 * f64::from(i), 8.11 + 0.006 * f64::from(j));
            csv.push_str(&format!("c{i}-{j},{lat},{lon},cafe,\n"));
        }
    }
    std::fs::write(&pois, csv).unwrap();
    let trace = repo().join("tests/data/oldenburg_60s.csv.gz");
    let args: Vec<String> = [
        "simulate",
        "--addr",
        &daemon.endpoint(),
        "--trace",
        trace.to_str().unwrap(),
        "--limit",
        "300",
        "--rate",
        "300",
        "--dt-min-ms",
        "2000",
        "--dt-max-ms",
        "2000",
        "--k-min",
        "2",
        "--k-max",
        "3",
        "--drain-secs",
        "5",
        "--compare",
        "requests,presence,geo-ind",
        "--epsilons",
        "5,20",
        "--pois",
        pois.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::support::cloakd(&args)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| presence |"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["requests", "presence", "geo-ind eps=5", "geo-ind eps=20"]
    );
    let f = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap_or(f64::NAN);
    for r in runs {
        assert_eq!(r["requests"], 300, "{r}");
        assert_eq!(r["budget_exhausted"], 0, "{r}");
        assert!(f(r, "success_rate") > 0.0, "{r}");
        assert!(f(r, "quality_loss_m") > 0.0, "{r}");
        assert!(f(r, "adversary_error_m") > 0.0, "{r}");
        assert!(r["adversary_answers"].as_u64().unwrap() > 0, "{r}");
        if r["model"] == "geo-ind" {
            // Answered at once, alone; the area of retrieval holds the true point with probability
            // 0.95 (the default confidence), so its lists give the exact answer at least that often
            // (a margin for 300 draws: 3 standard deviations of the share is 0.038).
            assert_eq!(f(r, "success_rate"), 1.0, "{r}");
            assert_eq!(f(r, "poi_refused_share"), 0.0, "{r}");
            assert!(f(r, "poi_exact_share") >= 0.95 - 0.04, "{r}");
        } else {
            assert!(f(r, "box_area_km2") > 0.0, "{r}");
            // The box holds the client's point: refining its list always gives the exact answer.
            assert_eq!(f(r, "poi_exact_share"), 1.0, "{r}");
        }
    }
    // Less epsilon, more noise: a larger quality loss and a larger adversary error.
    assert!(f(&runs[2], "quality_loss_m") > f(&runs[3], "quality_loss_m"));
    assert!(f(&runs[2], "adversary_error_m") > f(&runs[3], "adversary_error_m"));
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("geo-ind"), "the chart names geo-ind");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("presence") && svg.contains("requests"));
}
