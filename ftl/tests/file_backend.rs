//! The FTL over a real file (O_DIRECT, io_uring) with a sled index, in a temp directory.

use ftl::backing::{default_index_dir, format_backing, open_backing};
use ftl::model::block_for;
use ftl::{Config, Error, FormatOptions, StreamId};
use std::os::unix::fs::MetadataExt;

fn tmpdir() -> tempfile::TempDir {
    // /var/tmp is on a real disk (O_DIRECT); fall back to the default temp dir.
    tempfile::Builder::new()
        .prefix("ftl-test")
        .tempdir_in("/var/tmp")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

#[test]
fn format_write_reopen_and_exclusive_lock() {
    let dir = tmpdir();
    let backing = dir.path().join("disk.img");
    let index = default_index_dir(&backing);
    assert_eq!(index, dir.path().join("disk.img.ftlidx"));
    let sb = format_backing(
        &backing,
        &index,
        Some(256 << 20),
        &FormatOptions::default(),
        false,
    )
    .unwrap();
    assert_eq!(sb.geometry.segment_bytes, 1 << 20);
    assert!(
        std::fs::metadata(&backing).unwrap().blocks() < 1024,
        "backing stays sparse"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&backing).unwrap().permissions().mode() & 0o777,
        0o600,
        "a new backing holds the device's data: its owner's only"
    );

    let e = format_backing(&backing, &index, None, &FormatOptions::default(), false).unwrap_err();
    assert!(matches!(e, Error::AlreadyFormatted(_)), "{e}");

    {
        let (f, _) = open_backing(&backing, &index, Config::default()).unwrap();
        for lba in 0..300u64 {
            f.write(lba * 7, &block_for(lba * 7, 1), false, StreamId(1))
                .unwrap();
        }
        f.flush().unwrap();
        f.write(5000, &block_for(5000, 9), true, StreamId(1))
            .unwrap();
        // A second server on the same backing is refused while this one runs.
        let e = open_backing(&backing, &index, Config::default())
            .err()
            .unwrap();
        assert!(matches!(e, Error::Busy(_)), "{e}");
        assert!(e.to_string().contains("already in use"), "{e}");
        // Dropped without close(): like a killed daemon.
    }
    let (f, report) = open_backing(&backing, &index, Config::default()).unwrap();
    assert!(report.recovery.chunks_replayed > 0, "{report:?}");
    let mut b = vec![0u8; 4096];
    for lba in 0..300u64 {
        f.read(lba * 7, &mut b).unwrap();
        assert_eq!(b, block_for(lba * 7, 1), "lba {}", lba * 7);
    }
    f.read(5000, &mut b).unwrap();
    assert_eq!(b, block_for(5000, 9));
    f.close().unwrap();
    drop(f);
    let (f, report) = open_backing(&backing, &index, Config::default()).unwrap();
    assert_eq!(
        report.recovery.chunks_replayed, 0,
        "a clean close leaves nothing to replay"
    );
    f.read(5000, &mut b).unwrap();
    assert_eq!(b, block_for(5000, 9));
}

#[test]
fn missing_index_and_too_small_backing_are_clear_errors() {
    let dir = tmpdir();
    let backing = dir.path().join("small.img");
    let e = format_backing(
        &backing,
        &dir.path().join("i"),
        Some(4 << 20),
        &FormatOptions::default(),
        false,
    )
    .unwrap_err();
    assert!(matches!(e, Error::TooSmall(_)), "{e}");
    // A failed format leaves nothing behind that changes the next one: the file it
    // created and the index directory are gone.
    assert!(
        !backing.exists(),
        "the backing the failed format created is left"
    );
    assert!(
        !dir.path().join("i").exists(),
        "the failed format left an index"
    );
    // A file that was there before stays.
    std::fs::write(&backing, b"").unwrap();
    assert!(format_backing(
        &backing,
        &dir.path().join("i"),
        None,
        &FormatOptions::default(),
        false
    )
    .is_err());
    assert!(backing.exists());
    std::fs::remove_file(&backing).unwrap();
    let backing = dir.path().join("ok.img");
    let index = dir.path().join("idx");
    format_backing(
        &backing,
        &index,
        Some(64 << 20),
        &FormatOptions::default(),
        false,
    )
    .unwrap();
    // Copy A lost: the open repairs it from copy B and says so.
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&backing)
            .unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[0u8; 4096], 0).unwrap();
    }
    let (f, report) = open_backing(&backing, &index, Config::default()).unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("copy A") && w.contains("rewritten")),
        "{:?}",
        report.warnings
    );
    f.close().unwrap();
    drop(f);
    let (f, report) = open_backing(&backing, &index, Config::default()).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    f.close().unwrap();
    drop(f);
    std::fs::remove_dir_all(&index).unwrap();
    let e = open_backing(&backing, &index, Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
    // Another backing's index: the message's rebuild command names the real paths.
    let other = dir.path().join("other.img");
    let other_index = dir.path().join("other.ftlidx");
    format_backing(
        &other,
        &other_index,
        Some(64 << 20),
        &FormatOptions::default(),
        false,
    )
    .unwrap();
    let e = open_backing(&backing, &other_index, Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::IndexMismatch { .. }), "{e}");
    let msg = e.to_string();
    let want = format!(
        "ftlblk check --backing {} --index {} --rebuild-index",
        backing.display(),
        other_index.display()
    );
    assert!(msg.contains(&want), "{msg}");
    let e = open_backing(&dir.path().join("nope.img"), &index, Config::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::Open { .. }), "{e}");
}

#[test]
fn freed_segments_shrink_the_backing_file() {
    let dir = tmpdir();
    let backing = dir.path().join("trim.img");
    let index = dir.path().join("trim.idx");
    let opts = FormatOptions {
        segment_bytes: Some(1 << 20),
        ..Default::default()
    };
    format_backing(&backing, &index, Some(64 << 20), &opts, false).unwrap();
    let (f, _) = open_backing(&backing, &index, Config::default()).unwrap();
    let data: Vec<u8> = (0..256u64).flat_map(|l| block_for(l, 1)).collect();
    for _ in 0..40 {
        f.write(0, &data, false, StreamId(1)).unwrap();
    }
    f.flush().unwrap();
    f.checkpoint().unwrap();
    // Freed segments wait for the discard delay (`Config::discard_delay`); the cleaner's
    // runner discards them then, `discard_waiting(true)` at once.
    assert!(f.undiscarded_segments() >= 30);
    assert!(f.discard_waiting(true) >= 30);
    assert_eq!(f.undiscarded_segments(), 0);
    let allocated = std::fs::metadata(&backing).unwrap().blocks() * 512;
    assert!(
        allocated < 8 << 20,
        "dead segments were punched out: {allocated} bytes allocated"
    );
    assert!(f.stats().counters.discarded_bytes >= 30 << 20);
}
