//! Replays the committed seed corpus and every regression input through the same target
//! functions libFuzzer calls, on the stable toolchain:
//! `cargo test --manifest-path fuzz/Cargo.toml`.
//!
//! Layout: `corpus/<target>/*` (seeds, plus any input worth keeping) and
//! `regressions/<target>/*` (every crash input a fuzzer found, kept forever). A
//! regression whose ftl bug is not fixed yet is listed in `regressions/KNOWN_OPEN`
//! (`<target>/<file>  reason`): it is replayed and reported but does not fail the suite
//! until it is fixed; `known_open_regressions` (ignored) replays only those, strictly.

use ftl_fuzz::{enc, open_corrupt, ops, seeds, TARGETS};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !n.starts_with('.') && !n.ends_with(".md") && !n.ends_with(".txt")
        })
        .collect();
    v.sort();
    v
}

fn known_open() -> BTreeSet<String> {
    std::fs::read_to_string(root().join("regressions/KNOWN_OPEN"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Runs `f` on `data`; the panic message if it panicked.
fn replay(f: fn(&[u8]), data: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| f(data))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "non-string panic".into())
    })
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n")
}

#[test]
fn corpus_and_regressions_replay() {
    let open = known_open();
    let mut failures = Vec::new();
    let mut replayed = 0;
    for &(name, f) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for p in inputs(&root().join(kind).join(name)) {
                let data = std::fs::read(&p).unwrap();
                let id = format!("{name}/{}", p.file_name().unwrap().to_string_lossy());
                replayed += 1;
                match replay(f, &data) {
                    Ok(()) if open.contains(&id) => {
                        eprintln!("known-open regression {id} PASSES now: remove it from regressions/KNOWN_OPEN")
                    }
                    Ok(()) => {}
                    Err(e) if open.contains(&id) => {
                        eprintln!(
                            "known-open regression {id} still fails: {}",
                            first_lines(&e, 1)
                        )
                    }
                    Err(e) => failures.push(format!("{kind}/{id}: {}", first_lines(&e, 3))),
                }
            }
        }
    }
    assert!(replayed > 0, "no corpus found under {}", root().display());
    assert!(
        failures.is_empty(),
        "{} inputs fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
#[ignore = "replays regressions of ftl bugs not fixed yet (regressions/KNOWN_OPEN)"]
fn known_open_regressions() {
    let mut failures = Vec::new();
    for id in known_open() {
        let (name, _) = id.split_once('/').expect("target/file");
        let f = TARGETS
            .iter()
            .find(|t| t.0 == name)
            .expect("known target")
            .1;
        let data = std::fs::read(root().join("regressions").join(&id)).unwrap();
        if let Err(e) = replay(f, &data) {
            failures.push(format!("{id}: {}", first_lines(&e, 3)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The committed seeds equal what `seeds::all` builds (`FTL_FUZZ_WRITE_SEEDS=1` rewrites them).
#[test]
fn seeds_are_committed() {
    let write = std::env::var_os("FTL_FUZZ_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for s in seeds::all() {
        let file = match s.dir {
            "corpus" => format!("seed-{}", s.name),
            _ => s.name.to_string(),
        };
        let p = root().join(s.dir).join(s.target).join(file);
        if write {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &s.bytes).unwrap();
        } else if std::fs::read(&p).ok().as_deref() != Some(&s.bytes[..]) {
            stale.push(p.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seed files missing or stale (regenerate with FTL_FUZZ_WRITE_SEEDS=1): {stale:?}"
    );
}

/// The encoder writes what `arbitrary` reads back (catches a change of its format).
#[test]
fn seeds_decode_to_their_structures() {
    for (name, list) in seeds::ops_seeds() {
        assert_eq!(ops::parse(&enc::ops(&list)), list, "ops seed {name}");
    }
    for (name, case) in seeds::open_corrupt_seeds() {
        assert_eq!(
            open_corrupt::parse(&enc::case(&case)).as_ref(),
            Some(&case),
            "open_corrupt seed {name}"
        );
    }
}

/// The seeds reach what they were written for.
#[test]
fn seeds_reach_their_scenarios() {
    for (name, list) in seeds::ops_seeds() {
        let out = ops::run(&list).unwrap_or_else(|e| panic!("ops seed {name}: {e}"));
        if name == "no-space" {
            assert!(out.no_space_at.is_some(), "{name}: {out:?}");
            continue;
        }
        assert_eq!(
            out.steps,
            list.len(),
            "ops seed {name} stopped early: {out:?}"
        );
        let crashes = list
            .iter()
            .filter(|o| matches!(o, ops::Op::Crash { .. }))
            .count();
        assert!(out.crashes + out.kills >= crashes, "{name}: {out:?}");
        if name == "kill" {
            assert!(out.kills == 2 && out.staged_entries > 0, "{name}: {out:?}");
        }
        if name == "faults" {
            assert!(out.faults_hit >= 3, "{name}: {out:?}");
        }
        if name.contains("clean") || name == "relocate" {
            assert!(
                out.relocated > 0,
                "ops seed {name} relocated nothing: {out:?}"
            );
        }
    }
    for (name, case) in seeds::open_corrupt_seeds() {
        let out =
            open_corrupt::run(&case).unwrap_or_else(|e| panic!("open_corrupt seed {name}: {e}"));
        if name.starts_with("pristine") {
            assert_eq!(
                out,
                open_corrupt::Outcome::Opened { read_errors: 0 },
                "{name}"
            );
        }
        eprintln!("open_corrupt seed {name}: {out:?}");
    }
}

/// A few hundred pseudo-random inputs per target: a small stable-toolchain fuzz run.
#[test]
fn random_inputs() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for &(name, f) in TARGETS {
        let (n, max_len) = match name {
            "decode" => (2000, 4200),
            "ops" => (60, 600),
            _ => (60, 400),
        };
        for i in 0..n {
            let len = (next() % max_len) as usize;
            let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if name == "ops" {
                // Mostly "continue" bytes where the decoder expects them, so cases are long.
                for b in data.iter_mut().step_by(5) {
                    *b |= 1;
                }
            }
            if let Err(e) = replay(f, &data) {
                let p = std::env::temp_dir().join(format!("ftl-fuzz-random-{name}-{i}"));
                std::fs::write(&p, &data).unwrap();
                panic!("{name} random input {i} (saved as {}): {e}", p.display());
            }
        }
    }
}
