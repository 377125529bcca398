//! The committed seed corpus, built from readable structures.
//!
//! `FTL_FUZZ_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml --test replay`
//! writes them to `fuzz/corpus/<target>/seed-<name>`; the replay test checks the
//! committed files still equal what is built here.

use crate::decode::{FIT, FIX_CRC};
use crate::enc;
use crate::open_corrupt::{Case, Damage, IndexKey, Poke, Put};
use crate::ops::Op::{self, *};
use crate::tiny;
use ftl::device::BLOCK_SIZE;
use ftl::records::ckpt_offsets as ckpt;
use ftl::records::{
    CheckpointRecord, Counters, FreeRecord, MapPage, SegState, SegmentRecord, PAGE_ENTRIES,
};
use ftl::summary::{offsets as summary_at, ChunkSummary, Entry};
use ftl::superblock::{offsets as sb_at, Superblock};
use ftl::Geometry;

/// One seed input.
pub struct Seed {
    /// "corpus" or "regressions".
    pub dir: &'static str,
    pub target: &'static str,
    pub name: &'static str,
    pub bytes: Vec<u8>,
}

fn w(lba: u8, blocks: u8, stream: u8) -> Op {
    Write {
        lba,
        blocks,
        fua: false,
        stream,
    }
}

/// `ops` seeds: each a readable scenario.
pub fn ops_seeds() -> Vec<(&'static str, Vec<Op>)> {
    let mut fill = Vec::new();
    for i in 0..60u8 {
        fill.push(w(i.wrapping_mul(37), 7, i % 4));
        if i % 10 == 9 {
            fill.push(Flush);
        }
    }
    fill.push(Clean { seg: 0, max: 200 });
    fill.push(Clean { seg: 1, max: 200 });
    fill.push(Clean { seg: 2, max: 3 });
    fill.push(Checkpoint);
    fill.push(w(5, 7, 0));
    fill.push(Crash { seed: 11 });
    fill.push(Read { lba: 0, blocks: 7 });

    let mut overwrite = Vec::new();
    for i in 0..40u8 {
        overwrite.push(w(i % 6, 3, i % 3));
        overwrite.push(w(10 + i, 0, i % 3));
        overwrite.push(Read {
            lba: i % 6,
            blocks: 3,
        });
    }
    overwrite.push(Checkpoint);
    for seg in 0..8 {
        overwrite.push(Clean { seg, max: 255 });
    }
    overwrite.push(Checkpoint);
    overwrite.push(Crash { seed: 5 });

    // Scattered writes fragment every segment until the log is full (no cleaner).
    let scatter = |n: u8| -> Vec<Op> { (0..n).map(|i| w(i.wrapping_mul(59), 7, i % 4)).collect() };
    let mut pressure = scatter(80);
    for seg in 0..47 {
        pressure.push(Clean { seg, max: 255 });
    }
    pressure.push(Checkpoint);
    pressure.extend(scatter(60));
    pressure.push(Crash { seed: 15 });
    pressure.push(Close);

    vec![
        ("no-space", scatter(180)),
        ("clean-under-pressure", pressure),
        (
            "close-reopen",
            vec![
                w(0, 7, 1),
                Trim { lba: 2, blocks: 1 },
                Close,
                w(1, 1, 2),
                Close,
                Close,
            ],
        ),
        (
            // The process dies with writes in three streams' open chunks, a trim and a
            // chunk written but not synced: all of them must read back.
            "kill",
            vec![
                w(0, 7, 0),
                w(8, 3, 1),
                w(12, 2, 2),
                Flush,
                w(1, 2, 1),
                Trim { lba: 12, blocks: 1 },
                Checkpoint,
                w(30, 4, 3),
                Crash { seed: 14 },
                Read { lba: 0, blocks: 7 },
                Read { lba: 8, blocks: 7 },
                Read { lba: 30, blocks: 4 },
                w(2, 1, 0),
                Crash { seed: 30 },
            ],
        ),
        (
            "write-flush-crash",
            vec![
                w(0, 3, 1),
                Read { lba: 0, blocks: 3 },
                Flush,
                w(2, 3, 1),
                Crash { seed: 1 },
                Read { lba: 0, blocks: 7 },
            ],
        ),
        (
            "fua",
            vec![
                w(10, 2, 0),
                FuaWrite {
                    lba: 40,
                    blocks: 0,
                    stream: 2,
                },
                w(11, 4, 3),
                Crash { seed: 2 },
                Read { lba: 40, blocks: 0 },
            ],
        ),
        (
            "trim-zeroes",
            vec![
                w(20, 7, 1),
                Flush,
                Trim { lba: 21, blocks: 2 },
                WriteZeroes { lba: 25, blocks: 1 },
                Read { lba: 20, blocks: 7 },
                Flush,
                Crash { seed: 3 },
                Trim {
                    lba: 90,
                    blocks: 19,
                },
                Crash { seed: 4 },
            ],
        ),
        (
            "checkpoint-crash",
            vec![
                w(0, 7, 1),
                w(8, 7, 2),
                Checkpoint,
                w(4, 7, 3),
                Flush,
                w(1, 1, 0),
                Checkpoint,
                w(2, 2, 1),
                Crash { seed: 9 },
                w(3, 3, 3),
                Crash { seed: 10 },
            ],
        ),
        (
            "relocate",
            vec![
                w(30, 4, 1),
                Relocate { lba: 31 },
                Read { lba: 30, blocks: 4 },
                Flush,
                Relocate { lba: 30 },
                Crash { seed: 6 },
                Relocate { lba: 32 },
                Checkpoint,
                Crash { seed: 7 },
            ],
        ),
        ("fill-and-clean", fill),
        ("overwrite-clean", overwrite),
        (
            "invalid",
            (0..9u8)
                .map(|k| Invalid {
                    lba: if k < 3 { u64::MAX - k as u64 } else { k as u64 },
                    blocks: 7,
                    kind: k,
                })
                .chain([w(3, 2, 1), Flush])
                .chain((0..9u8).map(|k| Invalid {
                    lba: 3,
                    blocks: 1,
                    kind: k,
                }))
                .collect(),
        ),
        (
            "faults",
            vec![
                w(0, 3, 1),
                Flush,
                w(4, 2, 2),
                Fault { kind: 0, seed: 1 },
                Flush,
                w(8, 1, 1),
                Fault { kind: 1, seed: 2 },
                FuaWrite {
                    lba: 9,
                    blocks: 1,
                    stream: 3,
                },
                w(10, 7, 0),
                Fault { kind: 2, seed: 3 },
                Read { lba: 10, blocks: 7 },
                Fault { kind: 3, seed: 4 },
                Checkpoint,
                Checkpoint,
                Fault { kind: 0, seed: 5 },
                w(20, 7, 1),
                Fault { kind: 0, seed: 6 },
                Checkpoint,
                Fault { kind: 2, seed: 7 },
                Relocate { lba: 0 },
                Fault { kind: 1, seed: 8 },
                Trim { lba: 1, blocks: 3 },
                Flush,
                Read { lba: 0, blocks: 7 },
            ],
        ),
        (
            "streams-crashes",
            (0..24u8)
                .flat_map(|i| {
                    [
                        w(i * 5, i % 8, i % 4),
                        if i % 5 == 4 {
                            Crash { seed: i as u64 }
                        } else if i % 3 == 0 {
                            Flush
                        } else {
                            Read {
                                lba: i * 5,
                                blocks: 7,
                            }
                        },
                    ]
                })
                .collect(),
        ),
    ]
}

fn put(lba: u8, blocks: u8, stream: u8) -> Put {
    Put {
        lba,
        blocks,
        stream,
        trim: false,
    }
}

fn base_case() -> Case {
    Case {
        writes: vec![put(0, 7, 1), put(10, 3, 2), put(40, 0, 3), put(3, 2, 1)],
        checkpoint: true,
        tail: vec![put(50, 2, 1)],
        damage: vec![],
        poke: None,
        write_after: true,
    }
}

/// Block numbers of the tiny device's interesting places.
const SB_A: u16 = 0;
const SB_B: u16 = 15;
const SEG1: u16 = 16;
const SEG2: u16 = 32;

/// Hand-made reproducers of known bugs (`regressions/open_corrupt/`), one per bug.
pub fn open_corrupt_regressions() -> Vec<(&'static str, Case)> {
    let edit_checkpoint = |offset: u16, bytes: Vec<u8>| Case {
        poke: Some(Poke::Edit {
            record: 0,
            offset,
            bytes,
            resize: None,
            fix_crc: true,
        }),
        ..base_case()
    };
    vec![
        // Checkpoint record (index key "c", record 0) with epoch u64::MAX, crc fixed.
        (
            "recovery-epoch-overflow",
            edit_checkpoint(ckpt::EPOCH as u16, vec![0xff; 8]),
        ),
        // Checkpoint record with next_chunk_seq u64::MAX: the first chunk sealed after
        // the open overflows the chain number.
        (
            "chunk-seq-overflow",
            edit_checkpoint(ckpt::NEXT_CHUNK_SEQ as u16, vec![0xff; 8]),
        ),
        // The first chunk of the log (segment 1, block 16: stream 1's, 11 entries with
        // seq deltas up to 15) with base_seq u64::MAX - 15, crc fixed, no checkpoint
        // since: its entries are replayed and the last one's seq is u64::MAX.
        (
            "recovery-entry-seq-overflow",
            Case {
                checkpoint: false,
                damage: vec![Damage::Bytes {
                    block: SEG1,
                    offset: summary_at::BASE_SEQ as u16,
                    bytes: vec![0xf0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                    fix_crc: true,
                }],
                ..base_case()
            },
        ),
    ]
}

/// `open_corrupt` seeds.
pub fn open_corrupt_seeds() -> Vec<(&'static str, Case)> {
    let with = |damage: Vec<Damage>, poke: Option<Poke>| Case {
        damage,
        poke,
        ..base_case()
    };
    let bytes = |block: u16, offset: u16, b: &[u8], fix_crc: bool| Damage::Bytes {
        block,
        offset,
        bytes: b.to_vec(),
        fix_crc,
    };
    let seg_record = |segment: u32, state: SegState, stream: u8| SegmentRecord {
        segment,
        state,
        stream,
        erase_count: 0,
        opened_seq: 0,
        valid: 0,
    };
    vec![
        ("pristine", base_case()),
        (
            "pristine-no-checkpoint",
            Case {
                checkpoint: false,
                write_after: false,
                ..base_case()
            },
        ),
        (
            "sb-a-zeroed",
            with(
                vec![Damage::Fill {
                    block: SB_A,
                    byte: 0,
                }],
                None,
            ),
        ),
        (
            "sb-both",
            with(
                vec![
                    Damage::Fill {
                        block: SB_A,
                        byte: 0x41,
                    },
                    bytes(SB_B, sb_at::SEGMENT_BYTES as u16, &[0xff; 8], true),
                ],
                None,
            ),
        ),
        (
            "sb-geometry-fixed-crc",
            with(
                vec![bytes(
                    SB_A,
                    sb_at::EXPORTED_BLOCKS as u16,
                    &[0xff, 0xff, 0, 0],
                    true,
                )],
                None,
            ),
        ),
        (
            "summary-entries-fixed-crc",
            with(
                vec![bytes(
                    SEG1,
                    summary_at::N_ENTRIES as u16,
                    &[0xff, 0x00, 0x09, 0x00],
                    true,
                )],
                None,
            ),
        ),
        (
            "summary-lba-fixed-crc",
            with(
                vec![bytes(SEG1, summary_at::ENTRIES as u16, &[0xff; 8], true)],
                None,
            ),
        ),
        (
            "summary-pad-fixed-crc",
            with(
                vec![bytes(
                    SEG1,
                    summary_at::PAD_BLOCKS as u16,
                    &[0xff, 0x7f],
                    true,
                )],
                None,
            ),
        ),
        (
            "summary-copied",
            with(
                vec![Damage::Copy {
                    from: SEG1,
                    to: SEG2,
                }],
                None,
            ),
        ),
        (
            "data-block",
            with(vec![bytes(SEG1 + 1, 100, &[1, 2, 3], false)], None),
        ),
        (
            "checkpoint-epoch-huge",
            with(
                vec![],
                Some(Poke::Edit {
                    record: 0,
                    offset: ckpt::EPOCH as u16,
                    bytes: vec![0, 0, 0, 0, 0, 0, 0, 0x80],
                    resize: None,
                    fix_crc: true,
                }),
            ),
        ),
        (
            "checkpoint-cursor",
            with(
                vec![],
                Some(Poke::Edit {
                    record: 0,
                    offset: ckpt::cursor(1) as u16,
                    bytes: vec![1, 0, 0, 0, 0xfe, 0xff, 0, 0],
                    resize: None,
                    fix_crc: true,
                }),
            ),
        ),
        (
            "checkpoint-next-chunk-huge",
            with(
                vec![],
                Some(Poke::Edit {
                    record: 0,
                    offset: ckpt::NEXT_CHUNK_SEQ as u16,
                    bytes: vec![0, 0, 0, 0, 0, 0, 0, 0x80],
                    resize: None,
                    fix_crc: true,
                }),
            ),
        ),
        (
            "segment-marked-free",
            with(
                vec![],
                Some(Poke::Raw {
                    key: IndexKey::Segment(1),
                    value: seg_record(1, SegState::Free, 1).encode(),
                }),
            ),
        ),
        (
            "segment-bad-stream",
            with(
                vec![],
                Some(Poke::Raw {
                    key: IndexKey::Segment(3),
                    value: seg_record(3, SegState::Open, 200).encode(),
                }),
            ),
        ),
        (
            "map-page-outside",
            with(
                vec![],
                Some(Poke::Raw {
                    key: IndexKey::MapPage(0),
                    value: MapPage {
                        page: 0,
                        entries: vec![3; 8],
                    }
                    .encode(),
                }),
            ),
        ),
        (
            "map-page-wrong-crc-entry",
            with(
                vec![],
                Some(Poke::Raw {
                    key: IndexKey::MapPage(0),
                    value: MapPage {
                        page: 0,
                        entries: vec![17, 18, 400, u64::MAX],
                    }
                    .encode(),
                }),
            ),
        ),
        (
            "index-junk-key",
            with(
                vec![],
                Some(Poke::Raw {
                    key: IndexKey::Other(b"zz".to_vec()),
                    value: vec![1, 2, 3],
                }),
            ),
        ),
        (
            "index-truncated",
            with(
                vec![],
                Some(Poke::Edit {
                    record: 0,
                    offset: 0,
                    bytes: vec![],
                    resize: Some(20),
                    fix_crc: true,
                }),
            ),
        ),
    ]
}

fn tiny_superblock() -> Superblock {
    Superblock {
        uuid: [0x42; 16],
        geometry: Geometry::resolve(tiny::DEVICE_BYTES, &tiny::options()).expect("tiny geometry"),
        created_secs: 1_700_000_000,
    }
}

fn summary() -> Vec<u8> {
    let s = ChunkSummary {
        stream: 1,
        chunk_seq: 5,
        epoch: 2,
        format_id: 0x4242_4242_4242_4242,
        segment: 3,
        offset: 4,
        data_blocks: 2,
        pad_blocks: 1,
        entries: vec![
            Entry::Data {
                lba: 7,
                seq: 100,
                crc: 0xdead_beef,
            },
            Entry::Trim {
                lba: 9,
                seq: 101,
                count: 4,
            },
            Entry::Data {
                lba: 8,
                seq: 103,
                crc: 1,
            },
        ],
    };
    let mut b = vec![0u8; BLOCK_SIZE];
    s.encode_into(&mut b).expect("summary encodes");
    b
}

fn checkpoint() -> Vec<u8> {
    CheckpointRecord {
        uuid: [0x42; 16],
        epoch: 3,
        next_chunk_seq: 10,
        next_entry_seq: 200,
        exported_blocks: 393,
        segment_count: 32,
        session: 0x5e55_1011,
        counters: Counters {
            flushes: 4,
            ..Default::default()
        },
        cursors: vec![
            None,
            Some((2, 8)),
            None,
            None,
            None,
            None,
            None,
            Some((5, 0)),
        ],
    }
    .encode()
}

fn decode_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let sel = |which: u8, flags: u8, bytes: Vec<u8>| {
        let mut v = vec![which | flags];
        v.extend(bytes);
        v
    };
    let sb = tiny_superblock().encode();
    let seg = SegmentRecord {
        segment: 4,
        state: SegState::Closed,
        stream: 2,
        erase_count: 1,
        opened_seq: 77,
        valid: 9,
    }
    .encode();
    let page = MapPage {
        page: 0,
        entries: vec![17, u64::MAX, (0x1234 << 32) | 20],
    }
    .encode();
    let free = FreeRecord {
        segment: 4,
        epoch: 2,
        base: 60,
        chain: 90,
        erase_count: 3,
        chunks: vec![61, 75],
    }
    .encode();
    let partial = ftl::records::PartialCheckpoint {
        epoch: 3,
        next_chunk_seq: 70,
    }
    .encode();
    let full_page = MapPage {
        page: 1,
        entries: (0..PAGE_ENTRIES as u64).collect(),
    }
    .encode();
    vec![
        ("empty", vec![]),
        ("superblock", sel(0, 0, sb.clone())),
        (
            "superblock-header-fit",
            sel(0, FIT | FIX_CRC, sb[..80].to_vec()),
        ),
        ("summary", sel(1, 0, summary())),
        (
            "summary-header-fit",
            sel(1, FIT | FIX_CRC, summary()[..112].to_vec()),
        ),
        ("segment-record", sel(2, 0, seg.clone())),
        ("segment-record-fix", sel(2, FIX_CRC, seg)),
        ("map-page", sel(3, 0, page.clone())),
        ("map-page-fit", sel(3, FIT | FIX_CRC, page[..16].to_vec())),
        ("map-page-full", sel(3, 0, full_page)),
        ("free-record", sel(5, 0, free.clone())),
        (
            "free-record-fit",
            sel(5, FIT | FIX_CRC, free[..20].to_vec()),
        ),
        ("partial-checkpoint", sel(6, 0, partial.clone())),
        (
            "partial-checkpoint-fit",
            sel(6, FIT | FIX_CRC, partial[..12].to_vec()),
        ),
        ("checkpoint", sel(4, 0, checkpoint())),
        (
            "checkpoint-fit",
            sel(4, FIT | FIX_CRC, checkpoint()[..72].to_vec()),
        ),
        (
            "garbage",
            sel(4, FIX_CRC, b"FTLCKPT1\x01\0\0\0\x07\0\0\0".to_vec()),
        ),
    ]
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    for (name, ops) in ops_seeds() {
        out.push(Seed {
            dir: "corpus",
            target: "ops",
            name,
            bytes: enc::ops(&ops),
        });
    }
    for (name, bytes) in decode_seeds() {
        out.push(Seed {
            dir: "corpus",
            target: "decode",
            name,
            bytes,
        });
    }
    for (name, case) in open_corrupt_seeds() {
        out.push(Seed {
            dir: "corpus",
            target: "open_corrupt",
            name,
            bytes: enc::case(&case),
        });
    }
    for (name, input) in request_seeds() {
        out.push(Seed {
            dir: "corpus",
            target: "request",
            name,
            bytes: crate::request::encode(&input),
        });
    }
    for (name, case) in open_corrupt_regressions() {
        out.push(Seed {
            dir: "regressions",
            target: "open_corrupt",
            name,
            bytes: enc::case(&case),
        });
    }
    out
}

/// `request` seeds: one of each operation, and the edges of each check.
pub fn request_seeds() -> Vec<(&'static str, crate::request::Input)> {
    use crate::request::Input;
    use ftl::request::{F_FUA, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE, OP_WRITE_ZEROES};
    let base = Input {
        op_flags: OP_READ,
        start_sector: 64,
        nr_sectors: 128,
        capacity_blocks: 1 << 20,
        buf_bytes: 512 << 10,
    };
    vec![
        ("read", base),
        (
            "write-fua",
            Input {
                op_flags: OP_WRITE | F_FUA,
                ..base
            },
        ),
        (
            "flush",
            Input {
                op_flags: OP_FLUSH,
                ..base
            },
        ),
        (
            "discard-big",
            Input {
                op_flags: OP_DISCARD,
                nr_sectors: 1 << 21,
                ..base
            },
        ),
        (
            "write-zeroes",
            Input {
                op_flags: OP_WRITE_ZEROES,
                ..base
            },
        ),
        (
            "past-end",
            Input {
                start_sector: (1 << 23) - 64,
                ..base
            },
        ),
        (
            "unaligned",
            Input {
                start_sector: 65,
                ..base
            },
        ),
        (
            "too-big",
            Input {
                op_flags: OP_WRITE,
                nr_sectors: 1032,
                ..base
            },
        ),
        (
            "overflow",
            Input {
                op_flags: OP_DISCARD,
                start_sector: u64::MAX - 7,
                ..base
            },
        ),
        (
            "zone-op",
            Input {
                op_flags: 10,
                ..base
            },
        ),
    ]
}
