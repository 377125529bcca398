//! Analytic reference: Desnoyers' model of greedy cleaning under uniform random
//! overwrites (the same model as the cleaner's benchmark).

/// Greedy WAF for logical / physical ratio `alpha` in (0, 1): `1 / (1 - u)` where the
/// victims' utilisation `u` solves `(u - 1) / ln u = alpha`. Out-of-range ratios give
/// infinity (no room) or 1 (nothing to clean).
pub fn greedy_waf(alpha: f64) -> f64 {
    if alpha.is_nan() || alpha >= 1.0 {
        return f64::INFINITY;
    }
    if alpha <= 0.0 {
        return 1.0;
    }
    // The left side rises with u on (0, 1): bisection.
    let (mut lo, mut hi) = (1e-12f64, 1.0 - 1e-12);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if (mid - 1.0) / mid.ln() < alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    1.0 / (1.0 - (lo + hi) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_points() {
        // u solves (u - 1) / ln u = alpha; check by substitution, and the limits.
        for alpha in [0.3, 0.64, 0.8, 0.9] {
            let u = 1.0 - 1.0 / greedy_waf(alpha);
            assert!(((u - 1.0) / u.ln() - alpha).abs() < 1e-9, "{alpha}");
        }
        assert!((greedy_waf(0.64) - 1.610).abs() < 0.001);
        assert!(greedy_waf(0.8) > greedy_waf(0.64));
        assert_eq!(greedy_waf(1.0), f64::INFINITY);
        assert_eq!(greedy_waf(0.0), 1.0);
    }
}
