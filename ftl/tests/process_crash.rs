//! The server process dies (`kill -9`): the backing keeps every completed device write,
//! the kernel keeps the staging area (tmpfs), and every completed write, flushed or not,
//! must be read back after the next open. A power cut loses the staging area too; then
//! only flushed writes are promised (see crash_model.rs).

mod common;

use common::*;
use ftl::model::Model;
use ftl::staging::StagingArea;
use ftl::{BlockDevice, Config, Ftl, StreamId};
use std::sync::atomic::Ordering;

#[test]
fn unflushed_writes_survive_the_death_of_the_process() {
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    // Some chunks fill up and are written, the last ones stay open in three streams.
    for i in 0..200u64 {
        let lba = (i * 7) % 90;
        let d = m.write(lba, 1);
        f.write(lba, &d, false, StreamId((i % 3) as u8)).unwrap();
    }
    f.trim(10, 5).unwrap();
    m.trim(10, 5);
    assert!(dev.unsynced_blocks() > 0);
    let staging = f.staging().clone();
    drop(f);
    let (f, rep) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging).unwrap();
    assert!(
        rep.recovery.staged.open_chunks >= 3,
        "{:?}",
        rep.recovery.staged
    );
    m.process_died();
    for lba in 0..96 {
        check_read(&f, &m, lba, 1).unwrap();
    }
    // And the replayed writes are durable now: a power cut right after loses none.
    drop(f);
    dev.crash(1).unwrap();
    let (f, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    for lba in 0..96 {
        check_read(&f, &m, lba, 1).unwrap();
    }
}

/// Lba 5 written twice (a checkpoint between), flushed, its second version damaged on
/// the device; then the process dies (its staging area kept, marked with a device error
/// when `device_error`) and the backing is reopened.
fn reopen_with_lba_5_damaged(device_error: bool) -> (CrashFtl, ftl::OpenReport) {
    let (dev, idx, f) = tiny_crash();
    f.write(5, &ftl::model::block_for(5, 1), false, S0).unwrap();
    f.checkpoint().unwrap();
    f.write(5, &ftl::model::block_for(5, 2), false, S0).unwrap();
    f.flush().unwrap();
    let at = f.map_entry(5).unwrap().pba().unwrap() as u64 * 4096;
    let mut b = vec![0u8; 4096];
    dev.read_at(at, &mut b).unwrap();
    b[100] ^= 0xff;
    dev.write_at(at, &b).unwrap();
    let staging = f.staging().clone();
    if device_error {
        staging.mark_device_error();
    }
    drop(f);
    Ftl::open_staged(dev, idx, Config::default(), staging).unwrap()
}

/// Recovery rule 3: after the death of only the process, a block that fails its
/// checksum was damaged on the device (every chunk was written whole: the area held each
/// one whose write had not returned). It reads as EIO; before, recovery skipped its
/// entry as if a power cut had torn it, and the block read back its older data.
#[test]
fn a_block_damaged_on_the_device_reads_as_an_error_after_the_process_died() {
    let (f, rep) = reopen_with_lba_5_damaged(false);
    let mut b = vec![0u8; 4096];
    assert!(rep.recovery.staged.same_boot, "{:?}", rep.recovery);
    assert_eq!(
        (rep.recovery.entries_corrupt, rep.recovery.entries_skipped),
        (1, 0)
    );
    let e = f.read(5, &mut b).unwrap_err();
    assert!(matches!(e, ftl::Error::DataChecksum { lba: 5, .. }), "{e}");
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("fail their checksum: damaged on the backing")),
        "{:?}",
        rep.warnings
    );
}

/// Recovery rule 3 holds only when the session saw no device error: a device write or
/// sync that failed may mean the device lost writes that had returned (a cache lost
/// without a reboot), and a block failing its checksum is then skipped as after a power
/// cut, not read as EIO.
#[test]
fn after_a_device_error_a_block_failing_its_checksum_is_skipped() {
    let (f, rep) = reopen_with_lba_5_damaged(true);
    let mut b = vec![0u8; 4096];
    assert!(!rep.recovery.staged.same_boot, "{:?}", rep.recovery);
    assert_eq!(
        (rep.recovery.entries_corrupt, rep.recovery.entries_skipped),
        (0, 1)
    );
    f.read(5, &mut b).unwrap();
    assert_eq!(
        ftl::model::observe(5, &b),
        ftl::model::Observed::Tag(1),
        "the version before the lost write"
    );
}

#[test]
fn without_the_staging_area_unflushed_writes_are_lost() {
    // The control for the test above: a fresh area (a power cut) gives nothing back.
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    let d = m.write(5, 1);
    f.write(5, &d, false, S0).unwrap();
    drop(f);
    let (f, rep) = Ftl::open_staged(
        dev.clone(),
        idx.clone(),
        Config::default(),
        StagingArea::in_memory(4).unwrap(),
    )
    .unwrap();
    assert_eq!(rep.recovery.staged.open_chunks, 0);
    assert!(
        check_read(&f, &m, 5, 1).is_err(),
        "the write was only in memory"
    );
}

#[test]
fn a_sealed_chunk_whose_write_failed_is_written_by_the_next_open() {
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    let d = m.write(3, 2);
    f.write(3, &d, false, S0).unwrap();
    dev.faults.writes.store(true, Ordering::SeqCst);
    assert!(f.flush().is_err(), "the chunk write fails");
    dev.faults.writes.store(false, Ordering::SeqCst);
    let staging = f.staging().clone();
    drop(f);
    let (f, rep) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging).unwrap();
    assert_eq!(
        rep.recovery.staged.sealed_chunks, 1,
        "{:?}",
        rep.recovery.staged
    );
    m.process_died();
    for lba in 0..8 {
        check_read(&f, &m, lba, 1).unwrap();
    }
}

#[test]
fn a_staging_area_of_another_session_is_ignored() {
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    let d = m.write(1, 1);
    f.write(1, &d, false, S0).unwrap();
    let staging = f.staging().clone();
    drop(f);
    // Another open (a tool, without this area) starts a newer session first.
    let (g, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
    drop(g);
    let (_, rep) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging).unwrap();
    assert!(rep.recovery.staged.ignored_stale);
    assert_eq!(rep.recovery.staged.open_chunks, 0);
}

/// Staging rule 5: an area left by another boot of the machine is ignored. Here a copy
/// of the area taken before later writes and their FLUSH (what a staging file on a disk
/// may hold after a power cut) comes back with another boot's id: replaying its open
/// slot would seal three entries over the place where the flushed chunk of six is.
#[test]
fn an_area_from_another_boot_is_ignored() {
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    for lba in 0..3 {
        let d = m.write(lba, 1);
        f.write(lba, &d, false, S0).unwrap();
    }
    let stale = f.staging().copy().unwrap();
    for lba in 3..6 {
        let d = m.write(lba, 1);
        f.write(lba, &d, false, S0).unwrap();
    }
    f.flush().unwrap();
    m.flush();
    let cut = std::sync::Arc::new(ftl::device::crash::CrashDevice::from_image(
        dev.power_cut_image(7).unwrap(),
    ));
    drop(f);
    stale.set_boot_id([0xAB; 16]);
    let (f, rep) = Ftl::open_staged(cut.clone(), idx.clone(), Config::default(), stale).unwrap();
    for lba in 0..8 {
        check_read(&f, &m, lba, 1).unwrap();
    }
    assert!(
        rep.recovery.staged.ignored_stale,
        "{:?}",
        rep.recovery.staged
    );
}

#[test]
fn a_damaged_slot_is_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.stage");
    let (dev, idx, f) = tiny_crash();
    drop(f);
    let area = StagingArea::open_file(&file, 4).unwrap();
    let (f, _) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), area).unwrap();
    f.write(1, &[9u8; 4096], false, S0).unwrap();
    f.write(2, &[8u8; 4096], false, StreamId(2)).unwrap();
    drop(f);
    let before = {
        let mut b = vec![0u8; dev.size() as usize];
        dev.read_at(0, &mut b).unwrap();
        b
    };
    // Flip a byte of every slot's place record (offset 16 of its metadata).
    {
        use std::os::unix::fs::FileExt;
        let fh = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        for slot in 0..4u64 {
            let at =
                ftl::staging::HEADER_BYTES as u64 + slot * ftl::staging::SLOT_BYTES as u64 + 16;
            let mut b = [0u8; 1];
            fh.read_exact_at(&mut b, at).unwrap();
            fh.write_all_at(&[b[0] ^ 0x55], at).unwrap();
        }
    }
    let area = StagingArea::open_file(&file, 4).unwrap();
    let err = match Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), area) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a damaged staging slot must not open silently"),
    };
    assert!(
        err.contains("staging area") && err.contains("remove the file"),
        "{err}"
    );
    let mut after = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut after).unwrap();
    assert!(before == after, "nothing was written");
    // Removing the file opens the device without those writes.
    std::fs::remove_file(&file).unwrap();
    let area = StagingArea::open_file(&file, 4).unwrap();
    Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), area).unwrap();
}
