//! Wear levelling on a skewed workload (issue 18): with it, the segments' reuse counts
//! stay close together; without it, cold data pins segments while hot ones cycle.

use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig, SimReport};
use replay::workload::{generate, Workload};

/// 256 MiB: at 64 MiB (81 segments for 8 streams) the WAF with wear levelling against
/// without swings by seed (six seeds: -2.3% to +5.0% with relocations always on the most
/// worn, +3.3% to +5.8% with free segments chosen by stream life); at 256 MiB both are 3%
/// to 6% below no levelling on three seeds, as on the 8G target command (-3.6%).
fn run(wear_levelling: bool) -> SimReport {
    replay(65536, "zipf:0.99", Policy::Greedy, wear_levelling)
}

/// 64 MiB logical, 1 MiB segments, 80% utilised, 12 overwrites, the online classifier.
fn replay_small(workload: &str, policy: Policy, wear_levelling: bool) -> SimReport {
    replay(16384, workload, policy, wear_levelling)
}

/// `capacity` blocks, 1 MiB segments, 80% utilised, 12 overwrites, the online classifier.
fn replay(capacity: u64, workload: &str, policy: Policy, wear_levelling: bool) -> SimReport {
    let logical = capacity * 8 / 10;
    let w: Workload = workload.parse().unwrap();
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
        policy,
        restarts: 0,
        series_points: 10,
    };
    simulate(&ops, &cfg, &mut |_, _| {}).unwrap()
}

/// With wear levelling the spread of reuse counts (max/mean) ends below `bound`, without
/// it above, and levelling costs at most 3% of the WAF.
fn assert_levelled_at_little_cost(on: &SimReport, off: &SimReport, bound: f64) {
    assert!(
        on.wear.max_over_mean < bound && off.wear.max_over_mean > bound,
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

#[test]
fn wear_levelling_keeps_reuse_counts_together_at_little_cost() {
    let (on, off) = (run(true), run(false));
    assert_eq!(off.wear_victims, 0);
    assert!(on.wear_victims > 0, "{:?}", on.wear);
    assert_levelled_at_little_cost(&on, &off, 1.3);
}

/// Under the daemon's policy (cost-hotness) the classifier's hot streams are opened by
/// relocations too (hot blocks survive young victims). Choosing the end of the free list
/// by the opener alone gave such a stream the most worn segments, and the spread grew
/// past what static wear levelling's 2% budget could take back: hotcold:90/10 here ended
/// at max/mean 2.2 to 2.9 with levelling (four seeds; this one, seed 5: 2.51, and 2.12
/// without levelling). By how long each stream's segments live (`StreamLives`,
/// `Segments::allocate`) it ends at 1.2 to 1.4.
#[test]
fn under_cost_hotness_hot_streams_take_the_least_worn_segments() {
    let (on, off) = (
        replay_small("hotcold:90/10", Policy::CostHotness, true),
        replay_small("hotcold:90/10", Policy::CostHotness, false),
    );
    assert_levelled_at_little_cost(&on, &off, 1.6);
}
