//! `cloakd table anonymize` end to end: the real binary on the Adult examples (the released CSV is
//! re-read and its classes recomputed here, independently of the engine) and on bad inputs (each
//! error names the file, line/column and rule, and no output file is left behind).
use std::collections::HashMap;
use std::path::Path;

use crate::support::{cloakd, repo};

fn example(name: &str) -> String {
    repo().join("examples").join(name).display().to_string()
}

fn read_rows(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

fn report(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn adult_k10_generalization() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("adult.csv");
    let rep = dir.path().join("report.json");
    let o = cloakd(&[
        "table",
        "anonymize",
        &example("adult.toml"),
        "--output",
        out.to_str().unwrap(),
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = read_rows(&out);
    assert_eq!(
        header,
        [
            "age",
            "workclass",
            "education",
            "marital-status",
            "occupation",
            "race",
            "sex"
        ]
    );
    assert_eq!(rows.len(), 45_222);
    // Recompute the classes from the released rows.
    let mut classes: HashMap<Vec<&str>, u64> = HashMap::new();
    for r in &rows {
        let key = [0, 1, 2, 3, 5, 6].iter().map(|&i| r[i].as_str()).collect();
        *classes.entry(key).or_default() += 1;
    }
    let k = classes.values().min().copied().unwrap();
    assert!(k >= 10, "smallest class {k}");
    let rep = report(&rep);
    for key in [
        "rows",
        "classes",
        "k",
        "l_distinct",
        "l_entropy",
        "t_emd",
        "t_js",
        "delta",
        "discernibility",
        "avg_class_size",
        "seconds",
    ] {
        assert!(rep.get(key).is_some(), "report lacks {key}");
    }
    assert_eq!(rep["rows"], 45_222);
    assert_eq!(rep["classes"], classes.len() as u64);
    assert_eq!(rep["k"], k);
    let discernibility: u64 = classes.values().map(|s| s * s).sum();
    assert_eq!(
        rep["discernibility"].as_f64().unwrap(),
        discernibility as f64
    );
}

#[test]
fn adult_overrides_and_bucketization() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bs.csv");
    let rep = dir.path().join("bs.json");
    let o = cloakd(&[
        "table",
        "anonymize",
        &example("adult-bs.toml"),
        "--output",
        out.to_str().unwrap(),
        "--report",
        rep.to_str().unwrap(),
        "--k",
        "50",
        "--l",
        "recursive:3:c=4",
        "--t",
        "js:0.1",
        "--release",
        "bucketization",
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = read_rows(&out);
    assert_eq!(header, ["age", "race", "sex", "group"]);
    assert_eq!(rows.len(), 45_222);
    let (sheader, srows) = read_rows(&dir.path().join("bs.sensitive.csv"));
    assert_eq!(sheader, ["group", "occupation", "count"]);
    let mut group_sizes: HashMap<&str, u64> = HashMap::new();
    for r in &rows {
        *group_sizes.entry(r[3].as_str()).or_default() += 1;
    }
    let mut counted: HashMap<&str, u64> = HashMap::new();
    for r in &srows {
        *counted.entry(r[0].as_str()).or_default() += r[2].parse::<u64>().unwrap();
    }
    assert_eq!(group_sizes, counted);
    assert!(group_sizes.values().all(|&s| s >= 50));
    let rep = report(&rep);
    assert!(rep["t_js"].as_f64().unwrap() <= 0.1 + 1e-9);
    assert_eq!(rep["release"], "bucketization");
}

#[test]
fn adult_delta_disclosure_and_trivial() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.csv");
    let rep = dir.path().join("d.json");
    for release in ["generalization", "trivial"] {
        let o = cloakd(&[
            "table",
            "anonymize",
            &example("adult-bs.toml"),
            "--output",
            out.to_str().unwrap(),
            "--report",
            rep.to_str().unwrap(),
            "--delta",
            "1.2",
            "--release",
            release,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rep = report(&rep);
        assert!(rep["delta"].as_f64().unwrap() < 1.2);
        if release == "trivial" {
            assert_eq!(rep["classes"], 1);
            let (header, rows) = read_rows(&out);
            assert_eq!(header, ["age", "occupation", "race", "sex"]);
            assert!(
                rows.iter()
                    .all(|r| r[0] == "*" && r[2] == "*" && r[3] == "*")
            );
        }
    }
}

/// A scratch job over a small table, with one thing broken.
struct Scratch {
    dir: tempfile::TempDir,
}

const JOB: &str = r#"input = "t.csv"
[columns]
id = { role = "identifier" }
age = { role = "quasi", kind = "numeric" }
sex = { role = "quasi", hierarchy = "sex.csv" }
disease = { role = "sensitive" }
[privacy]
k = 2
"#;
const TABLE: &str =
    "id,age,sex,disease\n1,30,Male,flu\n2,31,Female,cold\n3,32,Male,cold\n4,33,Female,flu\n";

impl Scratch {
    fn new(job: &str, table: &str, hierarchy: &str) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("job.toml"), job).unwrap();
        std::fs::write(dir.path().join("t.csv"), table).unwrap();
        std::fs::write(dir.path().join("sex.csv"), hierarchy).unwrap();
        Scratch { dir }
    }

    /// Runs the job with extra flags; returns stderr, asserting failure and no output left.
    fn fails(&self, extra: &[&str]) -> String {
        let out = self.dir.path().join("out.csv");
        let job = self.dir.path().join("job.toml");
        let mut args = vec![
            "table",
            "anonymize",
            job.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = cloakd(&args);
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(
            !o.status.success(),
            "expected failure, got success: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("out"))
            .collect();
        assert!(left.is_empty(), "left behind {left:?}");
        stderr
    }
}

const SEX: &str = "Male;*\nFemale;*\n";

#[test]
fn good_scratch_job_works() {
    let s = Scratch::new(JOB, TABLE, SEX);
    let out = s.dir.path().join("out.csv");
    let o = cloakd(&[
        "table",
        "anonymize",
        s.dir.path().join("job.toml").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = read_rows(&out);
    assert_eq!(header, ["age", "sex", "disease"]);
    assert_eq!(rows.len(), 4);
}

#[test]
fn bad_tables_name_line_column_and_rule() {
    let ragged = Scratch::new(JOB, "id,age,sex,disease\n1,30,Male,flu\n2,31,Female\n", SEX);
    let e = ragged.fails(&[]);
    assert!(
        e.contains("t.csv:3: 3 fields, but the header has 4") && e.contains("ragged"),
        "{e}"
    );

    let nan = Scratch::new(
        JOB,
        "id,age,sex,disease\n1,30,Male,flu\n2,thirty,Female,flu\n",
        SEX,
    );
    let e = nan.fails(&[]);
    assert!(
        e.contains("t.csv:3:2: \"thirty\" in column \"age\" is not a number"),
        "{e}"
    );

    let missing = Scratch::new(JOB, "id,age,sex,disease\n1,30,Other,flu\n", SEX);
    let e = missing.fails(&[]);
    assert!(
        e.contains("t.csv:2:3: \"Other\" in column \"sex\" is missing from its hierarchy"),
        "{e}"
    );

    let depth = Scratch::new(JOB, TABLE, "Male;Person;*\nFemale;*\n");
    let e = depth.fails(&[]);
    assert!(
        e.contains("sex.csv:2: 2 levels, but line 1 has 3") && e.contains("same depth"),
        "{e}"
    );

    let empty = Scratch::new(JOB, "id,age,sex,disease\n", SEX);
    let e = empty.fails(&[]);
    assert!(e.contains("t.csv: the table has no rows"), "{e}");

    let impossible = Scratch::new(JOB, TABLE, SEX);
    let e = impossible.fails(&["--k", "5"]);
    assert!(
        e.contains("k-anonymity (k=5) cannot be met") && e.contains("4 records"),
        "{e}"
    );
    let e = impossible.fails(&["--l", "distinct:3"]);
    assert!(e.contains("2 distinct sensitive values < l=3"), "{e}");
}

#[test]
fn bad_jobs_and_flags_name_the_key_and_rule() {
    let none = Scratch::new(
        &JOB.replace("role = \"sensitive\"", "role = \"insensitive\""),
        TABLE,
        SEX,
    );
    let e = none.fails(&[]);
    assert!(e.contains("job.toml:2:1: no sensitive column"), "{e}");

    let two = Scratch::new(
        &JOB.replace(
            "id = { role = \"identifier\" }",
            "id = { role = \"sensitive\" }",
        ),
        TABLE,
        SEX,
    );
    let e = two.fails(&[]);
    assert!(e.contains("2 sensitive columns"), "{e}");

    let k0 = Scratch::new(&JOB.replace("k = 2", "k = 0"), TABLE, SEX);
    let e = k0.fails(&[]);
    assert!(e.contains("job.toml:8:5: k must be at least 1"), "{e}");

    let unknown = Scratch::new(&JOB.replace("k = 2", "l = \"diverse:2\""), TABLE, SEX);
    let e = unknown.fails(&[]);
    assert!(
        e.contains("job.toml:8:5") && e.contains("unknown l-diversity \"diverse\""),
        "{e}"
    );

    let s = Scratch::new(JOB, TABLE, SEX);
    assert!(
        s.fails(&["--k", "0"])
            .contains("--k 0: k must be at least 1")
    );
    assert!(
        s.fails(&["--t", "emd:1.5"])
            .contains("t must lie in [0, 1]")
    );
    assert!(
        s.fails(&["--t", "kl:0.1"])
            .contains("unknown t-closeness distance")
    );
    assert!(
        s.fails(&["--delta", "0"])
            .contains("delta must be a finite number > 0")
    );
    assert!(
        s.fails(&["--delta", "-1"])
            .contains("delta must be a finite number > 0")
    );
    assert!(
        s.fails(&["--l", "entropic:2"])
            .contains("unknown l-diversity")
    );
    assert!(
        s.fails(&["--release", "shuffle"])
            .contains("unknown release method")
    );
}

#[test]
fn gzip_input_is_read_transparently() {
    use std::io::Write;
    let s = Scratch::new(JOB, TABLE, SEX);
    let gz = s.dir.path().join("t.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(TABLE.as_bytes()).unwrap();
    enc.finish().unwrap();
    let out = s.dir.path().join("out.csv");
    let o = cloakd(&[
        "table",
        "anonymize",
        s.dir.path().join("job.toml").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--input",
        gz.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read_rows(&out).1.len(), 4);
}
