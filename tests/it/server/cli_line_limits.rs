//! Every reader of the CLI is bounded (issue 21 item 8), run as the real binary: endless input
//! (`/dev/zero`) and one over-long line each fail at once, naming the file, the line number and the
//! limit (`cloakd::lines::MAX_LINE_BYTES`), instead of buffering without bound.
use std::path::Path;
use std::process::Output;

use cloakd::lines::MAX_LINE_BYTES;

use crate::support::cloakd;

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Asserts a failed run whose stderr names `file`, `line` and the limit; returns stderr.
fn fails_naming(run: &Output, file: &str, line: u64) -> String {
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(!run.status.success(), "expected failure: {err}");
    assert!(err.contains(file), "does not name {file}: {err}");
    let rule = format!("{line} is longer than {MAX_LINE_BYTES} bytes");
    assert!(
        err.contains(&rule),
        "does not name line {line} and the limit: {err}"
    );
    err
}

/// A file whose `line`-th line (1-based) is one byte over the limit.
fn long_line_file(dir: &Path, name: &str, head: &str, line: u64) -> std::path::PathBuf {
    let mut text = head.to_string();
    assert_eq!(text.lines().count() as u64, line - 1);
    text.push_str(&"a".repeat(MAX_LINE_BYTES + 1));
    text.push('\n');
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn transactions_inputs_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let constraints = dir.path().join("constraints.txt");
    std::fs::write(&constraints, "\n\n").unwrap();
    let output = dir.path().join("out.txt");
    let anonymize = |input: &str, sensitive: &str| {
        cloakd(&[
            "transactions",
            "anonymize",
            "--input",
            input,
            "--sensitive",
            sensitive,
            "--rho",
            "0.5",
            "--m",
            "2",
            "--seed",
            "1",
            "--output",
            path_str(&output),
        ])
    };
    fails_naming(
        &anonymize("/dev/zero", path_str(&constraints)),
        "/dev/zero",
        1,
    );
    let long = long_line_file(dir.path(), "records.txt", "a b\n", 2);
    fails_naming(
        &anonymize(path_str(&long), path_str(&constraints)),
        "records.txt",
        2,
    );
    let records = dir.path().join("ok.txt");
    std::fs::write(&records, "a b\nc\n").unwrap();
    let long = long_line_file(dir.path(), "sensitive.txt", "\n\n", 3);
    fails_naming(
        &anonymize(path_str(&records), path_str(&long)),
        "sensitive.txt",
        3,
    );
    assert!(!output.exists());
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

#[test]
fn table_inputs_hierarchies_and_jobs_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(&job, JOB).unwrap();
    std::fs::write(dir.path().join("sex.csv"), "Male;*\nFemale;*\n").unwrap();
    let out = dir.path().join("out.csv");
    let anonymize = |job: &Path, input: Option<&str>| {
        let mut args = vec![
            "table",
            "anonymize",
            path_str(job),
            "--output",
            path_str(&out),
        ];
        if let Some(input) = input {
            args.extend(["--input", input]);
        }
        cloakd(&args)
    };
    fails_naming(&anonymize(&job, Some("/dev/zero")), "/dev/zero", 1);
    let table = long_line_file(
        dir.path(),
        "t.csv",
        "id,age,sex,disease\n1,30,Male,flu\n2,31,Female,cold\n",
        4,
    );
    fails_naming(&anonymize(&job, Some(path_str(&table))), "t.csv", 4);
    // A quoted field cannot hide the newlines of an endless record.
    let quoted = dir.path().join("quoted.csv");
    let mut text = "id,age,sex,disease\n1,30,\"Male".to_string();
    text.push_str(&"\n".repeat(MAX_LINE_BYTES + 1));
    std::fs::write(&quoted, text).unwrap();
    let err = fails_naming(&anonymize(&job, Some(path_str(&quoted))), "quoted.csv", 2);
    assert!(err.contains("record starting at line 2"), "{err}");
    std::fs::write(
        dir.path().join("t.csv"),
        "id,age,sex,disease\n1,30,Male,flu\n",
    )
    .unwrap();
    long_line_file(dir.path(), "sex.csv", "Male;*\n", 2);
    fails_naming(&anonymize(&job, None), "sex.csv", 2);
    fails_naming(&anonymize(Path::new("/dev/zero"), None), "/dev/zero", 1);
    assert!(!out.exists());
}

#[test]
fn simulate_traces_and_the_token_on_stdin_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // The trace is read before any connection is made.
    let simulate =
        |trace: &str| cloakd(&["simulate", "--addr", "http://127.0.0.1:1", "--trace", trace]);
    fails_naming(&simulate("/dev/zero"), "/dev/zero", 1);
    let trace = long_line_file(
        dir.path(),
        "trace.csv",
        "user_id,timestamp_unix,lat,lon\n1,1704096000,53.1,8.2\n",
        3,
    );
    fails_naming(&simulate(path_str(&trace)), "trace.csv", 3);

    let run = crate::support::bin()
        .args(["auth", "hash-token"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(!run.status.success(), "{err}");
    assert!(
        err.contains("stdin") && err.contains(&MAX_LINE_BYTES.to_string()),
        "{err}"
    );
}
