//! Replays the `sched` target's seeds, corpus and regressions (feature `sched`):
//! `cargo test --manifest-path fuzz/Cargo.toml --features sched --test sched`.

use ftl_fuzz::sched;
use std::path::PathBuf;

fn dir(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join("sched")
}

/// The committed seeds equal what `sched::seeds` builds (`FTL_FUZZ_WRITE_SEEDS=1`
/// rewrites them), and each decodes into a scenario of at least two threads.
#[test]
fn seeds_are_committed_and_decode() {
    let write = std::env::var_os("FTL_FUZZ_WRITE_SEEDS").is_some();
    for (name, bytes) in sched::seeds() {
        let path = dir("corpus").join(format!("seed-{name}"));
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        assert_eq!(
            std::fs::read(&path).ok(),
            Some(bytes.clone()),
            "seed {name} missing or stale (FTL_FUZZ_WRITE_SEEDS=1 rewrites it)"
        );
        let input = sched::decode(&bytes).expect("a seed decodes");
        assert!(input.scenario.threads.len() >= 2, "{name}");
    }
}

#[test]
fn corpus_and_regressions_replay() {
    let mut failures = Vec::new();
    let mut n = 0;
    for kind in ["corpus", "regressions"] {
        let Ok(rd) = std::fs::read_dir(dir(kind)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            n += 1;
            let data = std::fs::read(&f).unwrap();
            if let Err(e) = sched::run(&data) {
                failures.push(format!(
                    "{}: {}",
                    f.display(),
                    e.lines().next().unwrap_or("")
                ));
            }
        }
    }
    assert!(n >= 3, "the seeds are there");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Random scenarios under random schedules: the target never fails on a correct FTL,
/// and every input decodes to what was encoded.
#[test]
fn random_inputs() {
    use ftl::sched::Step;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..40 {
        let threads: Vec<Vec<Step>> = (0..2 + next() % 3)
            .map(|_| {
                (0..1 + next() % 12)
                    .map(|_| {
                        let (a, b) = (next() as u8, (next() >> 8) as u8);
                        match next() % 7 {
                            0 | 1 => Step::Write {
                                lba: a,
                                blocks: b,
                                fua: a & 1 == 1,
                                stream: b,
                            },
                            2 => Step::Trim { lba: a, blocks: b },
                            3 => Step::Flush,
                            4 => Step::Read { lba: a },
                            5 => Step::Checkpoint,
                            _ => Step::Clean { max: b },
                        }
                    })
                    .collect()
            })
            .collect();
        let schedule: Vec<u8> = (0..next() % 64).map(|_| next() as u8).collect();
        let data = sched::encode(i % 2 == 0, i % 3 != 0, threads.clone(), &schedule);
        let input = sched::decode(&data).expect("decodes");
        assert_eq!(input.scenario.threads.len(), threads.len());
        assert_eq!(input.schedule, schedule);
        if let Err(e) = sched::run(&data) {
            panic!("random input {i}: {e}");
        }
    }
}
