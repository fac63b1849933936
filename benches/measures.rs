//! Criterion benchmark of the privacy/utility measures on UCI Adult (the repo's `examples/adult.toml`,
//! Li & Li's setup): mining the large populations and the query workload (the per-table baseline),
//! and measuring one release (Ploss, A_know, A_acc, Uloss, COUNT query error) for generalization
//! with k = 10 and k = 1000 and bucketization with k = 10. Run: `cargo bench --bench metrics`.
use std::hint::black_box;
use std::path::Path;

use cloakd::jobs::files::load_table;
use cloakd::measures::evaluate::{Baseline, EvaluationOptions, evaluate};
use cloakd::relational::anonymize;
use cloakd::relational::job::JobSpec;
use cloakd::relational::models::PrivacySpec;
use cloakd::relational::release::ReleaseMethod;
use cloakd::relational::table::Table;
use criterion::{Criterion, criterion_group, criterion_main};

fn adult() -> Table {
    let job_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/adult.toml");
    let text = std::fs::read_to_string(&job_path).expect("examples/adult.toml");
    let job = JobSpec::parse("adult.toml", &text).expect("valid job");
    load_table(&job, &job_path, None).expect("adult loads")
}

fn measures(c: &mut Criterion) {
    let table = adult();
    let options = EvaluationOptions::default();
    let mut group = c.benchmark_group("metrics");
    group.sample_size(10);
    group.bench_function("baseline (populations + 1000 queries)", |b| {
        b.iter(|| black_box(Baseline::new(&table, options).expect("options")))
    });
    let baseline = Baseline::new(&table, options).expect("options");
    for (k, method) in [
        (10, ReleaseMethod::Generalization),
        (1000, ReleaseMethod::Generalization),
        (10, ReleaseMethod::Bucketization),
    ] {
        let spec = PrivacySpec {
            k: Some(k),
            ..PrivacySpec::default()
        };
        let (release, _) = anonymize(&table, &spec, method, 7).expect("k-anonymous release");
        group.bench_function(format!("evaluate k={k} {method}"), |b| {
            b.iter(|| black_box(evaluate(&table, &baseline, &release).expect("measurable")))
        });
    }
    group.finish();
}

criterion_group!(benches, measures);
criterion_main!(benches);
