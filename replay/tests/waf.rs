//! Write amplification measured by replay: determinism, and the ordering the streams
//! must achieve (uniform: no classifier helps or hurts; skewed: online streams cut WAF).

use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig, SimReport};
use replay::workload::{generate, write_probabilities, Workload};

fn run_with(workload: &str, classifier: ClassifierKind, policy: Policy, seed: u64) -> SimReport {
    let capacity = 16384; // 64 MiB logical
    let logical = capacity * 8 / 10; // 80% logical utilisation
    let w: Workload = workload.parse().unwrap();
    let ops = generate(&w, logical, 6 * logical, seed);
    let cfg = SimConfig {
        capacity_blocks: capacity,
        op_permille: 200,
        segment_bytes: Some(1 << 20),
        classifier,
        classes: 7,
        tracked_blocks: None,
        wear_levelling: true,
        write_probabilities: Some(write_probabilities(&w, logical, seed).into()),
        policy,
        restarts: 0,
        series_points: 20,
    };
    simulate(&ops, &cfg, &mut |_, _| {}).unwrap()
}

fn run(workload: &str, classifier: ClassifierKind, seed: u64) -> SimReport {
    run_with(workload, classifier, Policy::Greedy, seed)
}

#[test]
fn same_seed_same_waf() {
    let a = run("hotcold:90/10", ClassifierKind::Online, 5);
    let b = run("hotcold:90/10", ClassifierKind::Online, 5);
    assert_eq!(a.backing_blocks, b.backing_blocks);
    assert_eq!(a.waf_series, b.waf_series);
}

#[test]
fn uniform_no_classifier_helps_or_hurts_much_skewed_streams_help() {
    let none = run("uniform", ClassifierKind::None, 1);
    let online = run("uniform", ClassifierKind::Online, 1);
    assert!(
        (online.waf_steady / none.waf_steady - 1.0).abs() < 0.05,
        "uniform: online {} vs one stream {}",
        online.waf_steady,
        none.waf_steady
    );
    // Small segments (256 blocks) cost summaries and open-segment space the model does
    // not count: 15% here; docs/waf.md holds the 10% target at the full size.
    for r in [&none, &online] {
        assert!(
            (r.waf_steady / r.analytic_greedy_waf - 1.0).abs() < 0.15,
            "uniform {:?}: {} vs analytic {}",
            r.config.classifier,
            r.waf_steady,
            r.analytic_greedy_waf
        );
    }
    assert_eq!(
        online.active_classes.count_ones(),
        1,
        "uniform: lifetimes alike, one stream"
    );
    assert_eq!(online.classifier_bytes_per_block, 6);
    for w in ["hotcold:90/10", "zipf:0.99"] {
        let none = run(w, ClassifierKind::None, 1);
        let online = run(w, ClassifierKind::Online, 1);
        let oracle = run(w, ClassifierKind::Oracle, 1);
        assert!(
            online.waf_steady < none.waf_steady,
            "{w}: online {} vs one stream {}",
            online.waf_steady,
            none.waf_steady
        );
        assert!(
            oracle.waf_steady < online.waf_steady,
            "{w}: oracle {} vs online {}",
            oracle.waf_steady,
            online.waf_steady
        );
        assert!(
            online.active_classes.count_ones() >= 2,
            "{w}: classes {:#b}",
            online.active_classes
        );
    }
}

/// With cost-hotness the online classes cut the skewed workloads' WAF by at least a fifth
/// against one stream under greedy, and come within 1.3x of the oracle; the knowledge of
/// each block's true write rate (frequency) does at least about as well as the online
/// estimate from history.
#[test]
fn skewed_workloads_with_cost_hotness() {
    for w in ["hotcold:90/10", "zipf:0.99"] {
        let base = run(w, ClassifierKind::None, 3).waf_steady;
        let [online, oracle, frequency] = [
            ClassifierKind::Online,
            ClassifierKind::Oracle,
            ClassifierKind::Frequency,
        ]
        .map(|c| run_with(w, c, Policy::CostHotness, 3).waf_steady);
        assert!(
            online < 0.8 * base,
            "{w}: online {online} vs one stream {base}"
        );
        assert!(
            online < 1.3 * oracle,
            "{w}: online {online} vs oracle {oracle}"
        );
        assert!(
            frequency < 1.05 * online,
            "{w}: frequency {frequency} vs online {online}"
        );
    }
}

#[test]
fn plot_writes_a_png() {
    let r = run("zipf:0.99", ClassifierKind::Online, 2);
    let dir = std::env::temp_dir().join(format!("replay-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("p.png");
    replay::plot::plot(&r, "zipf:0.99, online", &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.len() > 5000 && bytes.starts_with(b"\x89PNG"),
        "{} bytes",
        bytes.len()
    );
    std::fs::copy(&path, "/tmp/replay-plot.png").ok();
}

#[test]
fn per_stream_figures_add_up() {
    let logical = 16384 * 8 / 10;
    for (classifier, policy) in [
        (ClassifierKind::None, Policy::Greedy),
        (ClassifierKind::Online, Policy::CostHotness),
    ] {
        let r = run_with("zipf:0.99", classifier, policy, 4);
        let sum =
            |f: fn(&replay::sim::StreamFigures) -> u64| -> u64 { r.per_stream.iter().map(f).sum() };
        assert_eq!(sum(|s| s.user_blocks), r.user_blocks, "{classifier:?}");
        assert_eq!(
            sum(|s| s.live_blocks),
            logical,
            "{classifier:?}: every LBA live once"
        );
        // Every backing block is data, a summary or padding; the backing count grows when
        // a chunk is sealed, so the data still in open chunks (at most one chunk per
        // stream) is not in it yet.
        let accounted = r.user_blocks + r.relocated_blocks + r.summary_blocks + r.padding_blocks;
        let open_at_most = (ftl::STREAMS * ftl::summary::MAX_CHUNK_DATA) as u64;
        assert!(
            accounted >= r.backing_blocks && accounted - r.backing_blocks <= open_at_most,
            "{classifier:?}: {accounted} blocks accounted, {} written",
            r.backing_blocks
        );
        // One checkpoint frees a whole batch of victims (each seals every open chunk).
        assert!(
            r.checkpoints > 0 && r.checkpoints < r.segments_cleaned,
            "{classifier:?}: {} checkpoints for {} victims",
            r.checkpoints,
            r.segments_cleaned
        );
        for s in &r.per_stream {
            assert_eq!(s.blocks, s.user_blocks + s.relocated_blocks, "{s:?}");
            assert!(
                s.live_blocks <= s.segments as u64 * 256,
                "{s:?}: 1 MiB segments"
            );
        }
        assert!(
            sum(|s| s.relocated_blocks) >= r.relocated_blocks,
            "{classifier:?}: every relocation was placed somewhere"
        );
        let with_user = r.per_stream.iter().filter(|s| s.user_blocks > 0).count();
        match classifier {
            ClassifierKind::None => {
                assert_eq!(with_user, 1, "{:?}", r.per_stream);
                assert!(r
                    .per_stream
                    .iter()
                    .all(|s| s.relocated_blocks == 0 || s.stream == ftl::GC_STREAM.0));
            }
            _ => assert!(
                with_user >= 3,
                "zipf spreads over classes: {:?}",
                r.per_stream
            ),
        }
    }
}

fn small_cfg(capacity_blocks: u64, segment_bytes: Option<u64>) -> SimConfig {
    SimConfig {
        capacity_blocks,
        op_permille: 200,
        segment_bytes,
        classifier: ClassifierKind::Online,
        classes: 7,
        tracked_blocks: None,
        wear_levelling: true,
        write_probabilities: None,
        policy: Policy::Greedy,
        restarts: 0,
        series_points: 20,
    }
}

/// A run that ends inside its first chunks counts the blocks they hold, and a run of one
/// write has it in its second half: a WAF of 0 (whole run and second half) was printed
/// for a short trace (found by review, 2026-11-29).
#[test]
fn a_run_of_one_write_counts_it() {
    use replay::trace::TraceOp;
    let r = simulate(
        &[TraceOp::Write { lba: 0, blocks: 1 }],
        &small_cfg(16384, Some(1 << 20)),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(
        r.waf >= 1.0 && r.waf_steady >= 1.0,
        "{} {}",
        r.waf,
        r.waf_steady
    );
}

/// A capacity too small for its segments is an error, not a larger device: the
/// workload replayed at a fraction of the utilisation asked for (found by review,
/// 2026-11-29).
#[test]
fn a_capacity_of_too_few_segments_is_an_error() {
    use replay::trace::TraceOp;
    let ops = [TraceOp::Write { lba: 0, blocks: 1 }];
    let e = simulate(&ops, &small_cfg(2048, Some(1 << 20)), &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("too small for segments"), "{e}");
    let r = simulate(&ops, &small_cfg(8192, Some(256 << 10)), &mut |_, _| {}).unwrap();
    assert!(
        r.geometry.exported_blocks <= 8192 + 256,
        "{}",
        r.geometry.exported_blocks
    );
}

/// `restarts`: the online classifier forgets everything that many times, and what it
/// learned is worth something on a skewed workload, so the restarted run writes more.
/// One stream has nothing to forget: the same run, to the block.
#[test]
fn restarts_cost_what_the_classifier_learned() {
    let w: Workload = "hotcold:90/10".parse().unwrap();
    let (capacity, seed) = (16384u64, 3);
    let logical = capacity * 8 / 10;
    let ops = generate(&w, logical, 6 * logical, seed);
    let run = |classifier, restarts| {
        let cfg = SimConfig {
            classifier,
            policy: Policy::CostHotness,
            restarts,
            ..small_cfg(capacity, Some(1 << 20))
        };
        simulate(&ops, &cfg, &mut |_, _| {}).unwrap()
    };
    let (kept, restarted) = (
        run(ClassifierKind::Online, 0),
        run(ClassifierKind::Online, 5),
    );
    assert!(
        restarted.backing_blocks > kept.backing_blocks,
        "5 restarts: {} backing blocks, none: {}",
        restarted.backing_blocks,
        kept.backing_blocks
    );
    let (a, b) = (run(ClassifierKind::None, 0), run(ClassifierKind::None, 5));
    assert_eq!(a.backing_blocks, b.backing_blocks);
}
