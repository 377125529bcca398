use super::*;

thread_local! {
    /// Write-backs of a file-backed area made by this thread ([`Region::sync_range`]),
    /// for the test that a reset writes its header back (a count of the whole process
    /// rose with another test's resets, however this one's went).
    pub(super) static FILE_SYNCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn owner() -> AreaOwner {
    AreaOwner {
        uuid: [7; 16],
        epoch: 3,
        session: 0x1234,
    }
}

#[test]
fn fresh_area_has_no_owner_until_reset() {
    let a = StagingArea::in_memory(2).unwrap();
    assert_eq!(a.owner(), None);
    a.reset(owner(), 10).unwrap();
    assert_eq!(a.owner(), Some(owner()));
    assert_eq!(a.next_chunk_mark(), 10);
}

#[test]
fn slots_record_entries_and_states() {
    let a = StagingArea::in_memory(2).unwrap();
    a.reset(owner(), 1).unwrap();
    let mut b = a.try_take().unwrap();
    let place = SlotPlace {
        stream: 3,
        seg: 5,
        offset: 8,
        start_pba: 328,
    };
    b.open(place);
    b[4096..8192].fill(9);
    b.record(
        0,
        &Entry::Data {
            lba: 4,
            seq: 11,
            crc: 0xabc,
        },
        None,
    );
    b.record(
        1,
        &Entry::Trim {
            lba: 9,
            seq: 12,
            count: 3,
        },
        None,
    );
    let s = a.read_slot(b.slot());
    assert_eq!(s.state, SlotState::Open);
    assert_eq!(s.place, Some(place));
    assert_eq!(
        s.entries,
        vec![
            Entry::Data {
                lba: 4,
                seq: 11,
                crc: 0xabc
            },
            Entry::Trim {
                lba: 9,
                seq: 12,
                count: 3
            }
        ]
    );
    b.mark_sealed(40);
    assert_eq!(a.read_slot(b.slot()).state, SlotState::Sealed(40));
    assert_eq!(
        a.next_chunk_mark(),
        41,
        "the mark passes every sealed chunk"
    );
    b.mark_written();
    assert_eq!(a.read_slot(b.slot()).state, SlotState::Free);
}

#[test]
fn a_torn_entry_ends_the_list() {
    let a = StagingArea::in_memory(1).unwrap();
    let mut b = a.try_take().unwrap();
    b.open(SlotPlace {
        stream: 0,
        seg: 1,
        offset: 0,
        start_pba: 16,
    });
    for k in 0..3 {
        b.record(
            k,
            &Entry::Data {
                lba: k as u64,
                seq: k as u64,
                crc: 1,
            },
            None,
        );
    }
    let at = StagingArea::slot_at(b.slot()) + META_HEADER + META_ENTRY + 3;
    a.bytes_mut(at, 1)[0] ^= 0xff;
    let s = a.read_slot(b.slot());
    assert_eq!(s.entries.len(), 1);
    // Below the count (rule 1: complete before counted): damage, not a cut-short write.
    let why = s
        .damage
        .expect("an entry below the count that fails is damage");
    assert!(why.contains("entry 1 of the 3"), "{why}");
}

#[test]
fn slots_are_exclusive_and_come_back_on_drop() {
    let a = StagingArea::in_memory(2).unwrap();
    let x = a.try_take().unwrap();
    let y = a.try_take().unwrap();
    assert_ne!(x.slot(), y.slot());
    assert!(a.try_take().is_none());
    assert!(
        a.take(x.slot()).is_none(),
        "a taken slot is not handed out twice"
    );
    drop(x);
    assert_eq!(a.free_slots(), 1);
    assert!(a.try_take().is_some());
}

#[test]
fn a_mapped_file_keeps_its_contents_across_mappings() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s/area.stage");
    {
        let a = StagingArea::open_file(&p, 2).unwrap();
        a.reset(owner(), 5).unwrap();
        let mut b = a.try_take().unwrap();
        b[0..4].copy_from_slice(b"abcd");
    }
    let a = StagingArea::open_file(&p, 1).unwrap();
    assert_eq!(a.slot_count(), 2, "a larger file keeps its slots");
    assert!(
        matches!(StagingArea::open_file(&p, 1), Err(Error::Busy(_))),
        "a staging file is used by one server at a time"
    );
    assert_eq!(a.owner(), Some(owner()));
    let b = a.try_take().unwrap();
    let b2 = a.try_take().unwrap();
    assert!(b[0..4] == *b"abcd" || b2[0..4] == *b"abcd");
    a.remove_file().unwrap();
    assert!(!p.exists());
}

/// The staging file holds written data: its owner's only, also one an older build made
/// 0644.
#[test]
fn a_staging_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("area.stage");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    drop(StagingArea::open_file(&p, 1).unwrap());
    assert_eq!(mode(&p), 0o600);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(StagingArea::open_file(&p, 1).unwrap());
    assert_eq!(mode(&p), 0o600);
}

/// Rule 2, every prefix of its stores: a process that dies after any of them (while the
/// tracker lock is held by the thread sealing) loses no completed write.
/// The FTL on a memory device of 32 segments of 64 KiB (16 KiB flash pages), default
/// configuration, its staging area in memory.
fn tiny_mem_ftl() -> (
    Arc<crate::device::mem::MemDevice>,
    Arc<crate::index::mem::MemIndex>,
    crate::model::MemFtl,
) {
    let dev = Arc::new(crate::device::mem::MemDevice::new(32 * (64 << 10)));
    let idx = Arc::new(crate::index::mem::MemIndex::new());
    let opts = crate::FormatOptions {
        segment_bytes: Some(64 << 10),
        flash_page_bytes: Some(16 << 10),
        ..Default::default()
    };
    crate::format(&dev, &idx, &opts, false).unwrap();
    let (f, _) = crate::Ftl::open(dev.clone(), idx.clone(), crate::Config::default()).unwrap();
    (dev, idx, f)
}

/// Asserts that every LBA of `lbas` reads back tag `tag` (`what` says after what).
fn assert_tags(
    f: &crate::model::MemFtl,
    lbas: impl IntoIterator<Item = u64>,
    tag: u64,
    what: &str,
) {
    use crate::model::{observe, Observed};
    let mut b = vec![0u8; 4096];
    for lba in lbas {
        f.read(lba, &mut b)
            .unwrap_or_else(|e| panic!("{what}: lba {lba}: {e}"));
        assert_eq!(observe(lba, &b), Observed::Tag(tag), "{what}: lba {lba}");
    }
}

#[test]
fn a_death_between_any_two_sealing_stores_loses_no_completed_write() {
    use crate::model::block_for;
    use crate::{Config, Ftl, StreamId};
    for upto in 0..=SEAL_STEPS.len() {
        let (dev, idx, f) = tiny_mem_ftl();
        // Completed, unflushed writes in three streams' open chunks.
        for s in 1..4u8 {
            for k in 0..3u64 {
                let lba = s as u64 * 10 + k;
                f.write(lba, &block_for(lba, 7), false, StreamId(s))
                    .unwrap();
            }
        }
        // Stream 2 starts sealing: it takes the next number under the tracker lock and
        // the process dies after `upto` of the stores.
        {
            let log = f.appender();
            let st = log.stream(StreamId(2)).unwrap();
            let chunk = st.chunk.as_ref().unwrap();
            log.tracker().begin_with(|n| chunk.buf.seal_steps(n, upto));
        }
        let staging = f.staging().clone();
        drop(f);
        let (f, rep) =
            Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging).unwrap();
        let lbas = (1..4u64).flat_map(|s| (0..3u64).map(move |k| s * 10 + k));
        assert_tags(
            &f,
            lbas,
            7,
            &format!("died after {upto} sealing stores ({:?})", rep.recovery),
        );
    }
}

/// Staging rule 1: a process dying between an entry's stores and its count loses no
/// write completed before it, and the area opens; the write being recorded reads back
/// whole, old or new. (With the count stored first, replay found the count over an entry
/// never written and refused the area.)
#[test]
fn a_death_between_an_entrys_stores_and_its_count_loses_no_completed_write() {
    use crate::model::{block_for, observe, Observed};
    use crate::{Config, Ftl, StreamId};
    for upto in 0..=RECORD_STEPS.len() {
        let (dev, idx, f) = tiny_mem_ftl();
        for lba in 0..3u64 {
            f.write(lba, &block_for(lba, 7), false, StreamId(1))
                .unwrap();
        }
        // The fourth write's recording stops after `upto` stores; the process dies.
        RECORD_UPTO.with(|u| u.set(Some(upto)));
        f.write(1, &block_for(1, 8), false, StreamId(1)).unwrap();
        let staging = f.staging().clone();
        drop(f);
        let (f, rep) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
            .unwrap_or_else(|e| panic!("died after {upto} recording stores: {e}"));
        let mut b = vec![0u8; 4096];
        for lba in [0u64, 2] {
            f.read(lba, &mut b).unwrap();
            assert_eq!(
                observe(lba, &b),
                Observed::Tag(7),
                "upto {upto}: lba {lba} ({:?})",
                rep.recovery
            );
        }
        f.read(1, &mut b).unwrap();
        let want = if upto == RECORD_STEPS.len() { 8 } else { 7 };
        assert_eq!(observe(1, &b), Observed::Tag(want), "upto {upto}: lba 1");
    }
}

#[test]
fn a_header_of_another_layout_is_foreign_not_blank() {
    let a = StagingArea::in_memory(2).unwrap();
    assert_eq!(a.header(), AreaHeader::Blank);
    a.reset(owner(), 4).unwrap();
    assert_eq!(a.header(), AreaHeader::Owned(owner()));
    // As a build with layout version 1 wrote it (crc kept valid).
    let h = a.bytes_mut(0, 48);
    h[8..10].copy_from_slice(&1u16.to_le_bytes());
    let crc = crc32c::crc32c(&h[..44]);
    h[44..48].copy_from_slice(&crc.to_le_bytes());
    match a.header() {
        AreaHeader::Foreign(why) => assert!(why.contains("layout version 1"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A torn header (bad crc) held nothing: blank.
    a.bytes_mut(0, 48)[20] ^= 1;
    assert_eq!(a.header(), AreaHeader::Blank);
}

/// The layout is frozen: the named offsets are the drawn table (moving one is a new
/// layout version).
#[test]
fn the_named_offsets_are_the_drawn_table() {
    use super::header_offsets as h;
    use super::slot_offsets as s;
    let named = [h::MAGIC, h::VERSION, h::SLOTS, h::UUID, h::EPOCH];
    assert_eq!(named, [0, 8, 12, 16, 32]);
    assert_eq!(
        [h::SLOT_BYTES, h::CRC, h::NEXT_CHUNK_MARK, h::BOOT_ID],
        [40, 44, 48, 56]
    );
    let named = [
        s::STATE,
        s::COUNT,
        s::CHUNK_SEQ,
        s::PLACE,
        s::PLACE + s::PLACE_BYTES,
    ];
    assert_eq!(named, [0, 4, 8, 16, 40]);
    let place = [
        s::PLACE_SEGMENT,
        s::PLACE_OFFSET,
        s::PLACE_START_PBA,
        s::PLACE_STREAM,
    ];
    assert_eq!(place.map(|p| s::PLACE + p), [16, 20, 24, 32]);
    assert_eq!(s::PLACE + s::PLACE_CRC, 36);
    let entry = [s::ENTRY_KEY, s::ENTRY_SEQ, s::ENTRY_VALUE, s::ENTRY_CRC];
    assert_eq!(entry, [0, 8, 16, 20]);
    assert_eq!((s::ENTRIES, s::ENTRY_BYTES), (64, 24));
}

/// What `reset` wrote sits at the named offsets of the header.
#[test]
fn the_header_fields_sit_at_their_named_offsets() {
    use super::header_offsets as h;
    let a = StagingArea::in_memory(3).unwrap();
    a.reset(owner(), 9).unwrap();
    let b = a.bytes(0, h::BOOT_ID + 16);
    let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
    at(h::MAGIC, b"FTLSTAGE");
    at(h::VERSION, &2u16.to_le_bytes());
    at(h::SLOTS, &3u32.to_le_bytes());
    at(h::UUID, &owner().uuid);
    at(h::EPOCH, &owner().epoch.to_le_bytes());
    at(h::SLOT_BYTES, &(SLOT_BYTES as u32).to_le_bytes());
    at(h::CRC, &crc32c::crc32c(&b[..h::CRC]).to_le_bytes());
    at(h::NEXT_CHUNK_MARK, &9u64.to_le_bytes());
    at(h::BOOT_ID, &super::boot_id());
    assert!(!a.from_another_boot());
}

/// Rule 5: the boot id is this machine's (read from the kernel, a UUID), and an area
/// whose recorded boot differs is from another boot; an unknown (zero) one is not.
#[test]
fn an_area_knows_the_boot_it_was_reset_in() {
    assert_eq!(
        super::parse_uuid("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
        Some([
            0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2,
            0xe1, 0xf0
        ])
    );
    assert_eq!(super::parse_uuid("not a uuid"), None);
    assert_ne!(super::boot_id(), [0; 16], "Linux has a boot id");
    let a = StagingArea::in_memory(2).unwrap();
    a.reset(owner(), 1).unwrap();
    assert!(!a.from_another_boot());
    a.set_boot_id([0xAB; 16]);
    assert!(a.from_another_boot());
    a.set_boot_id([0; 16]);
    assert!(!a.from_another_boot(), "unknown: an older build's area");
}

/// A staged entry the summary format refuses (here a TRIM of more blocks than the
/// engine logs in one entry, with a valid entry checksum) makes the area damaged before
/// anything is written: replayed, it made a summary the roll-forward refused, which ended
/// the chain there and lost the acknowledged writes behind it.
#[test]
fn a_staged_entry_no_summary_can_hold_refuses_the_area_and_writes_nothing() {
    use crate::summary::{Entry, MAX_TRIM_BLOCKS};
    damaged_area_refuses_the_open(
        |a, slot| {
            let entries = a.read_slot(slot).entries;
            let k = entries.len();
            let seq = entries[k - 1].seq() + 1;
            let mut b = a
                .take(slot)
                .expect("the dead process's slot is free to take");
            b.record(
                k,
                &Entry::Trim {
                    lba: 8,
                    seq,
                    count: MAX_TRIM_BLOCKS + 1,
                },
                None,
            );
        },
        "cannot be logged",
    );
}

/// Unflushed writes in stream 1's open chunk of a dead process, then `damage` applied to
/// the area (given the chunk's slot): the open is refused as damaged, nothing is
/// written to the backing, and the error names the area and `expect`. Before, a header
/// that did not read, a slot state no build writes, or an entry below the count failing
/// its checksum was taken for a blank area, a free slot or the end of the entries, and
/// the completed writes were dropped without a word.
fn damaged_area_refuses_the_open(damage: impl FnOnce(&Arc<StagingArea>, u32), expect: &str) {
    use crate::device::mem::MemDevice;
    use crate::model::block_for;
    use crate::{BlockDevice, Config, Ftl, StreamId};
    let (dev, idx, f) = tiny_mem_ftl();
    for lba in 0..3u64 {
        f.write(lba, &block_for(lba, 7), false, StreamId(1))
            .unwrap();
    }
    let slot = {
        let log = f.appender();
        let st = log.stream(StreamId(1)).unwrap();
        st.chunk.as_ref().unwrap().buf.slot()
    };
    let staging = f.staging().clone();
    drop(f);
    damage(&staging, slot);
    let image = |d: &MemDevice| {
        let mut b = vec![0u8; d.size() as usize];
        d.read_at(0, &mut b).unwrap();
        b
    };
    let before = image(&dev);
    let err = match Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging) {
        Ok(_) => panic!("a damaged area was opened ({expect})"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("staging area") && err.contains(expect),
        "{err}"
    );
    assert!(image(&dev) == before, "the backing changed");
}

#[test]
fn a_damaged_area_header_over_staged_writes_refuses_the_open() {
    damaged_area_refuses_the_open(|a, _| a.bytes_mut(0, 48)[20] ^= 1, "header does not read");
}

#[test]
fn a_slot_in_a_state_no_build_writes_refuses_the_open() {
    damaged_area_refuses_the_open(
        |a, slot| {
            a.atomic32(StagingArea::slot_at(slot) + s_at::STATE)
                .store(7, Ordering::Release)
        },
        "state word 7",
    );
}

#[test]
fn a_staged_entry_below_the_count_that_fails_its_checksum_refuses_the_open() {
    damaged_area_refuses_the_open(
        |a, slot| {
            a.bytes_mut(StagingArea::slot_at(slot) + META_HEADER + META_ENTRY + 3, 1)[0] ^= 0xff
        },
        "entry 1 of the 3",
    );
}

/// A next-chunk mark below the checkpoint's next chunk (it lies outside the header's
/// checksum) would number the open slots where the roll-forward never looks: refused
/// before anything is written. A mark out of any sane range too.
#[test]
fn a_next_chunk_mark_below_the_checkpoint_refuses_the_open() {
    damaged_area_refuses_the_open(
        |a, _| {
            a.atomic64(h_at::NEXT_CHUNK_MARK)
                .store(0, Ordering::Release)
        },
        "next-chunk mark 0",
    );
    damaged_area_refuses_the_open(
        |a, _| {
            a.atomic64(h_at::NEXT_CHUNK_MARK)
                .store(u64::MAX, Ordering::Release)
        },
        "is not a chunk number of the session",
    );
}

/// An area of a session newer than the index's checkpoint (the index was restored from
/// a copy) with writes in it refuses the open: ignored as stale, its completed writes
/// were dropped without a word.
#[test]
fn an_area_newer_than_the_index_refuses_the_open() {
    damaged_area_refuses_the_open(
        |a, _| {
            let o = a.owner().unwrap();
            let h = a.bytes_mut(0, h_at::NEXT_CHUNK_MARK);
            put(h, h_at::EPOCH, &(o.epoch + 1).to_le_bytes());
            let crc = crc32c::crc32c(&h[..h_at::CRC]);
            put(h, h_at::CRC, &crc.to_le_bytes());
        },
        "newer than the index's checkpoint",
    );
}

/// A mark above the chain (sane, but past chunks no session sealed) numbers the open
/// slots past a gap the roll-forward stops at: recovery refuses the open instead of
/// losing their completed writes without a word.
#[test]
fn staged_chunks_the_roll_forward_does_not_reach_refuse_the_open() {
    use crate::model::block_for;
    use crate::{Config, Ftl, StreamId};
    let (dev, idx, f) = tiny_mem_ftl();
    for lba in 0..3u64 {
        f.write(lba, &block_for(lba, 7), false, StreamId(1))
            .unwrap();
    }
    let staging = f.staging().clone();
    drop(f);
    let mark = staging.next_chunk_mark();
    staging
        .atomic64(h_at::NEXT_CHUNK_MARK)
        .store(mark + 1000, Ordering::Release);
    let err = match Ftl::open_staged(dev, idx, Config::default(), staging) {
        Ok(_) => panic!("writes numbered past the chain were dropped silently"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("the staging area replayed chunks up to"),
        "{err}"
    );
}

/// A reset cut short by a process death (it frees every slot BEFORE it writes the
/// header) leaves a header that does not read over free slots: nothing to replay, and
/// the open goes on.
#[test]
fn a_torn_header_over_free_slots_opens() {
    use crate::{Config, Ftl};
    let (dev, idx, f) = tiny_mem_ftl();
    f.close().unwrap();
    let staging = f.staging().clone();
    drop(f);
    staging.bytes_mut(0, 48)[20] ^= 1;
    assert_eq!(staging.header(), AreaHeader::Blank);
    Ftl::open_staged(dev, idx, Config::default(), staging).expect("a torn reset holds nothing");
}

/// Staging rule 6: a process dying between the steps of the reset an open makes (after
/// its replay) loses nothing, and the next open goes on: after the slots were freed the
/// old session's header is left over free slots. (With the header written first, the
/// new session's header was left over the slots just replayed, and the next open replayed
/// them again at places behind its checkpoint and was refused.)
#[test]
fn a_death_between_a_resets_steps_loses_nothing() {
    use crate::model::block_for;
    use crate::{Config, Ftl, StreamId};
    for upto in 0..=RESET_STEPS.len() {
        let (dev, idx, f) = tiny_mem_ftl();
        for lba in 0..6u64 {
            f.write(lba, &block_for(lba, 7), false, StreamId(1 + lba as u8 % 3))
                .unwrap();
        }
        let staging = f.staging().clone();
        drop(f);
        // The open replays the staged chunks, then dies after `upto` of its reset's steps.
        RESET_UPTO.with(|u| u.set(Some(upto)));
        let (f, _) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
            .unwrap_or_else(|e| panic!("upto {upto}: first open: {e}"));
        let staging = f.staging().clone();
        drop(f);
        let (f, rep) = Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
            .unwrap_or_else(|e| panic!("died after {upto} reset steps: the next open: {e}"));
        assert_tags(
            &f,
            0..6u64,
            7,
            &format!("died after {upto} reset steps ({:?})", rep.recovery),
        );
    }
}

/// A reset of an area in a file writes the header page back before any slot is handed
/// out: on a disk (not tmpfs) a power cut could otherwise leave slot pages on the disk
/// without the header, and the next open refuses the area as damaged instead of
/// ignoring it as another boot's (found by review, 2026-11-27). An area in memory has
/// nothing to write back.
#[test]
fn a_reset_writes_a_file_backed_header_back() {
    let dir = tempfile::tempdir().unwrap();
    let a = StagingArea::open_file(&dir.path().join("area.stage"), 2).unwrap();
    let before = FILE_SYNCS.with(|n| n.get());
    a.reset(owner(), 3).unwrap();
    assert!(
        FILE_SYNCS.with(|n| n.get()) > before,
        "the header was not written back"
    );
    let bytes = std::fs::read(dir.path().join("area.stage")).unwrap();
    assert_eq!(&bytes[..8], MAGIC);
}

/// A seal that panics (or fails) after its slot was marked sealed keeps the slot out of
/// use: another writer of the dying FTL (one in the middle of a multi-chunk write) took
/// it from the free list and opened it over the sealed chunk, and after a kill the
/// replay found no chunk of that number, losing its completed writes and every chunk
/// after it.
#[test]
fn a_slot_whose_seal_failed_is_not_handed_out_again() {
    use crate::append::tests::PANIC_IN_SEAL;
    use crate::model::block_for;
    use crate::{Config, Ftl, StreamId};
    let (dev, idx, f) = tiny_mem_ftl();
    let f = Arc::new(f);
    let staging = f.staging().clone();
    for lba in 0..3u64 {
        f.write(lba, &block_for(lba, 7), false, StreamId(1))
            .unwrap();
    }
    let free_before = staging.free_slots();
    let f2 = f.clone();
    let dying = std::thread::spawn(move || {
        PANIC_IN_SEAL.with(|p| p.set(true));
        let _ = f2.flush();
    });
    assert!(dying.join().is_err(), "the injected panic happened");
    assert_eq!(staging.kept_slots(), 1, "the sealed slot is kept");
    assert_eq!(staging.free_slots(), free_before, "and not given back");
    // Another writer of the same process takes every slot it can and opens it.
    let mut taken = Vec::new();
    while let Some(mut b) = staging.try_take() {
        b.open(SlotPlace {
            stream: 2,
            seg: 9,
            offset: 0,
            start_pba: 9 * 16,
        });
        taken.push(b);
    }
    drop(taken);
    // The process dies; the next one replays the area.
    drop(f);
    let (f, rep) = Ftl::open_staged(dev, idx, Config::default(), staging.clone()).unwrap();
    assert_tags(
        &f,
        0..3u64,
        7,
        &format!("after the replay ({:?})", rep.recovery),
    );
    assert_eq!(staging.kept_slots(), 0, "the next session's reset frees it");
}

/// A staging file is opened only as a regular file, not through a symlink planted at its
/// path (a run directory others can write to): the link's target was resized and written.
#[test]
fn a_symlink_at_the_staging_path_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let target = d.path().join("victim");
    std::fs::write(&target, b"precious").unwrap();
    let link = d.path().join("x.stage");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = StagingArea::open_file(&link, 1).expect_err("a symlink was followed");
    assert!(matches!(e, crate::Error::Open { .. }), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
}

#[test]
fn a_staging_file_is_allocated_whole_before_it_is_mapped() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("area.stage");
    let a = StagingArea::open_file(&p, 2).unwrap();
    let m = std::fs::metadata(&p).unwrap();
    assert!(m.len() > 0);
    assert!(
        m.blocks() * 512 >= m.len(),
        "{} of {} bytes allocated: a full file system would SIGBUS the first write",
        m.blocks() * 512,
        m.len()
    );
    drop(a);
}

/// An index restored to an older session's snapshot, opened with that session's staging
/// area, is refused BEFORE the staged chunks are written: the log goes on with a later
/// session's flushed chunks where the staged one would be written, and the replay wrote
/// over them first. The later session's data reads back afterwards.
#[test]
fn an_older_index_with_its_staging_area_is_refused_before_the_replay_writes() {
    use crate::model::{block_for, observe, Observed};
    use crate::{Config, Ftl, StreamId};
    // The staged chunk at the checkpoint's cursor, or past a chunk flushed after it (the
    // first form of the check looked only at cursors and free heads).
    for flushed_first in [false, true] {
        let (dev, idx, f) = tiny_mem_ftl();
        // Session E: a completed write staged, never flushed; the index copied; the process
        // dies.
        if flushed_first {
            for l in 20..24 {
                f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
            }
            f.flush().unwrap();
        }
        f.write(0, &block_for(0, 1), false, StreamId(1)).unwrap();
        let (old_idx, ()) = idx.snapshot_while(|| ()).unwrap();
        let area_e = f.staging().clone();
        drop(f);
        // Session E+1 with an area of its own: writes at the same place, flushed, closed.
        let (g, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        for l in 0..8 {
            g.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        g.flush().unwrap();
        g.close().unwrap();
        drop(g);
        let image = |d: &crate::device::mem::MemDevice| {
            use crate::device::BlockDevice;
            let mut v = vec![0u8; d.size() as usize];
            d.read_at(0, &mut v).unwrap();
            v
        };
        let before = image(&dev);
        let e = Ftl::open_staged(dev.clone(), Arc::new(old_idx), Config::default(), area_e)
            .err()
            .expect("an index older than the log");
        assert!(
            matches!(
                e,
                crate::Error::IndexMismatch { .. } | crate::Error::Corrupt(_)
            ),
            "{e}"
        );
        assert!(
            image(&dev) == before,
            "the refused open wrote to the backing"
        );
        let (h, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        let mut b = vec![0u8; 4096];
        for l in 0..8 {
            h.read(l, &mut b).unwrap();
            assert_eq!(
                observe(l, &b),
                Observed::Tag(2),
                "lba {l} ({flushed_first})"
            );
        }
    }
}

/// Staging rule 9: two copies of a backing (a cloned image: same uuid) opened as many
/// times have equal epochs, and their servers share the staging file (named by the
/// uuid). Copy A's server dies with a completed write in the area; copy B, opened next,
/// took A's write for its own and wrote A's chunk into its log (lba 0 read A's data).
/// Refused now before anything is written, and the area kept: A's next open replays it.
#[test]
fn another_copys_area_refuses_the_open_and_is_kept() {
    use crate::device::mem::MemDevice;
    use crate::model::{block_for, observe, Observed};
    use crate::{BlockDevice, Config, Ftl, StreamId};
    let (dev, idx, f) = tiny_mem_ftl();
    f.write(0, &block_for(0, 1), false, StreamId(1)).unwrap();
    f.close().unwrap();
    drop(f);
    let len = 32 * (64 << 10);
    let image = |d: &MemDevice| {
        let mut b = crate::device::AlignedBuf::new(len);
        d.read_at(0, &mut b).unwrap();
        b.to_vec()
    };
    let dev_b = Arc::new(MemDevice::new(len as u64));
    dev_b.write_at(0, &image(&dev)).unwrap();
    let idx_b = Arc::new(idx.snapshot_while(|| ()).unwrap().0);
    // B is served once, a write flushed, and closed: its epoch is the one A gets next.
    let (b, _) = Ftl::open(dev_b.clone(), idx_b.clone(), Config::default()).unwrap();
    b.write(0, &block_for(0, 3), true, StreamId(1)).unwrap();
    b.close().unwrap();
    drop(b);
    // A, served with the shared area, completes a write and its server dies.
    let area = StagingArea::in_memory(8).unwrap();
    let (a, _) =
        Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), area.clone()).unwrap();
    // As many chunks sealed as B's session wrote, then the write left in an open slot.
    a.write(5, &block_for(5, 2), true, StreamId(1)).unwrap();
    a.write(0, &block_for(0, 2), false, StreamId(1)).unwrap();
    drop(a);
    // B next, with the same area: refused, nothing written.
    let before = image(&dev_b);
    let e = Ftl::open_staged(
        dev_b.clone(),
        idx_b.clone(),
        Config::default(),
        area.clone(),
    )
    .err()
    .expect("B took copy A's staged write for its own");
    assert!(
        e.to_string().contains("another copy of this backing"),
        "{e}"
    );
    assert!(image(&dev_b) == before, "the refused open wrote to B");
    // A's open replays its write.
    let (a, _) =
        Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), area.clone()).unwrap();
    let mut buf = vec![0u8; 4096];
    a.read(0, &mut buf).unwrap();
    assert_eq!(
        observe(0, &buf),
        Observed::Tag(2),
        "A lost its completed write"
    );
    a.close().unwrap();
    drop(a);
    // B opens now (the area is A's newer session's, empty), with its own data.
    let (b, _) = Ftl::open_staged(dev_b.clone(), idx_b.clone(), Config::default(), area).unwrap();
    b.read(0, &mut buf).unwrap();
    assert_eq!(observe(0, &buf), Observed::Tag(3));
}
