//! Wear levelling on a skewed workload (issue 18): with it, the segments' reuse counts
//! stay close together; without it, cold data pins segments while hot ones cycle.

use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig, SimReport};
use replay::workload::{generate, Workload};

fn run(wear_levelling: bool) -> SimReport {
    let capacity = 16384; // 64 MiB logical
    let logical = capacity * 8 / 10;
    let w: Workload = "zipf:0.99".parse().unwrap();
    let ops = generate(&w, logical, 12 * logical, 5);
    let cfg = SimConfig {
        capacity_blocks: capacity,
        op_permille: 200,
        segment_bytes: Some(1 << 20),
        classifier: ClassifierKind::Online,
        classes: 7,
        tracked_blocks: None,
        wear_levelling,
        write_probabilities: None,
        policy: Policy::Greedy,
        series_points: 10,
    };
    simulate(&ops, &cfg, &mut |_, _| {}).unwrap()
}

#[test]
fn wear_levelling_keeps_reuse_counts_together_at_little_cost() {
    let (on, off) = (run(true), run(false));
    assert_eq!(off.wear_victims, 0);
    assert!(on.wear_victims > 0, "{:?}", on.wear);
    assert!(
        on.wear.max_over_mean < 1.3 && on.wear.max_over_mean < off.wear.max_over_mean,
        "on {:?}, off {:?}",
        on.wear,
        off.wear
    );
    assert!(
        on.waf_steady < 1.03 * off.waf_steady,
        "WAF {} with wear levelling, {} without",
        on.waf_steady,
        off.waf_steady
    );
}
