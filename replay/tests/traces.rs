//! The real trace shipped in `replay/traces/` (recorded by `scripts/record-trace.sh`: a
//! SQLite database and file churn on ext4, Alibaba format, one volume each) replays on a
//! device sized from its working set, as `ftlblk replay --capacity wss` does.

use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig, SimReport};
use replay::trace::{read_file, remap_working_set, Format, TraceOp};
use std::path::PathBuf;

fn shipped() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces/vm-fs.alibaba.csv.gz")
}

fn written(ops: &[TraceOp]) -> u64 {
    ops.iter()
        .filter_map(|o| match o {
            TraceOp::Write { blocks, .. } => Some(*blocks as u64),
            _ => None,
        })
        .sum()
}

fn replay(volume: &str, classifier: ClassifierKind, loops: usize) -> (u64, SimReport) {
    let ops = read_file(&shipped(), Format::Alibaba, Some(volume)).unwrap();
    let ws = remap_working_set(&ops);
    let capacity = ws.blocks * 100 / 90; // 90% utilisation
    let mut all = Vec::new();
    for _ in 0..loops {
        all.extend_from_slice(&ws.ops);
    }
    let cfg = SimConfig {
        capacity_blocks: capacity,
        op_permille: 200,
        segment_bytes: Some(1 << 20),
        classifier,
        classes: 7,
        tracked_blocks: None,
        wear_levelling: true,
        write_probabilities: None,
        policy: Policy::CostHotness,
        restarts: 0,
        series_points: 10,
    };
    let report = simulate(&all, &cfg, &mut |_, _| {}).unwrap();
    (written(&all), report)
}

#[test]
fn the_shipped_trace_holds_two_volumes_and_names_them() {
    let e = read_file(&shipped(), Format::Alibaba, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 volumes") && e.contains("--volume"), "{e}");
    for v in ["0", "1"] {
        let ops = read_file(&shipped(), Format::Alibaba, Some(v)).unwrap();
        let ws = remap_working_set(&ops);
        // Each volume writes tens of MiB at least, and overwrites part of what it wrote.
        assert!(
            ws.blocks > 2560,
            "volume {v}: working set {} blocks",
            ws.blocks
        );
        assert!(
            written(&ws.ops) > ws.blocks,
            "volume {v}: nothing is overwritten"
        );
        assert!(ws
            .ops
            .iter()
            .all(|o| o.range().0 + o.range().1 as u64 <= ws.blocks));
    }
}

#[test]
fn the_shipped_trace_replays_on_its_working_set() {
    // Volume 0, the database: pages overwritten in place by SQLite, so cleaning copies.
    let (user, db) = replay("0", ClassifierKind::Online, 3);
    assert_eq!(db.user_blocks, user, "every written block replayed");
    assert!(db.segments_cleaned > 0 && db.relocated_blocks > 0, "{db:?}");
    assert!(db.waf > 1.0 && db.waf < 3.0, "database WAF {}", db.waf);
    // Deterministic: the same trace gives the same figures.
    let (_, again) = replay("0", ClassifierKind::Online, 3);
    assert_eq!(db.backing_blocks, again.backing_blocks);

    // Volume 1, file churn: files written whole and deleted whole die in whole segments,
    // which the log frees without copying.
    let (user, files) = replay("1", ClassifierKind::None, 3);
    assert_eq!(files.user_blocks, user);
    assert!(files.waf < 1.05, "file churn WAF {}", files.waf);
}
