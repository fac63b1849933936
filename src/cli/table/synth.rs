//! `cloakd table synth` (hidden): a synthetic table with the schema of the Adult examples (for the
//! 10-million-row benchmark), written through a staged file.
use std::io::Write;
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::anonymize::Staged;

#[derive(Debug, clap::Args)]
pub struct SynthArgs {
    /// Number of rows.
    #[arg(long)]
    pub rows: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output CSV.
    #[arg(long)]
    pub output: PathBuf,
}

const WORKCLASS: &[&str] = &[
    "Private",
    "Self-emp-not-inc",
    "Self-emp-inc",
    "Federal-gov",
    "Local-gov",
    "State-gov",
    "Without-pay",
];
const EDUCATION: &[&str] = &[
    "Bachelors",
    "Some-college",
    "11th",
    "HS-grad",
    "Prof-school",
    "Assoc-acdm",
    "Assoc-voc",
    "9th",
    "7th-8th",
    "12th",
    "Masters",
    "1st-4th",
    "10th",
    "Doctorate",
    "5th-6th",
    "Preschool",
];
const MARITAL: &[&str] = &[
    "Married-civ-spouse",
    "Divorced",
    "Never-married",
    "Separated",
    "Widowed",
    "Married-spouse-absent",
    "Married-AF-spouse",
];
const RACE: &[&str] = &[
    "White",
    "Asian-Pac-Islander",
    "Amer-Indian-Eskimo",
    "Other",
    "Black",
];
const SEX: &[&str] = &["Male", "Female"];
const OCCUPATION: &[&str] = &[
    "Tech-support",
    "Craft-repair",
    "Other-service",
    "Sales",
    "Exec-managerial",
    "Prof-specialty",
    "Handlers-cleaners",
    "Machine-op-inspct",
    "Adm-clerical",
    "Farming-fishing",
    "Transport-moving",
    "Priv-house-serv",
    "Protective-serv",
    "Armed-Forces",
];

/// Draws index i with probability proportional to 1/(i+1) (a Zipf-like skew, as in Adult's columns).
fn skewed(rng: &mut impl Rng, n: usize) -> usize {
    let total: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
    let mut x = rng.random::<f64>() * total;
    for i in 0..n {
        x -= 1.0 / (i + 1) as f64;
        if x <= 0.0 {
            return i;
        }
    }
    n - 1
}

/// Writes `rows` synthetic rows with the columns of the Adult examples (age 17-90; categorical values
/// from the Adult hierarchies, Zipf-like frequencies; attributes independent).
pub(super) fn synth(args: SynthArgs) -> anyhow::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut out = Staged::new(&args.output)?;
    out.write(|w| {
        writeln!(
            w,
            "age,workclass,education,marital-status,occupation,race,sex"
        )?;
        for _ in 0..args.rows {
            let age: u32 = 17 + (rng.random::<f64>().powf(1.5) * 74.0) as u32;
            writeln!(
                w,
                "{age},{},{},{},{},{},{}",
                WORKCLASS[skewed(&mut rng, WORKCLASS.len())],
                EDUCATION[skewed(&mut rng, EDUCATION.len())],
                MARITAL[skewed(&mut rng, MARITAL.len())],
                OCCUPATION[rng.random_range(0..OCCUPATION.len())],
                RACE[skewed(&mut rng, RACE.len())],
                SEX[rng.random_range(0..SEX.len())],
            )?;
        }
        Ok(())
    })?;
    out.commit()
}
