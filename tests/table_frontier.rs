//! `cloakd table frontier`: a small sweep on a sample of Adult writes one `frontier.csv` row per
//! release with the documented columns, flags exactly the non-dominated releases as efficient, and
//! writes the three SVG plots.
use std::process::Command;

#[test]
fn frontier_writes_csv_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_cloakd"))
        .args(["table", "frontier", job, "--out"])
        .arg(dir.path())
        .args([
            "--k",
            "10,100",
            "--l",
            "3",
            "--t",
            "0.2",
            "--delta",
            "2.1",
            "--threads",
            "2",
            "--queries",
            "100",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("frontier.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "model,parameter,method,ploss,uloss,a_know,a_acc,query_error,seconds,efficient"
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    // 5 parameter values x 2 methods, minus any a parameter makes unsatisfiable on the sample.
    assert!(rows.len() >= 6 && rows.len() <= 10, "{text}");
    let points: Vec<(f64, f64, bool)> = rows
        .iter()
        .map(|r| {
            (
                r[3].parse().unwrap(),
                r[4].parse().unwrap(),
                r[9].parse().unwrap(),
            )
        })
        .collect();
    for p in &points {
        assert!((0.0..=std::f64::consts::LN_2).contains(&p.0));
        assert!((0.0..=std::f64::consts::LN_2).contains(&p.1));
        let dominated = points.iter().any(|q| q.0 < p.0 && q.1 < p.1);
        assert_eq!(p.2, !dominated, "{p:?} in {text}");
    }
    assert!(points.iter().any(|p| p.2));
    assert!(rows.iter().any(|r| r[2] == "bucketization"));
    for plot in [
        "fig2a-uloss-ploss.svg",
        "fig2b-methods.svg",
        "fig3-query-error.svg",
    ] {
        let svg = std::fs::read_to_string(dir.path().join(plot)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{plot}"
        );
        assert!(svg.contains("efficient frontier"), "{plot}");
    }
    let fig2a = std::fs::read_to_string(dir.path().join("fig2a-uloss-ploss.svg")).unwrap();
    assert!(fig2a.contains("k-anonymity") && fig2a.contains("t-closeness"));
}

#[test]
fn frontier_rejects_bad_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_cloakd"))
        .args(["table", "frontier", job, "--out"])
        .arg(dir.path())
        .args(["--t", "1.5"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--t 1.5"));
}
