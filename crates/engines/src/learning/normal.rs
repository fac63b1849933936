//! Weka's `weka.core.Statistics.normalProbability` (Cephes' `ndtr`), constant for constant, so that
//! Naive Bayes' numeric likelihoods are Weka's to the last bit.
//!
//! Invariants: pure functions of their argument; the coefficients are Cephes' as Weka writes them
//! (hence more digits than an f64 holds).
#![allow(clippy::excessive_precision)]

// Weka's `weka.core.Statistics.normalProbability` (Cephes' ndtr), constant for constant.
const SQRTH: f64 = std::f64::consts::FRAC_1_SQRT_2;
const MAXLOG: f64 = 7.097_827_128_933_839_967_32E2;

fn polevl(x: f64, coef: &[f64]) -> f64 {
    coef[1..].iter().fold(coef[0], |ans, &c| ans * x + c)
}

fn p1evl(x: f64, coef: &[f64]) -> f64 {
    coef[1..].iter().fold(x + coef[0], |ans, &c| ans * x + c)
}

fn error_function(x: f64) -> f64 {
    const T: [f64; 5] = [
        9.604_973_739_870_516_387_49E0,
        9.002_601_972_038_426_892_17E1,
        2.232_005_345_946_843_192_26E3,
        7.003_325_141_128_050_754_73E3,
        5.559_230_130_103_949_627_68E4,
    ];
    const U: [f64; 5] = [
        3.356_171_416_475_030_996_47E1,
        5.213_579_497_801_526_797_95E2,
        4.594_323_829_709_801_279_87E3,
        2.262_900_006_138_909_342_46E4,
        4.926_739_426_086_359_210_86E4,
    ];
    if x.abs() > 1.0 {
        return 1.0 - error_function_complemented(x);
    }
    let z = x * x;
    x * polevl(z, &T) / p1evl(z, &U)
}

fn error_function_complemented(a: f64) -> f64 {
    const P: [f64; 9] = [
        2.461_969_814_735_305_125_24E-10,
        5.641_895_648_310_688_219_77E-1,
        7.463_210_564_422_699_126_87E0,
        4.863_719_709_856_813_666_14E1,
        1.965_208_329_560_770_982_42E2,
        5.264_451_949_954_773_586_31E2,
        9.345_285_271_719_576_075_40E2,
        1.027_551_886_895_157_102_72E3,
        5.575_353_353_693_993_275_26E2,
    ];
    const Q: [f64; 8] = [
        1.322_819_511_547_449_925_08E1,
        8.670_721_408_859_897_423_29E1,
        3.549_377_788_878_198_910_62E2,
        9.757_085_017_432_054_897_53E2,
        1.823_909_166_879_097_362_89E3,
        2.246_337_608_187_109_817_92E3,
        1.656_663_091_941_613_501_82E3,
        5.575_353_408_177_276_755_46E2,
    ];
    const R: [f64; 6] = [
        5.641_895_835_477_550_739_84E-1,
        1.275_366_707_599_781_044_16E0,
        5.019_050_422_511_804_774_14E0,
        6.160_210_979_930_535_851_95E0,
        7.409_742_699_504_489_391_60E0,
        2.978_866_653_721_002_406_70E0,
    ];
    const S: [f64; 6] = [
        2.260_528_632_201_172_765_90E0,
        9.396_035_249_380_014_346_73E0,
        1.204_895_398_080_966_566_05E1,
        1.708_144_507_475_658_972_22E1,
        9.608_968_090_632_858_781_98E0,
        3.369_076_451_000_815_160_50E0,
    ];
    let x = a.abs();
    if x < 1.0 {
        return 1.0 - error_function(a);
    }
    let z = -a * a;
    if z < -MAXLOG {
        return if a < 0.0 { 2.0 } else { 0.0 };
    }
    let z = z.exp();
    let (p, q) = if x < 8.0 {
        (polevl(x, &P), p1evl(x, &Q))
    } else {
        (polevl(x, &R), p1evl(x, &S))
    };
    let mut y = (z * p) / q;
    if a < 0.0 {
        y = 2.0 - y;
    }
    if y == 0.0 {
        return if a < 0.0 { 2.0 } else { 0.0 };
    }
    y
}

/// The standard normal distribution function at `a`.
pub(super) fn normal_probability(a: f64) -> f64 {
    let x = a * SQRTH;
    let z = x.abs();
    if z < SQRTH {
        0.5 + 0.5 * error_function(x)
    } else {
        let y = 0.5 * error_function_complemented(z);
        if x > 0.0 { 1.0 - y } else { y }
    }
}
