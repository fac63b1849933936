//! `cloakd transactions anonymize|constraints` run as the real binary: the released file passes the
//! independent checker, order and report behave as documented, bad input names file:line and rule.
use std::collections::HashMap;
use std::path::Path;

use cloakd::transactions::Record;

use crate::support::cloakd;
use crate::support::rho_checker::check_exact;

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A small window in string items, with a breach: 3 of 4 `beer` buyers also bought `pills`.
const RECORDS: &str = "beer pills\nbeer pills chips\nbeer pills\nbeer\nchips salsa\nsalsa pills\n";
const CONSTRAINTS: &str = "pills\npills\n\npills\nbeer\npills\n";

/// Interns both files the same way the test reads them, to check the release with the checker.
fn to_window(records: &str, constraints: &str, names: &mut HashMap<String, u32>) -> Vec<Record> {
    let mut intern = |s: &str| {
        let next = names.len() as u32;
        *names.entry(s.to_string()).or_insert(next)
    };
    let mut parse = |line: &str| {
        let mut items: Vec<u32> = line.split_whitespace().map(&mut intern).collect();
        items.sort_unstable();
        items
    };
    records
        .lines()
        .zip(constraints.lines())
        .map(|(r, c)| Record {
            items: parse(r),
            sensitive: parse(c),
        })
        .collect()
}

#[test]
fn anonymize_keep_order_passes_the_checker_and_writes_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.txt");
    let sensitive = dir.path().join("constraints.txt");
    let output = dir.path().join("released.txt");
    let report = dir.path().join("report.json");
    std::fs::write(&input, RECORDS).unwrap();
    std::fs::write(&sensitive, CONSTRAINTS).unwrap();
    let run = cloakd(&[
        "transactions",
        "anonymize",
        "--input",
        path_str(&input),
        "--sensitive",
        path_str(&sensitive),
        "--rho",
        "0.5",
        "--m",
        "2",
        "--seed",
        "3",
        "--output",
        path_str(&output),
        "--keep-order",
        "--report",
        path_str(&report),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let released = std::fs::read_to_string(&output).unwrap();
    assert_eq!(released.lines().count(), RECORDS.lines().count());
    let mut names = HashMap::new();
    let window = to_window(RECORDS, CONSTRAINTS, &mut names);
    let released_ids: Vec<Vec<u32>> = released
        .lines()
        .map(|line| {
            let mut items: Vec<u32> = line.split_whitespace().map(|s| names[s]).collect();
            items.sort_unstable();
            items
        })
        .collect();
    check_exact(&window, &released_ids, 0.5, 2).unwrap();

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["records"], 6);
    let suppressed = report["suppressed"].as_u64().unwrap();
    assert!(suppressed > 0);
    let kept = released_ids.iter().map(Vec::len).sum::<usize>() as u64;
    assert_eq!(kept + suppressed, 12);
    for field in ["util_info", "util_dist", "util_mining", "seconds"] {
        assert!(report[field].as_f64().unwrap() >= 0.0, "{field}");
    }
}

#[test]
fn sampled_gzip_output_is_shuffled_but_the_same_multiset() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.txt.gz");
    let sensitive = dir.path().join("constraints.txt");
    let lines: Vec<String> = (0..200)
        .map(|i| format!("a{} b{} c", i % 7, i % 5))
        .collect();
    let text = lines.join("\n") + "\n";
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut encoder, text.as_bytes()).unwrap();
    std::fs::write(&input, encoder.finish().unwrap()).unwrap();
    std::fs::write(&sensitive, "c\n".repeat(200)).unwrap();
    let mut outputs = Vec::new();
    for keep in [true, false] {
        let output = dir.path().join(format!("out-{keep}.txt.gz"));
        let mut args = vec![
            "transactions",
            "anonymize",
            "--input",
            path_str(&input),
            "--sensitive",
            path_str(&sensitive),
            "--rho",
            "0.5",
            "--m",
            "2",
            "--sampled",
            "--epsilon",
            "0.1",
            "--delta",
            "0.1",
            "--seed",
            "9",
            "--output",
            path_str(&output),
        ];
        if keep {
            args.push("--keep-order");
        }
        let run = cloakd(&args);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(&output).unwrap()),
            &mut text,
        )
        .unwrap();
        outputs.push(text.lines().map(str::to_string).collect::<Vec<_>>());
    }
    assert_eq!(outputs[0].len(), 200);
    assert_ne!(
        outputs[0], outputs[1],
        "shuffled output equals the kept order"
    );
    let (mut kept, mut shuffled) = (outputs[0].clone(), outputs[1].clone());
    kept.sort();
    shuffled.sort();
    assert_eq!(kept, shuffled);
}

#[test]
fn constraints_generator_writes_one_line_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.txt");
    let output = dir.path().join("constraints.txt");
    std::fs::write(&input, RECORDS).unwrap();
    let run = cloakd(&[
        "transactions",
        "constraints",
        "--input",
        path_str(&input),
        "--sensitive-share",
        "0.5",
        "--seed",
        "1",
        "--output",
        path_str(&output),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = std::fs::read_to_string(&output).unwrap();
    assert_eq!(text.lines().count(), RECORDS.lines().count());
    let items = ["beer", "pills", "chips", "salsa"];
    assert!(text.split_whitespace().all(|t| items.contains(&t)));
}

/// Runs `anonymize` on the given files and flags and returns its stderr; it must fail.
fn failing_anonymize(records: &str, constraints: &str, flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.txt");
    let sensitive = dir.path().join("constraints.txt");
    let output = dir.path().join("out.txt");
    std::fs::write(&input, records).unwrap();
    std::fs::write(&sensitive, constraints).unwrap();
    let mut args = vec![
        "transactions",
        "anonymize",
        "--input",
        path_str(&input),
        "--sensitive",
        path_str(&sensitive),
        "--seed",
        "1",
        "--output",
        path_str(&output),
    ];
    args.extend_from_slice(flags);
    let run = cloakd(&args);
    assert!(!run.status.success());
    assert!(!output.exists(), "a failed run left an output file");
    String::from_utf8_lossy(&run.stderr).into_owned()
}

#[test]
fn bad_input_is_refused_with_file_line_and_rule() {
    let ok = ["--rho", "0.5", "--m", "2"];
    let err = failing_anonymize("a b\n\nc\n", "\n\n\n", &ok);
    assert!(
        err.contains("records.txt:2: a record needs at least one item"),
        "{err}"
    );
    let err = failing_anonymize("a b\nc c\n", "\n\n", &ok);
    assert!(
        err.contains("records.txt:2: item \"c\" appears twice"),
        "{err}"
    );
    let err = failing_anonymize("a b\nc\n", "a\n", &ok);
    assert!(err.contains("constraints.txt: has 1 lines but"), "{err}");
    assert!(err.contains("has 2 records"), "{err}");
    let err = failing_anonymize("a b\n", "\n", &["--rho", "1.5", "--m", "2"]);
    assert!(err.contains("rho: 1.5 is outside (0, 1)"), "{err}");
    let err = failing_anonymize("a b\n", "\n", &["--rho", "0.5", "--m", "0"]);
    assert!(err.contains("m: must be at least 1"), "{err}");
    let sampled = [
        "--rho",
        "0.5",
        "--m",
        "2",
        "--sampled",
        "--epsilon",
        "0",
        "--delta",
        "0.1",
    ];
    let err = failing_anonymize("a b\n", "\n", &sampled);
    assert!(err.contains("epsilon: 0 is outside (0, 1)"), "{err}");
    let sampled = [
        "--rho",
        "0.5",
        "--m",
        "2",
        "--sampled",
        "--epsilon",
        "0.1",
        "--delta",
        "2",
    ];
    let err = failing_anonymize("a b\n", "\n", &sampled);
    assert!(err.contains("delta: 2 is outside (0, 1)"), "{err}");
    let err = failing_anonymize("a b\n", "x x\n", &ok);
    assert!(
        err.contains("constraints.txt:1: item \"x\" appears twice"),
        "{err}"
    );
}
