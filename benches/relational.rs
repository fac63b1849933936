//! Criterion benchmark of the relational engine on UCI Adult (the repo's `examples/adult.toml`: QI
//! age, workclass, education, marital-status, race, sex; sensitive occupation): engine time of
//! `relational::anonymize` (Mondrian + generalization release + report from the released rows) for
//! k in {10, 100, 1000}, a few other models, and the CSV load. Run: `cargo bench --bench relational`.
use std::hint::black_box;
use std::io::Read;
use std::path::Path;

use cloakd::relational::anonymize;
use cloakd::relational::hierarchy::Hierarchy;
use cloakd::relational::job::JobSpec;
use cloakd::relational::models::{LDiversity, PrivacySpec, TCloseness};
use cloakd::relational::release::ReleaseMethod;
use cloakd::relational::table::{Table, TableSchema, read_csv};
use criterion::{Criterion, criterion_group, criterion_main};

fn adult() -> (TableSchema, Vec<u8>) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let job_path = examples.join("adult.toml");
    let text = std::fs::read_to_string(&job_path).expect("examples/adult.toml");
    let job = JobSpec::parse("adult.toml", &text).expect("valid job");
    let schema = job
        .schema(|path, _| -> Result<Hierarchy, String> {
            let text = std::fs::read_to_string(examples.join(path)).map_err(|e| e.to_string())?;
            Hierarchy::parse(path, &text).map_err(|e| e.to_string())
        })
        .expect("hierarchies");
    let mut csv = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(examples.join("data/adult.csv.gz")).expect("adult.csv.gz"),
    )
    .read_to_end(&mut csv)
    .expect("gunzip");
    (schema, csv)
}

fn load(schema: &TableSchema, csv: &[u8]) -> Table {
    read_csv(schema.clone(), csv, "adult.csv", b',').expect("adult loads")
}

fn bench(c: &mut Criterion) {
    let (schema, csv) = adult();
    let table = load(&schema, &csv);
    let mut group = c.benchmark_group("adult");
    group.sample_size(20);
    group.bench_function("load_csv", |b| b.iter(|| load(&schema, black_box(&csv))));
    for k in [10, 100, 1000] {
        let privacy = PrivacySpec {
            k: Some(k),
            ..Default::default()
        };
        group.bench_function(format!("mondrian_k{k}_generalization"), |b| {
            b.iter(|| anonymize(&table, &privacy, ReleaseMethod::Generalization, 7).expect("k"))
        });
    }
    let cases = [
        (
            "k10_l_distinct3_bucketization",
            PrivacySpec {
                k: Some(10),
                l: Some(LDiversity::Distinct(3.0)),
                ..Default::default()
            },
            ReleaseMethod::Bucketization,
        ),
        (
            "t_emd0.2",
            PrivacySpec {
                t: "emd:0.2".parse::<TCloseness>().ok(),
                ..Default::default()
            },
            ReleaseMethod::Generalization,
        ),
        (
            "t_js0.05",
            PrivacySpec {
                t: "js:0.05".parse::<TCloseness>().ok(),
                ..Default::default()
            },
            ReleaseMethod::Generalization,
        ),
        (
            "delta1.2",
            PrivacySpec {
                delta: Some(1.2),
                ..Default::default()
            },
            ReleaseMethod::Generalization,
        ),
    ];
    for (name, privacy, method) in cases {
        group.bench_function(name, |b| {
            b.iter(|| anonymize(&table, &privacy, method, 7).expect("model met"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
