//! Bug 5 of issue 14: a tool that opens a backing (`ftlblk bench`, anything using
//! `open_backing`) after a server of it was killed used to open with an in-memory staging
//! area, checkpoint a new session and so make the dead server's staging file stale: every
//! completed but unflushed write in it was lost. It must replay that file first.
//!
//! A test binary of its own: it sets `FTLBLK_RUN_DIR` for the whole process.

use ftl::backing::{format_backing, open_backing, open_backing_staged, staging_file, StagingPlace};
use ftl::model::{block_for, observe, Observed};
use ftl::{Config, FormatOptions, StreamId};

#[test]
fn a_tool_opening_a_killed_servers_backing_replays_its_staging_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::env::set_var("FTLBLK_RUN_DIR", &run);
    let img = dir.path().join("b.img");
    let idx = dir.path().join("b.idx");
    let sb = format_backing(&img, &idx, Some(64 << 20), &FormatOptions::default(), false).unwrap();
    // The "server": staging in the run directory, completed writes never flushed, then
    // it dies (dropped without close: the backing and the staging file keep what they
    // had, as after kill -9).
    {
        let (f, _) = open_backing_staged(
            &img,
            &idx,
            Config::default(),
            &StagingPlace::Dir(run.clone()),
        )
        .unwrap();
        for lba in 0..20u64 {
            f.write(lba, &block_for(lba, 5), false, StreamId(1))
                .unwrap();
        }
    }
    let file = staging_file(&run, &sb.uuid_string());
    assert!(file.exists());
    // The tool.
    let (f, rep) = open_backing(&img, &idx, Config::default()).unwrap();
    assert_eq!(rep.recovery.staged.entries, 20, "{:?}", rep.recovery);
    let mut b = vec![0u8; 4096];
    for lba in 0..20u64 {
        f.read(lba, &mut b).unwrap();
        assert_eq!(observe(lba, &b), Observed::Tag(5), "lba {lba}");
    }
    f.close().unwrap();
    assert!(!file.exists(), "a clean close removes the staging file");
    drop(f);
    // Later tools open with memory staging and still see everything.
    let (f, rep) = open_backing(&img, &idx, Config::default()).unwrap();
    assert_eq!(rep.recovery.staged.entries, 0);
    assert!(f.staging().path().is_none());
    for lba in 0..20u64 {
        f.read(lba, &mut b).unwrap();
        assert_eq!(
            observe(lba, &b),
            Observed::Tag(5),
            "lba {lba} after a clean close"
        );
    }
}
