//! Shared by the learning tests and the learning bench: the Adult tables of Brickell & Shmatikov's
//! Table 1 and Weka 3.6 run on the same data as the reference. `benches/learning.rs` includes this
//! file as a `#[path]` module, so it names nothing else of the test binary's support.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cloakd::learning::Dataset;

/// Weka's jar where Debian's `weka` package installs it (CI installs it).
pub const WEKA_JAR: &str = "/usr/share/java/weka.jar";

/// The 9 attributes of the paper's Table 1, in Adult's column order (`income` is its Salary).
pub const TABLE1: [&str; 9] = [
    "age",
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "race",
    "sex",
    "native-country",
    "income",
];

/// The paper's table: Table 1's attributes of `examples/data/adult.csv.gz` (the team's shared Adult,
/// 45,222 rows), age numeric, every other attribute nominal; the first `limit` rows.
pub fn adult(limit: usize) -> Dataset {
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/adult.csv.gz"),
        )
        .expect("adult.csv.gz"),
    )
    .read_to_string(&mut text)
    .expect("adult.csv.gz decompresses");
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let index: Vec<usize> = TABLE1
        .iter()
        .map(|name| header.iter().position(|h| h == name).expect("column"))
        .collect();
    let records: Vec<csv::StringRecord> =
        reader.records().take(limit).map(|r| r.unwrap()).collect();
    let numeric: Vec<bool> = TABLE1.iter().map(|&n| n == "age").collect();
    Dataset::from_rows(
        &TABLE1,
        &numeric,
        records
            .iter()
            .map(|r| index.iter().map(move |&i| r.get(i).unwrap())),
    )
    .expect("Adult loads")
}

/// Why Weka cannot run here, if it cannot.
pub fn weka_missing() -> Option<String> {
    if !Path::new(WEKA_JAR).exists() {
        return Some(format!("{WEKA_JAR} is absent"));
    }
    match Command::new("java").arg("-version").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("java -version failed: {}", out.status)),
        Err(err) => Some(format!("java does not run: {err}")),
    }
}

/// What Weka's cross-validation said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WekaRun {
    pub correct: u64,
    pub total: u64,
    /// The whole `java` process, start to exit.
    pub elapsed: Duration,
}

/// Runs Weka's `classifier` (e.g. `weka.classifiers.trees.J48`) with `folds`-fold cross-validation
/// seeded `seed` on `data` predicting attribute `class`, written to `dir` as ARFF.
pub fn weka_cv(
    dir: &Path,
    name: &str,
    data: &Dataset,
    class: usize,
    classifier: &str,
    folds: usize,
    seed: u64,
) -> WekaRun {
    let arff = dir.join(format!("{name}.arff"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&arff).unwrap());
    data.write_arff(name, &mut out).unwrap();
    drop(out);
    let start = Instant::now();
    let output = Command::new("java")
        .args(["-Xmx2g", "-cp", WEKA_JAR, classifier, "-t"])
        .arg(&arff)
        .args(["-x", &folds.to_string(), "-s", &seed.to_string()])
        .args(["-c", &(class + 1).to_string(), "-o", "-v"])
        .output()
        .expect("java runs");
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "Weka failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let section = stdout
        .split("=== Stratified cross-validation ===")
        .nth(1)
        .unwrap_or_else(|| panic!("no cross-validation section in Weka's output:\n{stdout}"));
    let number = |label: &str| -> u64 {
        let line = section
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line:\n{section}"));
        line[label.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line}"))
    };
    WekaRun {
        correct: number("Correctly Classified Instances"),
        total: number("Total Number of Instances"),
        elapsed,
    }
}
