//! The radial part of the planar Laplace mechanism: t = epsilon * r follows Gamma(2, 1), whose CDF is
//! C(t) = 1 - (1 + t) e^(-t). Its inverse is t = -1 - W_{-1}((p - 1)/e) (Lambert W, lower branch).
//!
//! Invariants: every function here is total on its stated domain and returns a finite t >= 0; no
//! input makes it loop forever (Newton steps are capped). Precision: the draw never goes through
//! `1 - p` in floating point. It picks one half of the distribution with a fair bit and a uniform
//! P in (0, 1/2] with full relative precision at every scale (mantissa and geometric exponent), then
//! solves C(t) = P on the lower half (series near 0, so tiny radii keep their precision) or
//! S(t) = 1 - C(t) = P on the upper half, in the log form ln(1 + t) - t = ln P, which is
//! W_{-1}(-P/e) = -(1 + t) evaluated without cancellation (so the tail is drawn down to P ~ 2^-1022,
//! t ~ 715, instead of stopping at t ~ 37 as 1 - p with a 53-bit p does).

use rand::RngCore;

/// The median of Gamma(2, 1): C(T_MEDIAN) = 1/2.
pub const T_MEDIAN: f64 = 1.678_346_990_016_660_5;

/// More than the largest t the draw can return (P >= 2^-1022 on the upper half): bounds float errors.
pub const T_MAX: f64 = 760.0;

/// C(t) = 1 - (1 + t) e^(-t), accurate in relative terms also for tiny t (series below 1).
pub fn cdf(t: f64) -> f64 {
    if t <= 0.0 {
        return 0.0;
    }
    if t < 1.0 {
        // C(t) = sum_{n>=2} (-1)^n (n - 1) t^n / n!
        let mut term = t * t / 2.0; // t^n / n! at n = 2
        let mut sign = 1.0;
        let mut sum = 0.0;
        for n in 2..40 {
            let n = f64::from(n);
            sum += sign * term * (n - 1.0);
            sign = -sign;
            term *= t / (n + 1.0);
        }
        sum
    } else {
        -((1.0 + t) * (-t).exp() - 1.0)
    }
}

/// ln S(t) = ln(1 + t) - t, the log of the survival function.
pub fn ln_survival(t: f64) -> f64 {
    t.ln_1p() - t
}

/// The t in [0, T_MEDIAN] with C(t) = p, for p in (0, 1/2].
pub fn inverse_cdf_lower(p: f64) -> f64 {
    if p.is_nan() || p <= 0.0 {
        return 0.0;
    }
    let p = p.min(0.5);
    let ln_p = p.ln();
    // C(t) ~ t^2/2 near 0.
    let mut t = (2.0 * p).sqrt().min(T_MEDIAN);
    for _ in 0..100 {
        let c = cdf(t);
        if c <= 0.0 {
            t = t.max(f64::MIN_POSITIVE) * 2.0;
            continue;
        }
        // Newton on ln C(t) = ln p: d/dt ln C = t e^(-t) / C(t).
        let slope = t * (-t).exp() / c;
        // max/min rather than clamp: no panic even if t were NaN.
        let next = (t - (c.ln() - ln_p) / slope)
            .max(t / 4.0)
            .min(T_MEDIAN * 1.5);
        let done = (next - t).abs() <= 2.0 * f64::EPSILON * t;
        t = next;
        if done {
            break;
        }
    }
    t.clamp(0.0, T_MEDIAN)
}

/// The t >= T_MEDIAN with S(t) = q, given ln q for q in (0, 1/2]: t = -1 - W_{-1}(-q/e).
pub fn inverse_survival_upper(ln_q: f64) -> f64 {
    if ln_q.is_nan() {
        return T_MEDIAN;
    }
    let ln_q = ln_q.clamp(-T_MAX, -std::f64::consts::LN_2);
    // Asymptotically t ~ -ln q + ln(1 - ln q).
    let mut t = (-ln_q + (1.0 - ln_q).ln()).max(T_MEDIAN);
    for _ in 0..100 {
        // f(t) = ln(1 + t) - t - ln q, f'(t) = -t / (1 + t); f is concave and decreasing.
        let f = ln_survival(t) - ln_q;
        let next = (t + f * (1.0 + t) / t).max(T_MEDIAN);
        let done = (next - t).abs() <= 2.0 * f64::EPSILON * t;
        t = next;
        if done {
            break;
        }
    }
    t.max(T_MEDIAN)
}

/// The t with C(t) = p for any p in (0, 1) (the retrieval radius' confidence).
pub fn inverse_cdf(p: f64) -> f64 {
    if p <= 0.5 {
        inverse_cdf_lower(p)
    } else {
        inverse_survival_upper((-p).ln_1p())
    }
}

/// A uniform number in (0, 1/2] with full relative precision at every scale: P = (1 + f) 2^-(k + 2)
/// with k geometric (the leading zero bits of a random stream, capped at 1020 so P stays normal) and f a 52-bit fraction
/// plus half a step (so P never hits an endpoint of its binade).
pub fn half_unit<R: RngCore + ?Sized>(rng: &mut R) -> f64 {
    let mut k: i32 = 0;
    loop {
        let word = rng.next_u64();
        if word != 0 {
            // leading_zeros of a nonzero u64 is at most 63.
            k += word.leading_zeros() as i32;
            break;
        }
        k += 64;
        if k >= 1020 {
            break;
        }
    }
    let k = k.min(1020);
    let fraction = ((rng.next_u64() >> 12) as f64 + 0.5) / (1u64 << 52) as f64;
    // 2^-(k + 2) in two steps so no intermediate underflows to zero before the last.
    (1.0 + fraction) * 0.25 * 2f64.powi(-k)
}

/// One draw of t = epsilon * r from Gamma(2, 1).
pub fn draw_t<R: RngCore + ?Sized>(rng: &mut R) -> f64 {
    let upper = rng.next_u32() & 1 == 1;
    let p = half_unit(rng);
    if upper {
        inverse_survival_upper(p.ln())
    } else {
        inverse_cdf_lower(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_cdf_inverts_the_cdf_across_scales() {
        for &p in &[1e-300, 1e-30, 1e-12, 1e-6, 0.01, 0.2, 0.5] {
            let t = inverse_cdf_lower(p);
            let back = cdf(t);
            assert!(((back - p) / p).abs() < 1e-12, "p {p}: t {t}, C(t) {back}");
        }
        for &q in &[0.5, 0.1, 1e-6, 1e-40, 1e-300] {
            let t = inverse_survival_upper(f64::ln(q));
            let back = ln_survival(t);
            assert!(
                (back - q.ln()).abs() < 1e-12 * q.ln().abs().max(1.0),
                "q {q}: t {t}"
            );
        }
        assert!((cdf(T_MEDIAN) - 0.5).abs() < 1e-15);
        // The 95 % radius of Gamma(2, 1) is 4.7439 (to 4 decimals).
        let t95 = inverse_cdf(0.95);
        assert!((t95 - 4.7439).abs() < 1e-3, "{t95}");
        assert!((cdf(t95) - 0.95).abs() < 1e-14, "{t95}");
    }

    #[test]
    fn half_unit_stays_in_its_interval() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        for _ in 0..10_000 {
            let p = half_unit(&mut rng);
            assert!(p > 0.0 && p <= 0.5, "{p}");
        }
    }
}
