//! C4.5's pessimistic error estimate (Weka's `Stats.addErrs`) and the inverse of the standard normal
//! distribution it needs (Weka's `Statistics.normalInverse`, the Cephes `ndtri` approximation).
//!
//! Invariants: pure functions of their arguments; the confidence is rounded to `f32` first, as Weka
//! stores it, so `1 - CF` and `CF^(1/N)` are computed from the same numbers Weka computes them from.

/// The errors to add to `errors` observed among `total` training rows for an upper confidence
/// bound at confidence `confidence` (Weka's default 0.25). 0 for a confidence above 0.5 (Weka warns
/// and leaves the estimate unmodified).
pub fn add_errs(total: f64, errors: f64, confidence: f64) -> f64 {
    let cf = confidence as f32;
    if f64::from(cf) > 0.5 {
        return 0.0;
    }
    if errors < 1.0 {
        // The base case (no error) from the Geigy Scientific Tables, interpolated up to one error.
        let base = total * (1.0 - f64::from(cf).powf(1.0 / total));
        if errors == 0.0 {
            return base;
        }
        return base + errors * (add_errs(total, 1.0, confidence) - base);
    }
    if errors + 0.5 >= total {
        return (total - errors).max(0.0);
    }
    let z = normal_inverse(f64::from(1.0f32 - cf));
    let f = (errors + 0.5) / total;
    let r = (f
        + (z * z) / (2.0 * total)
        + z * ((f / total) - (f * f / total) + (z * z / (4.0 * total * total))).sqrt())
        / (1.0 + (z * z) / total);
    (r * total) - errors
}

// Cephes' coefficients as Weka's `Statistics` spells them (more digits than an f64 holds).
#[allow(clippy::excessive_precision)]
const P0: [f64; 5] = [
    -5.99633501014107895267e1,
    9.80010754185999661536e1,
    -5.66762857469070293439e1,
    1.39312609387279679503e1,
    -1.23916583867381258016e0,
];
#[allow(clippy::excessive_precision)]
const Q0: [f64; 8] = [
    1.95448858338141759834e0,
    4.67627912898881538453e0,
    8.63602421390890590575e1,
    -2.25462687854119370527e2,
    2.00260212380060660359e2,
    -8.20372256168333339912e1,
    1.59056225126211695515e1,
    -1.18331621121330003142e0,
];
#[allow(clippy::excessive_precision)]
const P1: [f64; 9] = [
    4.05544892305962419923e0,
    3.15251094599893866154e1,
    5.71628192246421288162e1,
    4.40805073893200834700e1,
    1.46849561928858024014e1,
    2.18663306850790267539e0,
    -1.40256079171354495875e-1,
    -3.50424626827848203418e-2,
    -8.57456785154685413611e-4,
];
#[allow(clippy::excessive_precision)]
const Q1: [f64; 8] = [
    1.57799883256466749731e1,
    4.53907635128879210584e1,
    4.13172038254672030440e1,
    1.50425385692907503408e1,
    2.50464946208309415979e0,
    -1.42182922854787788574e-1,
    -3.80806407691578277194e-2,
    -9.33259480895457427372e-4,
];
#[allow(clippy::excessive_precision)]
const P2: [f64; 9] = [
    3.23774891776946035970e0,
    6.91522889068984211695e0,
    3.93881025292474443415e0,
    1.33303460815807542389e0,
    2.01485389549179081538e-1,
    1.23716634817820021358e-2,
    3.01581553508235416007e-4,
    2.65806974686737550832e-6,
    6.23974539184983293730e-9,
];
#[allow(clippy::excessive_precision)]
const Q2: [f64; 8] = [
    6.02427039364742014255e0,
    3.67983563856160859403e0,
    1.37702099489081330271e0,
    2.16236993594496635890e-1,
    1.34204006088543189037e-2,
    3.28014464682127739104e-4,
    2.89247864745380683936e-6,
    6.79019408009981274425e-9,
];

/// `coefficients[0] x^n + ... + coefficients[n]`.
fn polevl(x: f64, coefficients: &[f64]) -> f64 {
    coefficients[1..]
        .iter()
        .fold(coefficients[0], |sum, c| sum * x + c)
}

/// `x^n + coefficients[0] x^(n-1) + ... + coefficients[n-1]` (a leading coefficient of 1).
fn p1evl(x: f64, coefficients: &[f64]) -> f64 {
    coefficients[1..]
        .iter()
        .fold(x + coefficients[0], |sum, c| sum * x + c)
}

/// The `x` with `P(Z <= x) = p` for a standard normal `Z`, `0 < p < 1` (NaN outside).
pub fn normal_inverse(p: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    #[allow(clippy::excessive_precision)]
    const EXP_MINUS_2: f64 = 0.13533528323661269189;
    let s2pi = (2.0 * std::f64::consts::PI).sqrt();
    let mut y = p;
    let mut negate = true;
    if y > 1.0 - EXP_MINUS_2 {
        y = 1.0 - y;
        negate = false;
    }
    if y > EXP_MINUS_2 {
        let y = y - 0.5;
        let y2 = y * y;
        let x = y + y * (y2 * polevl(y2, &P0) / p1evl(y2, &Q0));
        return x * s2pi;
    }
    let x = (-2.0 * y.ln()).sqrt();
    let x0 = x - x.ln() / x;
    let z = 1.0 / x;
    let x1 = if x < 8.0 {
        z * polevl(z, &P1) / p1evl(z, &Q1)
    } else {
        z * polevl(z, &P2) / p1evl(z, &Q2)
    };
    let x = x0 - x1;
    if negate { -x } else { x }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_inverse_is_the_quantile() {
        assert!((normal_inverse(0.75) - 0.674_489_750_196_081_7).abs() < 1e-15);
        assert!((normal_inverse(0.975) - 1.959_963_984_540_054).abs() < 1e-14);
        assert!((normal_inverse(0.01) + 2.326_347_874_040_841).abs() < 1e-14);
        assert!((normal_inverse(1e-20) + 9.262_340_089_798_408).abs() < 1e-12);
        assert!(normal_inverse(0.0).is_nan() && normal_inverse(1.0).is_nan());
    }
}
