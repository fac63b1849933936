//! `cloakd table figures` end to end on the first 3,000 rows of Adult: both datasets' jobs, a few of
//! the paper's sanitizations, SVG and PNG. Every figure is drawn with one adversary bar per kept
//! sanitization, the sanitizations a dataset cannot satisfy are left out and named, every
//! researcher's bar is measured, and the figures' A_acc and U_san − U_base equal `table evaluate`'s
//! (with `--workload`) on the release `table anonymize` makes of the same job.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::support::{bin, repo};

/// The header and the first `rows` rows of the examples' Adult.
fn sample(dir: &Path, rows: usize) -> PathBuf {
    let file = std::fs::File::open(repo().join("examples/data/adult.csv.gz")).unwrap();
    let lines = BufReader::new(flate2::read::GzDecoder::new(file)).lines();
    let path = dir.join("adult-sample.csv");
    let mut out = std::fs::File::create(&path).unwrap();
    for line in lines.take(rows + 1) {
        writeln!(out, "{}", line.unwrap()).unwrap();
    }
    path
}

/// Runs `cloakd ARGS` in the repository's root (the arguments name paths relative to it).
fn cloakd_in_repo(args: &[&str]) -> std::process::Output {
    bin().current_dir(repo()).args(args).output().unwrap()
}

#[test]
fn figures_are_drawn_and_agree_with_table_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let input = sample(dir.path(), 3000);
    let out = dir.path().join("figures");
    let output = cloakd_in_repo(&[
        "table",
        "figures",
        "--marital",
        "docs/jobs/bs-marital.toml",
        "--occupation",
        "docs/jobs/bs-occupation.toml",
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--k",
        "10,100",
        "--l",
        "2,15",
        "--t",
        "0.3",
        "--delta",
        "1.2",
        "--format",
        "svg,png",
        "--folds",
        "3",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Marital status has 7 values and occupation 14: recursive (3, 15)-diversity is impossible.
    assert!(
        stderr.contains("Marital dataset, l=15: left out"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Occupation dataset, l=15: left out"),
        "{stderr}"
    );

    let csv = std::fs::read_to_string(out.join("figures.csv")).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        [
            "figure",
            "dataset",
            "workload",
            "sanitization",
            "a_acc",
            "a_know",
            "adversary_baseline",
            "u_base",
            "gain_j48",
            "gain_rf",
            "gain_nb"
        ]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    let expected_groups = ["k=10", "k=100", "l=2", "t=0.3", "δ=1.2"];
    for (figure, stem, classifiers) in [
        ("1", "fig1-marital-marital-status", 1),
        ("2", "fig2-occupation-occupation", 1),
        ("3", "fig3-marital-income", 3),
        ("4", "fig4-occupation-marital-status", 3),
    ] {
        let groups: Vec<&str> = rows
            .iter()
            .filter(|r| &r[0] == figure)
            .map(|r| &r[3])
            .collect();
        assert_eq!(groups, expected_groups, "figure {figure}");
        for r in rows.iter().filter(|r| &r[0] == figure) {
            assert!(!r[7].is_empty(), "figure {figure}: U_base measured");
            let gains = (8..11).filter(|&c| !r[c].is_empty()).count();
            assert_eq!(
                gains, classifiers,
                "figure {figure} {}: one gain per classifier",
                &r[3]
            );
        }
        let svg = std::fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        // One adversary bar per sanitization, and the legend's swatch.
        let adversary = doc
            .descendants()
            .filter(|n| n.has_tag_name("rect"))
            .filter(|n| {
                n.attribute("fill")
                    .is_some_and(|f| f.eq_ignore_ascii_case("#1f77b4"))
            })
            .count();
        assert_eq!(adversary, groups.len() + 1, "{stem}");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(str::trim))
            .collect();
        for group in &groups {
            assert!(texts.contains(group), "{group} in {stem}");
        }
        let legend = texts
            .iter()
            .filter(|t| t.starts_with("researcher: "))
            .count();
        assert_eq!(legend, classifiers, "{stem}");
        let png = std::fs::File::open(out.join(format!("{stem}.png"))).unwrap();
        let mut reader = png::Decoder::new(BufReader::new(png)).read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        let slots = 1 + classifiers as u32;
        let width = (110 + groups.len() as u32 * (slots * 14 + 22)).max(560) + 240;
        assert_eq!((info.width, info.height), (width, 520), "{stem}");
    }

    // The same release through `table anonymize` and `table evaluate`.
    for (job, figure, flags, workload, classifiers) in [
        (
            "docs/jobs/bs-occupation.toml",
            "2",
            ["--k", "10"],
            "occupation",
            "j48",
        ),
        (
            "docs/jobs/bs-marital.toml",
            "3",
            ["--delta", "1.2"],
            "income",
            "j48,rf,nb",
        ),
    ] {
        let release = dir.path().join(format!("release-{figure}.csv"));
        let anonymized = cloakd_in_repo(&[
            "table",
            "anonymize",
            job,
            "--input",
            input.to_str().unwrap(),
            "--output",
            release.to_str().unwrap(),
            flags[0],
            flags[1],
        ]);
        assert!(
            anonymized.status.success(),
            "{}",
            String::from_utf8_lossy(&anonymized.stderr)
        );
        let evaluated = cloakd_in_repo(&[
            "table",
            "evaluate",
            job,
            "--input",
            input.to_str().unwrap(),
            "--release",
            release.to_str().unwrap(),
            "--queries",
            "10",
            "--workload",
            workload,
            "--classifiers",
            classifiers,
            "--folds",
            "3",
        ]);
        assert!(
            evaluated.status.success(),
            "{}",
            String::from_utf8_lossy(&evaluated.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&evaluated.stdout).unwrap();
        let label = match flags[0] {
            "--k" => format!("k={}", flags[1]),
            _ => format!("δ={}", flags[1]),
        };
        let row = rows
            .iter()
            .find(|r| &r[0] == figure && r[3] == label)
            .unwrap();
        for (column, key) in [(4, "a_acc"), (5, "a_know")] {
            let ours: f64 = row[column].parse().unwrap();
            let theirs = report[key].as_f64().unwrap();
            assert!(
                (ours - theirs).abs() < 1e-6,
                "{key} {label}: {ours} vs {theirs}"
            );
        }
        for learned in report["workload"]["classifiers"].as_array().unwrap() {
            let classifier = learned["classifier"].as_str().unwrap();
            let column = 8 + ["j48", "rf", "nb"]
                .iter()
                .position(|c| *c == classifier)
                .unwrap();
            let ours: f64 = row[column].parse().unwrap();
            let theirs = learned["u_san_minus_u_base"].as_f64().unwrap();
            assert!(
                (ours - theirs).abs() < 1e-6,
                "{classifier} gain {label}: {ours} vs {theirs}"
            );
        }
    }
}

#[test]
fn figures_refuse_bad_input_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let refused = |args: &[&str], expected: &str| {
        let mut all = vec!["table", "figures", "--out", out];
        all.extend_from_slice(args);
        let output = cloakd_in_repo(&all);
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    };
    refused(&[], "--marital");
    refused(
        &[
            "--occupation",
            "docs/jobs/bs-occupation.toml",
            "--figures",
            "1",
        ],
        "--marital",
    );
    refused(
        &["--occupation", "docs/jobs/bs-occupation.toml", "--t", "1.5"],
        "--t 1.5",
    );
    refused(
        &[
            "--occupation",
            "docs/jobs/bs-occupation.toml",
            "--format",
            "gif",
        ],
        "--format",
    );
    // The Occupation dataset's job given as the Marital one: the roles are checked.
    refused(
        &["--marital", "docs/jobs/bs-occupation.toml"],
        "--marital docs/jobs/bs-occupation.toml",
    );
}
