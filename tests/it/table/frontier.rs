//! `cloakd table frontier`: a small sweep on a sample of Adult writes one `frontier.csv` row per
//! release with the documented columns, flags exactly the non-dominated releases as efficient, and
//! writes the three SVG plots; each row carries the release's prosecutor risk; with a learning workload each row carries U_base and the gains, equal
//! to `table evaluate --workload`'s on the same release, and a fourth plot shows them.

#[test]
fn frontier_writes_csv_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let output = crate::support::bin()
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
        "model,parameter,method,ploss,uloss,a_know,a_acc,query_error,seconds,efficient,algorithm,u_base,gain_j48,gain_rf,gain_nb,whd,dm,risk_highest,risk_average,risk_records_at_risk"
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
        // Pareto dominance: at least as low on both, lower on one. A point sharing a printed
        // coordinate with another is left out: six decimals cannot say which of the two is lower.
        let ambiguous = points.iter().filter(|q| q.0 == p.0 || q.1 == p.1).count() > 1;
        if ambiguous {
            continue;
        }
        let dominated = points
            .iter()
            .any(|q| q.0 <= p.0 && q.1 <= p.1 && (q.0 < p.0 || q.1 < p.1));
        assert_eq!(p.2, !dominated, "{p:?} in {text}");
    }
    assert!(points.iter().any(|p| p.2));
    // The risk columns: a k-anonymous generalization has highest risk at most 1/k and an average
    // at most its highest; bucketization publishes exact QIs, riskier than any generalization.
    for r in &rows {
        let highest: f64 = r[17].parse().unwrap();
        let average: f64 = r[18].parse().unwrap();
        let at_risk: f64 = r[19].parse().unwrap();
        assert!(
            average <= highest && (0.0..=1.0).contains(&at_risk),
            "{r:?}"
        );
        if r[0] == "k-anonymity" && r[2] == "generalization" {
            let k: f64 = r[1].parse().unwrap();
            assert!(highest <= 1.0 / k + 1e-9, "{r:?}");
        }
    }
    assert!(rows.iter().any(|r| r[2] == "bucketization"));
    assert!(
        rows.iter().all(|r| r[10] == "mondrian"),
        "the default algorithm"
    );
    for plot in [
        "fig2a-uloss-ploss.svg",
        "fig2b-methods.svg",
        "fig3-query-error.svg",
        "fig5-risk-uloss.svg",
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
    let fig5 = std::fs::read_to_string(dir.path().join("fig5-risk-uloss.svg")).unwrap();
    assert!(
        fig5.contains("re-identification risk")
            && fig5.contains("k-anonymity (generalization)")
            && fig5.contains("k-anonymity (bucketization)"),
        "the risk chart, one series per model and method"
    );
    assert!(rows.iter().all(|r| r[11..15].iter().all(String::is_empty)));
    assert!(!dir.path().join("fig4-workload-gain.svg").exists());
}

#[test]
fn frontier_learns_the_workload_axis() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let cloakd = |args: &[&str]| {
        let output = crate::support::bin().args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let out = dir.path().join("frontier");
    let learning = [
        "--workload",
        "occupation",
        "--classifiers",
        "j48,nb",
        "--folds",
        "3",
    ];
    let mut args = vec!["table", "frontier", job, "--out", out.to_str().unwrap()];
    args.extend(["--k", "10,50", "--l", "--t", "--delta", "--queries", "10"]);
    args.extend(learning);
    cloakd(&args);
    let text = std::fs::read_to_string(out.join("frontier.csv")).unwrap();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 4, "{text}");
    for r in &rows {
        assert!(
            !r[11].is_empty() && r[11] == rows[0][11],
            "one U_base: {text}"
        );
        assert!(
            !r[12].is_empty() && r[13].is_empty() && !r[14].is_empty(),
            "{text}"
        );
    }
    let svg = std::fs::read_to_string(out.join("fig4-workload-gain.svg")).unwrap();
    assert!(svg.contains("learning occupation"), "the workload chart");

    // The k = 10 generalization, released and measured by the other commands.
    let release = dir.path().join("release.csv");
    let release = release.to_str().unwrap();
    cloakd(&["table", "anonymize", job, "--output", release, "--k", "10"]);
    let mut args = vec![
        "table",
        "evaluate",
        job,
        "--release",
        release,
        "--queries",
        "10",
    ];
    args.extend(learning);
    let report: serde_json::Value = serde_json::from_slice(&cloakd(&args).stdout).unwrap();
    let row = rows
        .iter()
        .find(|r| &r[0] == "k-anonymity" && &r[1] == "10" && &r[2] == "generalization")
        .unwrap_or_else(|| panic!("k = 10 in {text}"));
    let u_base: f64 = row[11].parse().unwrap();
    assert!((u_base - report["workload"]["u_base"].as_f64().unwrap()).abs() < 1e-6);
    for (column, learned) in [12, 14]
        .into_iter()
        .zip(report["workload"]["classifiers"].as_array().unwrap())
    {
        let ours: f64 = row[column].parse().unwrap();
        let theirs = learned["u_san_minus_u_base"].as_f64().unwrap();
        assert!(
            (ours - theirs).abs() < 1e-6,
            "{learned}: {ours} vs {theirs}"
        );
    }
}

#[test]
fn frontier_rejects_bad_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/adult-sample/job.toml"
    );
    let output = crate::support::bin()
        .args(["table", "frontier", job, "--out"])
        .arg(dir.path())
        .args(["--t", "1.5"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--t 1.5"));
}

/// `--algorithms mondrian,ola` sweeps both algorithms on the same axes: one frontier.csv row per
/// (parameter, algorithm), OLA's rows by generalization only (its bucketization pairs are left out),
/// and one series per algorithm in the plots. The job gives every QI a hierarchy (OLA needs them).
#[test]
fn frontier_compares_algorithms_on_one_axis() {
    let dir = tempfile::tempdir().unwrap();
    let sample = crate::support::repo().join("tests/data/adult-sample");
    let mut job = format!(
        "input = {:?}\n[columns]\n",
        sample.join("adult-2000.csv.gz").display().to_string()
    );
    for name in ["workclass", "education", "marital-status", "sex"] {
        job.push_str(&format!(
            "{name} = {{ role = \"quasi\", hierarchy = {:?} }}\n",
            sample.join(format!("{name}.csv")).display().to_string()
        ));
    }
    job.push_str("occupation = { role = \"sensitive\" }\n[privacy]\nk = 10\n");
    let job_path = dir.path().join("job.toml");
    std::fs::write(&job_path, job).unwrap();
    let out = dir.path().join("out");
    let output = crate::support::bin()
        .args(["table", "frontier"])
        .arg(&job_path)
        .arg("--out")
        .arg(&out)
        .args([
            "--k",
            "10,100",
            "--l",
            "--t",
            "--delta",
            "--algorithms",
            "mondrian,ola",
            "--threads",
            "2",
            "--queries",
            "100",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("ola does not release by bucketization"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(out.join("frontier.csv")).unwrap();
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let mut seen: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r[1].clone(), r[2].clone(), r[10].clone()))
        .collect();
    seen.sort();
    let expected: Vec<(String, String, String)> = [
        ("10", "bucketization", "mondrian"),
        ("10", "generalization", "mondrian"),
        ("10", "generalization", "ola"),
        ("100", "bucketization", "mondrian"),
        ("100", "generalization", "mondrian"),
        ("100", "generalization", "ola"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(seen, expected, "{text}");
    // The two algorithms give different releases, so different measures.
    let uloss = |k: &str, algorithm: &str| -> f64 {
        rows.iter()
            .find(|r| r[1] == k && r[2] == "generalization" && r[10] == algorithm)
            .unwrap()[4]
            .parse()
            .unwrap()
    };
    assert_ne!(uloss("10", "mondrian"), uloss("10", "ola"));
    let fig2a = std::fs::read_to_string(out.join("fig2a-uloss-ploss.svg")).unwrap();
    assert!(
        fig2a.contains("k-anonymity (mondrian)") && fig2a.contains("k-anonymity (ola)"),
        "one series per algorithm"
    );
    // An algorithm that cannot run is refused before any work, naming the flag.
    let refused = crate::support::bin()
        .args(["table", "frontier"])
        .arg(&job_path)
        .arg("--out")
        .arg(&out)
        .args(["--algorithms", "incognito"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--algorithms"));
}
