//! Replays a directory of `ops` inputs and sums what they reached (a poor man's
//! coverage report): `cargo run --release --example stats -- fuzz/corpus-run/ops`.
fn main() {
    let dir = std::env::args().nth(1).expect("directory of ops inputs");
    let mut sum = ftl_fuzz::ops::Outcome::default();
    let (mut cases, mut nospace, mut with_skips) = (0, 0, 0);
    let mut kinds = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        let ops = ftl_fuzz::ops::parse(&data);
        for o in &ops {
            let k = format!("{o:?}");
            *kinds
                .entry(k.split([' ', '{']).next().unwrap().to_string())
                .or_insert(0) += 1;
        }
        let out = ftl_fuzz::ops::run(&ops).unwrap_or_else(|e| panic!("{e}"));
        cases += 1;
        nospace += out.no_space_at.is_some() as usize;
        with_skips += (out.entries_skipped > 0) as usize;
        sum.steps += out.steps;
        sum.crashes += out.crashes;
        sum.relocated += out.relocated;
        sum.faults_hit += out.faults_hit;
        sum.chunks_replayed += out.chunks_replayed;
        sum.entries_skipped += out.entries_skipped;
        sum.segments_freed += out.segments_freed;
    }
    println!("{cases} cases, {nospace} ran out of space, {with_skips} replayed torn chunks");
    println!("totals: {sum:?}");
    println!("ops: {kinds:?}");
}
