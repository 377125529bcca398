//! A real `kill -9` of a process running the FTL on a file backing with a file staging
//! area, while several threads write, flush, checkpoint and close streams. The parent
//! runs this test binary again as the child (`child_writer`, ignored unless asked for),
//! reads the child's report of every write that completed, kills it at a random point
//! and reopens: every reported write (or a later one to the same LBA) must be read back,
//! and nothing else but versions of that LBA or zeros.

use ftl::backing::{format_backing, open_backing_staged, StagingPlace};
use ftl::model::{block_for, observe, Observed};
use ftl::{Config, FormatOptions, StreamId};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CHILD_ENV: &str = "FTL_KILL_TEST_DIR";
const WRITERS: u64 = 4;
/// LBAs written: a small range, so blocks are overwritten across streams and chunks.
const SPAN: u64 = 4096;

fn paths(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    (dir.join("b.img"), dir.join("b.idx"), dir.join("stage"))
}

/// xorshift, seeded per thread.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
#[ignore = "the child process of kill_during_writes_loses_no_completed_write"]
fn child_writer() {
    let dir = std::env::var(CHILD_ENV).expect("run by kill_during_writes_loses_no_completed_write");
    // A writer thread that fails ends the whole child, so the parent sees it end early
    // (a panic kills only its own thread, and the others kept reporting).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(3);
    }));
    let (img, idx, stage) = paths(Path::new(&dir));
    let (f, _) =
        open_backing_staged(&img, &idx, Config::default(), &StagingPlace::Dir(stage)).unwrap();
    let f = Arc::new(f);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for t in 0..WRITERS {
        let f = f.clone();
        threads.push(std::thread::spawn(move || {
            let mut x = 0x9e37_79b9 ^ ((t + 1) * 0x1234_5678_9abc);
            let mut counter = 0u64;
            loop {
                let lba = (next(&mut x) % (SPAN / WRITERS)) * WRITERS + t;
                counter += 1;
                let tag = ((t + 1) << 40) | counter;
                let fua = next(&mut x).is_multiple_of(50);
                let stream = StreamId((next(&mut x) % 7) as u8);
                f.write(lba, &block_for(lba, tag), fua, stream).unwrap();
                if next(&mut x).is_multiple_of(100) {
                    f.flush().unwrap();
                }
                // Reported only after the write completed.
                let mut out = std::io::stdout().lock();
                writeln!(out, "W {lba} {tag}").unwrap();
            }
        }));
    }
    let mut x = 77u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(3));
        match next(&mut x) % 3 {
            0 => {
                f.checkpoint().unwrap();
            }
            _ => f.close_stream(StreamId((next(&mut x) % 7) as u8)).unwrap(),
        }
    }
}

#[test]
fn kill_during_writes_loses_no_completed_write() {
    let mut staged_entries = 0;
    for round in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let (img, idx, stage) = paths(dir.path());
        format_backing(
            &img,
            &idx,
            Some(256 << 20),
            &FormatOptions::default(),
            false,
        )
        .unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // A different point every run (the failure message names it).
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64 % 700);
        let kill_after = 300 + round * 1700 + jitter;
        let mut last: HashMap<u64, u64> = HashMap::new();
        let record = |line: &str, last: &mut HashMap<u64, u64>| {
            let mut w = line.split_whitespace();
            if w.next() == Some("W") {
                let lba: u64 = w.next().unwrap().parse().unwrap();
                let tag: u64 = w.next().unwrap().parse().unwrap();
                let e = last.entry(lba).or_default();
                *e = (*e).max(tag);
                true
            } else {
                false
            }
        };
        let mut seen = 0;
        while seen < kill_after {
            let line = lines
                .next()
                .expect("the child ended before it was killed")
                .unwrap();
            if record(&line, &mut last) {
                seen += 1;
            }
        }
        // SAFETY: plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
        // Reports already in the pipe were completed writes too.
        for line in lines {
            record(&line.unwrap(), &mut last);
        }
        child.wait().unwrap();

        let (f, rep) = open_backing_staged(
            &img,
            &idx,
            Config::default(),
            &StagingPlace::Dir(stage.clone()),
        )
        .unwrap();
        staged_entries += rep.recovery.staged.entries;
        assert!(!rep.recovery.staged.ignored_stale);
        let mut b = vec![0u8; 4096];
        // Every LBA: those past the writers' span were never written and read as zeros
        // (a relocation or recovery mapping data there went unseen when only the span
        // was read; found by review, 2026-11-29).
        for lba in 0..f.capacity_blocks() {
            f.read(lba, &mut b).unwrap();
            let want = last.get(&lba).copied().unwrap_or(0);
            match observe(lba, &b) {
                // Tags grow per LBA (one thread owns each): equal or later is right.
                Observed::Tag(t) if t >= want => {}
                got => panic!(
                    "round {round} (killed after {kill_after} reports): lba {lba}: read {got:?}, \
                     the last completed write was tag {want} ({} LBAs reported, recovery {:?})",
                    last.len(),
                    rep.recovery
                ),
            }
        }
        f.close().unwrap();
    }
    assert!(
        staged_entries > 0,
        "no kill left anything staged: the test did not exercise the staging area"
    );
}
