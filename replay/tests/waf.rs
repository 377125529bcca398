//! Write amplification measured by replay: determinism, and the ordering the streams
//! must achieve (uniform: no classifier helps or hurts; skewed: online streams cut WAF).

use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig, SimReport};
use replay::workload::{generate, Workload};

fn run(workload: &str, classifier: ClassifierKind, seed: u64) -> SimReport {
    let capacity = 16384; // 64 MiB logical
    let logical = capacity * 8 / 10; // 80% logical utilisation
    let w: Workload = workload.parse().unwrap();
    let ops = generate(&w, logical, 6 * logical, seed);
    let cfg = SimConfig {
        capacity_blocks: capacity,
        op_permille: 200,
        segment_bytes: Some(1 << 20),
        classifier,
        policy: Policy::Greedy,
        series_points: 20,
    };
    simulate(&ops, &cfg, &mut |_, _| {}).unwrap()
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
        (online.waf_steady / none.waf_steady - 1.0).abs() < 0.10,
        "uniform: online {} vs one stream {}",
        online.waf_steady,
        none.waf_steady
    );
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
        // GC output is split by age when streams are on.
        assert!(
            online.per_stream.iter().any(|s| s.stream == 6)
                && online.per_stream.iter().any(|s| s.stream == 7)
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
