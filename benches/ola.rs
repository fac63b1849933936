//! OLA on UCI Adult with the 8 QIs of `examples/adult-ola.toml` (issue 41's table): for k 5/10,
//! suppression 0/2 % and the metrics DM and entropy, then a few l-diversity, t-closeness and
//! delta-disclosure settings, prints the optimal node, its suppressed rows, the nodes checked, the
//! algorithm time (`relational::ola::ola` alone, best of 5 after one warm-up) and the whole-process
//! time of `cloakd table anonymize` on the example (best of 5). Run: `cargo bench --bench ola`.
//!
//! With `ARX_DIR` set to a folder holding a build of ARX and its `ArxRef` CLI (`build/cli`,
//! `lib/*.jar`; see docs/performance.md), every row also runs `ArxRef anonymize` with the same QIs,
//! hierarchies and settings (Flash, 1 warm-up, best of 5) and prints whether its node is ours, its
//! suppressed rows, checks, `ARXResult.getTime()` (search and result, encoding excluded), the whole
//! `ARXAnonymizer.anonymize()` call, and our algorithm time over its `getTime()`. The l, t and delta
//! rows need an ArxRef that takes `--sensitive`, `--l`, `--t` and `--delta`. `ARX_JAVA` names the
//! java binary (default `java`). Nothing of ARX is part of this repository.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cloakd::relational::hierarchy::Hierarchy;
use cloakd::relational::job::JobSpec;
use cloakd::relational::models::{LDiversity, PrivacySpec, TCloseness};
use cloakd::relational::ola::{Metric, ola};
use cloakd::relational::table::{Table, read_csv};

const QIS: &str = "age,workclass,education,marital-status,race,sex,native-country,income";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn adult(csv: &[u8]) -> Table {
    let text = std::fs::read_to_string(examples().join("adult-ola.toml")).expect("adult-ola.toml");
    let job = JobSpec::parse("adult-ola.toml", &text).expect("valid job");
    let schema = job
        .schema(|path, _| -> Result<Hierarchy, String> {
            let text = std::fs::read_to_string(examples().join(path)).map_err(|e| e.to_string())?;
            Hierarchy::parse(path, &text).map_err(|e| e.to_string())
        })
        .expect("hierarchies");
    read_csv(schema, csv, "adult.csv", b',').expect("adult loads")
}

struct Setting {
    name: String,
    privacy: PrivacySpec,
    supp: f64,
    metric: Metric,
    /// `cloakd table anonymize` flags beyond the example's.
    flags: Vec<String>,
}

fn settings() -> Vec<Setting> {
    let mut all = Vec::new();
    for metric in [Metric::Dm, Metric::Entropy] {
        for supp in [0.0, 0.02] {
            for k in [5u64, 10] {
                all.push(Setting {
                    name: format!("k {k}, {} %, {metric}", supp * 100.0),
                    privacy: PrivacySpec {
                        k: Some(k),
                        ..Default::default()
                    },
                    supp,
                    metric,
                    flags: vec![],
                });
            }
        }
    }
    let k5 = |l: Option<LDiversity>, t: Option<TCloseness>, delta: Option<f64>| PrivacySpec {
        k: Some(5),
        l,
        t,
        delta,
        risk: Default::default(),
    };
    let extra: [(&str, PrivacySpec, &[&str]); 4] = [
        (
            "k 5 + distinct l 3",
            k5(Some(LDiversity::Distinct(3.0)), None, None),
            &["--l", "distinct:3"],
        ),
        (
            "k 5 + entropy l 3",
            k5(Some(LDiversity::Entropy(3.0)), None, None),
            &["--l", "entropy:3"],
        ),
        (
            "k 5 + t emd 0.2",
            k5(None, Some("emd:0.2".parse().expect("t")), None),
            &["--t", "emd:0.2"],
        ),
        (
            "k 5 + delta 3",
            k5(None, None, Some(3.0)),
            &["--delta", "3"],
        ),
    ];
    for (name, privacy, flags) in extra {
        for supp in [0.0, 0.02] {
            all.push(Setting {
                name: format!("{name}, {} %, dm", supp * 100.0),
                privacy: privacy.clone(),
                supp,
                metric: Metric::Dm,
                flags: flags.iter().map(|s| s.to_string()).collect(),
            });
        }
    }
    all
}

/// What `ArxRef anonymize` reported for one k-anonymity setting.
struct Arx {
    /// Levels in the order of [`QIS`].
    levels: Vec<u64>,
    suppressed: u64,
    checks: u64,
    /// Best of 5 `ARXResult.getTime()`: the search and its result, without encoding the data.
    time_ms: f64,
    /// Best of 5 whole `ARXAnonymizer.anonymize()` calls, encoding included.
    call_ms: f64,
}

/// `ArxRef anonymize` for a setting (Flash, 1 warm-up, best of 5); `flags` are the l, t and delta
/// flags, which ArxRef takes in cloakd's syntax on the sensitive column `occupation`.
fn arx(
    dir: &Path,
    data: &Path,
    k: u64,
    supp: f64,
    metric: Metric,
    flags: &[String],
) -> Result<Arx, String> {
    let out = std::env::temp_dir().join(format!("cloakd-arx-{}.json", std::process::id()));
    let java = std::env::var("ARX_JAVA").unwrap_or_else(|_| "java".into());
    let metric = match metric {
        Metric::Dm => "dm",
        Metric::Entropy => "entropy",
        Metric::Prec => "precision",
    };
    let status = Command::new(java)
        .current_dir(dir)
        .args(["-cp", "build/cli:lib/*", "ArxRef", "anonymize", "--data"])
        .arg(data)
        .args(["--qi", QIS, "--hierarchies"])
        .arg(examples().join("data/hierarchies"))
        .args(["--k", &k.to_string(), "--supp", &supp.to_string()])
        .args(["--metric", metric, "--warmup", "1", "--runs", "5"])
        .args(if flags.is_empty() {
            &[][..]
        } else {
            &["--sensitive", "occupation"][..]
        })
        .args(flags)
        .arg("--out")
        .arg(&out)
        .output()
        .map_err(|e| format!("java: {e}"))?;
    if !status.status.success() {
        return Err(format!(
            "ArxRef failed: {}",
            String::from_utf8_lossy(&status.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = std::fs::read(&out).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let number = |value: &serde_json::Value, what: &str| {
        value
            .as_f64()
            .ok_or_else(|| format!("ArxRef's output has no {what}"))
    };
    if !flags.is_empty() && v["privacy_models"].as_array().is_none_or(|m| m.len() < 2) {
        return Err("this ArxRef takes k only (no --l, --t, --delta)".into());
    }
    let levels = QIS
        .split(',')
        .map(|q| number(&v["levels"][q], q).map(|l| l as u64))
        .collect::<Result<_, _>>()?;
    Ok(Arx {
        levels,
        suppressed: number(&v["suppressed_records"], "suppressed_records")? as u64,
        checks: number(&v["num_checks_performed"], "num_checks_performed")? as u64,
        time_ms: number(&v["timing"]["best_arx_time_ms"], "best_arx_time_ms")?,
        call_ms: number(
            &v["timing"]["best_anonymize_call_wall_ms"],
            "best_anonymize_call_wall_ms",
        )?,
    })
}

fn main() {
    let mut csv = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(examples().join("data/adult.csv.gz")).expect("adult.csv.gz"),
    )
    .read_to_end(&mut csv)
    .expect("gunzip");
    let table = adult(&csv);
    let work = tempfile::tempdir().expect("temporary folder");
    let plain = work.path().join("adult.csv");
    std::fs::write(&plain, &csv).expect("write adult.csv");
    let arx_dir = std::env::var_os("ARX_DIR").map(PathBuf::from);
    let only = std::env::args().nth(1).filter(|a| !a.starts_with("--"));
    println!(
        "| setting | node | suppressed | nodes checked | algorithm ms (best of 5) | whole process s (best of 5) |{}",
        if arx_dir.is_some() {
            " ARX Flash: same node | suppressed | checks | getTime ms | anonymize() ms | cloakd / ARX getTime |"
        } else {
            ""
        }
    );
    println!(
        "|---|---|---|---|---|---|{}",
        if arx_dir.is_some() {
            "---|---|---|---|---|---|"
        } else {
            ""
        }
    );
    for s in settings() {
        if only.as_ref().is_some_and(|o| !s.name.contains(o.as_str())) {
            continue;
        }
        let mut best = f64::INFINITY;
        let mut found = None;
        for _ in 0..6 {
            let started = Instant::now();
            let result = ola(&table, &s.privacy, s.metric, s.supp);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            if found.is_some() {
                best = best.min(ms);
            }
            found = Some(result);
        }
        let (levels, node, suppressed, checked) = match found.expect("ran") {
            Ok(r) => (
                r.levels.clone(),
                format!("{:?}", r.levels),
                r.recoding
                    .suppressed
                    .iter()
                    .filter(|&&x| x)
                    .count()
                    .to_string(),
                r.nodes_checked.to_string(),
            ),
            Err(e) => (vec![], e.to_string(), "-".into(), "-".into()),
        };
        let mut whole = f64::INFINITY;
        for _ in 0..5 {
            let started = Instant::now();
            let status = Command::new(env!("CARGO_BIN_EXE_cloakd"))
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args(["table", "anonymize", "examples/adult-ola.toml", "--output"])
                .arg(work.path().join("out.csv"))
                .args(["--k", &s.privacy.k.unwrap_or(1).to_string()])
                .args(["--max-suppression", &s.supp.to_string()])
                .args(["--metric", &s.metric.to_string()])
                .args(&s.flags)
                .output()
                .expect("cloakd runs");
            whole = whole.min(started.elapsed().as_secs_f64());
            if !status.status.success() {
                whole = f64::NAN;
                break;
            }
        }
        let arx = match &arx_dir {
            Some(dir) => {
                match arx(
                    dir,
                    &plain,
                    s.privacy.k.unwrap_or(1),
                    s.supp,
                    s.metric,
                    &s.flags,
                ) {
                    Ok(a) => {
                        let same = a.levels.len() == levels.len()
                            && a.levels.iter().zip(&levels).all(|(&x, &y)| x as usize == y);
                        format!(
                            " {} | {} | {} | {:.0} | {:.0} | {:.2} |",
                            if same {
                                "yes".to_string()
                            } else {
                                format!("no: {:?}", a.levels)
                            },
                            a.suppressed,
                            a.checks,
                            a.time_ms,
                            a.call_ms,
                            best / a.time_ms
                        )
                    }
                    Err(e) => format!(" {e} | | | | | |"),
                }
            }
            None => String::new(),
        };
        println!(
            "| {} | {node} | {suppressed} | {checked} | {best:.1} | {whole:.3} |{arx}",
            s.name
        );
    }
}
