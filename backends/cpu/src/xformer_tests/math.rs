//! The `f32` math functions the fused kernels share (`erf32`, `exp32`, `gelu_tanh32`,
//! `sigmoid32`) against their `f64` definitions, in ulps.

#[test]
fn the_f32_erf_is_within_a_few_ulps_of_the_f64_one() {
    let mut worst = 0.0f64;
    for i in -60_000..=60_000 {
        let x = i as f32 * 1e-4;
        let got = f64::from(crate::norm::erf32(x));
        let want = crate::elementwise::erf64(f64::from(x));
        worst = worst.max((got - want).abs());
    }
    assert!(worst < 5e-7, "worst |erf32 - erf64| = {worst:e}");
    // Saturates (within one ulp of ±1) far out.
    assert!((crate::norm::erf32(10.0) - 1.0).abs() <= f32::EPSILON);
    assert!((crate::norm::erf32(-1e30) + 1.0).abs() <= f32::EPSILON);
    assert!(crate::norm::erf32(f32::NAN).is_nan());
    assert_eq!(crate::norm::erf32(0.0), 0.0);
}

#[test]
fn the_f32_exp_is_within_two_ulps_of_std() {
    let mut worst = 0.0f32;
    for i in -873_000..=883_000 {
        let x = i as f32 * 1e-4;
        let (got, want) = (crate::attention::exp32(x), x.exp());
        if want >= f32::MIN_POSITIVE {
            worst = worst.max(((got - want) / want).abs());
        }
    }
    assert!(worst < 2.5 * f32::EPSILON, "worst relative error {worst:e}");
    assert_eq!(crate::attention::exp32(f32::NEG_INFINITY), 0.0);
    assert_eq!(crate::attention::exp32(-1e30), 0.0);
    assert!(crate::attention::exp32(f32::NAN).is_nan());
    assert_eq!(crate::attention::exp32(0.0), 1.0);
}

#[test]
fn the_f32_exp_takes_2_to_the_n_from_bits_as_the_integer_conversion_gave_it() {
    // exp32 reads n out of the rounding sum's bits; before, it converted n to an integer.
    // The scale is the same, so every result keeps its bits.
    let by_conversion = |x: f32| {
        const MAGIC: f32 = 12_582_912.0;
        let xc = x.clamp(-87.3, 88.3);
        let n = xc.mul_add(std::f32::consts::LOG2_E, MAGIC) - MAGIC;
        let r = (-n).mul_add(-2.121_944_4e-4, (-n).mul_add(0.693_359_4, xc));
        let mut y = 1.987_569_1e-4_f32;
        for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            y = y.mul_add(r, c);
        }
        y = (y * r).mul_add(r, r) + 1.0;
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x < -87.3 { 0.0 } else { y * scale }
    };
    let specials = [
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        88.3,
        -87.3,
        88.29,
        -87.29,
        -0.0,
    ];
    for x in (-900_000..=900_000)
        .map(|i| i as f32 * 1e-4)
        .chain(specials)
    {
        let (got, want) = (crate::attention::exp32(x), by_conversion(x));
        assert_eq!(got.to_bits(), want.to_bits(), "exp32({x})");
    }
}

#[test]
fn the_f32_tanh_gelu_is_within_6e7_of_its_f64_definition() {
    // gelu_tanh32 computes x · sigmoid(2y); the definition (gelu_tanh64) is 0.5 x (1 + tanh(y)).
    let def = crate::elementwise::gelu_tanh64;
    let mut worst = 0.0f64;
    for i in -300_000..=300_000 {
        let x = i as f32 * 1e-4;
        let got = f64::from(crate::elementwise::gelu_tanh32(x));
        let want = def(f64::from(x));
        worst = worst.max((got - want).abs());
        // Relative near zero, where the value is small.
        if x != 0.0 && x.abs() < 1e-2 {
            assert!(
                ((got - want) / want).abs() < 4.0 * f64::from(f32::EPSILON),
                "at {x}"
            );
        }
    }
    assert!(worst < 6e-7, "worst |gelu_tanh32 - definition| = {worst:e}");
    assert_eq!(crate::elementwise::gelu_tanh32(0.0), 0.0);
    assert_eq!(crate::elementwise::gelu_tanh32(100.0), 100.0);
    // Far left the value is -0 (exact) or a negative of at most 1e-35 (exp32 saturates).
    let far = crate::elementwise::gelu_tanh32(-100.0);
    assert!(far <= 0.0 && far > -1e-35, "gelu_tanh32(-100) = {far:e}");
    assert_eq!(
        crate::elementwise::gelu_tanh32(f32::INFINITY),
        f32::INFINITY
    );
    assert!(crate::elementwise::gelu_tanh32(f32::NAN).is_nan());
}

#[test]
fn the_f32_sigmoid_is_within_three_ulps_of_its_f64_definition() {
    // sigmoid32 reads e^-x from exp32; against 1 / (1 + e^-x) in f64, relative where the
    // result is a normal float, and the ends: 0 below -88.3 (where expf overflows from
    // -88.73, a denormal between), 1 at +inf, NaN through.
    let mut worst = 0.0f64;
    for i in -880_000..=880_000 {
        let x = i as f32 * 1e-4;
        let want = 1.0 / (1.0 + (-f64::from(x)).exp());
        let got = f64::from(crate::elementwise::sigmoid32(x));
        if want >= f64::from(f32::MIN_POSITIVE) {
            worst = worst.max(((got - want) / want).abs());
        } else {
            assert!(
                (got - want).abs() <= 5e-39,
                "sigmoid32({x}) = {got:e}, want {want:e}"
            );
        }
    }
    assert!(
        worst < 3.0 * f64::from(f32::EPSILON),
        "worst relative error {worst:e}"
    );
    let s = crate::elementwise::sigmoid32;
    assert_eq!(s(f32::NEG_INFINITY), 0.0);
    assert_eq!(s(-1e30), 0.0);
    assert_eq!(s(f32::INFINITY), 1.0);
    assert_eq!(s(0.0), 0.5);
    assert!(s(f32::NAN).is_nan());
}
