//! The stats document: the JSON a daemon's stats socket (`/run/ftlblk/N.sock`) sends and
//! `ftlblk stats` reads, defined once for both ends.
//!
//! - Producer: the daemon's control plane ([`crate::control`]) builds it with
//!   [`StatsDocument::collect`] for each connection and sends [`StatsDocument::to_json`].
//! - Consumer: [`crate::stats_cmd`] parses it with [`StatsDocument::from_json`] and prints
//!   the table (`--json` prints the text as received).
//!
//! Keys (other tools read them: `scripts/e2e-guest.sh` greps `mapped_blocks`, `waf` and
//! `bytes_per_block`): `device` (the [`DeviceRecord`], `null` before the device is live),
//! `stats` ([`ftl::Stats`]), `backing_allocated_bytes` (`null` unless the backing
//! is a regular file), `classifier` (`bytes_per_block`, `plans`, `idle_streams`) and
//! `cleaner` (`stats`: [`cleaner::RunnerStats`], `last_error`, `stopped`; `null` without a cleaner).
//! Objects are written with their keys sorted, as the document always was: it is
//! rendered through a `serde_json::Value`, whose maps are sorted.
//!
//! The library's figures ([`ftl::Stats`], [`cleaner::RunnerStats`] and what they
//! embed) are `Serialize` only, so the document carries them as mirrors
//! ([`FtlFigures`], [`CounterFigures`], [`CleanerRunFigures`], [`CleanerSliceFigures`]):
//! the fields `ftlblk stats` prints are typed; every other field the library writes passes
//! through untouched in `other` (a JSON map), so the socket sends every key the library
//! emits, including ones added after these mirrors were written. A typed field missing
//! from a received document (a daemon of another version) reads as 0.
//!
//! Uses [`crate::runfiles`] (the record) and the library crates; used by `control` and
//! `stats_cmd`.

use crate::runfiles::DeviceRecord;
use cleaner::{CleanerHandle, RunnerStats};
use ftl::backing::FileFtl;
use ftl::classify::Classifier;
use ftl::Stats;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a stats client receives.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StatsDocument {
    /// The device served (`None` until it is live).
    pub device: Option<DeviceRecord>,
    /// The FTL's figures.
    pub stats: FtlFigures,
    /// Bytes the backing occupies on its file system (`du`), when it is a regular file:
    /// shows dead segments going back to the file system as they are discarded.
    pub backing_allocated_bytes: Option<u64>,
    /// The online classifier's figures.
    pub classifier: ClassifierFigures,
    /// The cleaner's figures (`None`: the device runs without a cleaner).
    pub cleaner: Option<CleanerFigures>,
    /// A sample of the map's fragmentation (absent when it could not be taken).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map_fragmentation: Option<MapFragmentation>,
    /// Latencies of the requests completed at the ublk edge (absent outside a daemon).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<crate::metrics::LatencyFigures>,
    /// The FTL's lifetime counters when this daemon opened the device (absent outside a
    /// daemon): the metrics' counters count from them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters_at_open: Option<CounterFigures>,
    /// Backing blocks written per user block over the last minute (absent without user
    /// writes in it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waf_last_minute: Option<f64>,
}

/// Windows of 128 KiB sampled over the map for `ftlblk stats`.
pub const SAMPLE_WINDOWS: u64 = 256;
/// Blocks per sampled window (128 KiB).
pub const SAMPLE_WINDOW_BLOCKS: u64 = 32;

/// The map's fragmentation, sampled ([`ftl::Ftl::fragmentation_sample`]): 128 KiB
/// windows at random over the exported space, the backing reads a 128 KiB read of each
/// takes and the mean physically contiguous run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MapFragmentation {
    /// Sampled windows holding data.
    pub windows: u64,
    pub backing_reads_per_128k: f64,
    pub mean_run_blocks: f64,
}

/// [`ftl::Stats`] as the document carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FtlFigures {
    pub block_size: u64,
    pub exported_blocks: u64,
    pub mapped_blocks: u64,
    pub segment_count: u64,
    pub free_segments: u64,
    pub dead_segments: u64,
    pub undiscarded_segments: u64,
    pub waf: f64,
    pub checkpoints: u64,
    pub free_records: u64,
    pub segments_freed_by_records: u64,
    /// Of `free_records`, those committed while a checkpoint ran (its map pages).
    pub free_records_beside_checkpoints: u64,
    /// Segments checkpoints freed right after their log sync (their own free records).
    pub segments_freed_early_by_checkpoints: u64,
    pub epoch: u64,
    pub map_ram_bytes: u64,
    pub map_cache: ftl::MapCacheStats,
    pub index_bytes_on_disk: u64,
    pub counters: CounterFigures,
    /// Segment reuse counts.
    pub wear: ftl::WearFigures,
    /// What large reads cost and what read-driven defragmentation did.
    pub fragmentation: FragFigures,
    /// Nanoseconds writers spent in the cleaner's throttle (summed over writers).
    pub throttled_ns: u64,
    /// Blocks appended per stream since open.
    pub stream_blocks_written: Vec<u64>,
    /// TRIM segments whose records could not be carried since open, and the last error
    /// (absent from older daemons' documents: 0 and none).
    #[serde(default)]
    pub tombstone_carry_failures: u64,
    #[serde(default)]
    pub tombstone_carry_error: Option<String>,
    /// The fields `ftlblk stats` does not print, as the FTL wrote them.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// [`ftl::FragFigures`] as the document carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FragFigures {
    /// low, medium or high (`ftl::frag::FragLevel`).
    pub level: String,
    pub large_reads: u64,
    pub mean_run_blocks: f64,
    pub recent_mean_run_blocks: f64,
    pub defrag_waiting: u64,
    pub defrag_dropped: u64,
    pub defrag_windows: u64,
    pub defrag_moved_blocks: u64,
    /// The fields `ftlblk stats` does not print.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// [`ftl::Counters`] as the document carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterFigures {
    pub user_blocks_written: u64,
    pub backing_blocks_written: u64,
    pub flushes: u64,
    pub trimmed_blocks: u64,
    pub padding_bytes: u64,
    pub relocated_blocks: u64,
    pub discarded_bytes: u64,
    pub summary_blocks: u64,
    /// The counters `ftlblk stats` does not print.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The online classifier's figures (the binary's own: typed in full).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassifierFigures {
    /// Memory per tracked block ([`Classifier::BYTES_PER_BLOCK`]).
    pub bytes_per_block: u64,
    /// Blocks whose history is kept (a larger device shares the slots).
    pub tracked_blocks: u64,
    /// RAM of the per-block state.
    pub ram_bytes: u64,
    /// Stream plans made since the start.
    pub plans: u64,
    /// Streams the current plan does not use.
    pub idle_streams: Vec<u8>,
    /// Whether the history was restored at the start from the one the device's last
    /// server saved (`ftlblk-classifier` in the index directory), rather than begun empty.
    pub history_restored: bool,
}

/// The cleaner thread's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CleanerFigures {
    pub stats: CleanerRunFigures,
    /// The last error the cleaner thread hit (it keeps running).
    pub last_error: Option<String>,
    /// The cleaner's thread has ended (a panic, in a running daemon): nothing cleans,
    /// and the figures above are its last.
    pub stopped: bool,
}

/// [`cleaner::RunnerStats`] as the document carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CleanerRunFigures {
    pub cleaner: CleanerSliceFigures,
    pub foreground_slices: u64,
    pub background_slices: u64,
    /// The writers' pace: nanoseconds between two blocks (0: not throttled).
    pub throttle_ns_per_block: u64,
    pub clean_rate_blocks_per_s: f64,
    pub errors: u64,
    /// Free segments held for writers above the low watermark's floor, and the longest
    /// wait for a free segment of the last second it was judged by (microseconds).
    pub headroom_segments: usize,
    pub longest_space_wait_us: u64,
    /// The fields `ftlblk stats` does not print.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// [`cleaner::CleanerStats`] as the document carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CleanerSliceFigures {
    pub segments_cleaned: u64,
    pub blocks_copied: u64,
    pub slices: u64,
    pub preemptions: u64,
    /// Live blocks that victims' chunk summaries did not name (damage on the backing),
    /// found through the map and moved.
    pub unnamed_live_found: u64,
    /// The fields `ftlblk stats` does not print.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A library value as its mirror: typed where the mirror has a field, the rest in `other`.
fn mirror<T: Serialize, M: DeserializeOwned>(v: &T) -> serde_json::Result<M> {
    serde_json::from_value(serde_json::to_value(v)?)
}

impl ClassifierFigures {
    pub fn of(classifier: &Classifier) -> Self {
        ClassifierFigures {
            bytes_per_block: Classifier::BYTES_PER_BLOCK as u64,
            tracked_blocks: classifier.tracked_blocks(),
            ram_bytes: classifier.ram_bytes(),
            plans: classifier.plans(),
            idle_streams: classifier.idle_streams().iter().map(|s| s.0).collect(),
            history_restored: classifier.restored(),
        }
    }
}

impl StatsDocument {
    /// The figures of a running device, now.
    pub fn collect(
        ftl: &FileFtl,
        cleaner: Option<&CleanerHandle>,
        classifier: &Classifier,
        record: Option<&DeviceRecord>,
    ) -> serde_json::Result<Self> {
        let mut doc = Self::from_parts(
            record,
            &ftl.stats(),
            allocated_bytes(ftl),
            ClassifierFigures::of(classifier),
            cleaner.map(|c| (c.stats(), c.last_error())),
        )?;
        if let (Some(fig), Some(c)) = (doc.cleaner.as_mut(), cleaner) {
            fig.stopped = !c.running();
        }
        // The same windows every time (a fixed seed), so successive figures compare.
        doc.map_fragmentation = ftl
            .fragmentation_sample(SAMPLE_WINDOWS, SAMPLE_WINDOW_BLOCKS, 1)
            .ok()
            .map(|f| MapFragmentation {
                windows: f.windows,
                backing_reads_per_128k: f.reads_per_window(),
                mean_run_blocks: f.mean_run_blocks(),
            });
        Ok(doc)
    }

    /// The document of figures already taken.
    pub fn from_parts(
        record: Option<&DeviceRecord>,
        stats: &Stats,
        backing_allocated_bytes: Option<u64>,
        classifier: ClassifierFigures,
        cleaner: Option<(RunnerStats, Option<String>)>,
    ) -> serde_json::Result<Self> {
        Ok(StatsDocument {
            device: record.cloned(),
            stats: mirror(stats)?,
            backing_allocated_bytes,
            classifier,
            cleaner: match cleaner {
                Some((stats, last_error)) => Some(CleanerFigures {
                    stats: mirror(&stats)?,
                    last_error,
                    stopped: false,
                }),
                None => None,
            },
            map_fragmentation: None,
            latency: None,
            counters_at_open: None,
            waf_last_minute: None,
        })
    }

    /// The text sent on the socket: pretty JSON, keys sorted.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(&serde_json::to_value(self)?)
    }

    /// Parses what a daemon sent.
    pub fn from_json(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

/// Bytes the backing occupies on its file system (`du`), when it is a regular file.
fn allocated_bytes(ftl: &FileFtl) -> Option<u64> {
    let fd = ftl::BlockDevice::raw_fd(ftl.device())?;
    // SAFETY: fstat writes into the zeroed struct it is given; `fd` is the open backing.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
        return None;
    }
    Some(st.st_blocks as u64 * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftl::backing::{format_backing, open_backing};
    use ftl::device::BLOCK_SIZE;
    use ftl::{Config, FormatOptions, StreamId};

    fn small_ftl(dir: &std::path::Path) -> FileFtl {
        let (img, idx) = (dir.join("s.img"), dir.join("s.idx"));
        format_backing(&img, &idx, Some(64 << 20), &FormatOptions::default(), false)
            .expect("format");
        let (f, _) = open_backing(&img, &idx, Config::default()).expect("open");
        for lba in 0..64 {
            f.write(lba, &[7u8; BLOCK_SIZE], false, StreamId(1))
                .expect("write");
        }
        f.flush().expect("flush");
        f
    }

    fn record() -> DeviceRecord {
        DeviceRecord {
            id: 3,
            block_device: "/dev/ublkb3".into(),
            char_device: "/dev/ublkc3".into(),
            backing: "/tmp/s.img".into(),
            index: "/tmp/s.idx".into(),
            size_bytes: 1 << 30,
            block_size: 4096,
            queues: 2,
            depth: 128,
            io_buf_bytes: 512 << 10,
            cleaner: true,
            pid: 42,
            pid_start: 0,
            socket: "/run/ftlblk/3.sock".into(),
            log: None,
            uuid: "u".into(),
            recoveries: 1,
            map_cache_bytes: 0,
            metrics_listen: None,
            discard_delay_ms: None,
        }
    }

    /// The document as the control plane built it before it was typed: `json!` over the
    /// library's own types. The typed document must send the same bytes.
    fn untyped(
        record: Option<&DeviceRecord>,
        stats: &Stats,
        allocated: Option<u64>,
        classifier: &Classifier,
        cleaner: Option<(RunnerStats, Option<String>)>,
    ) -> String {
        let doc = serde_json::json!({
            "device": record,
            "stats": stats,
            "backing_allocated_bytes": allocated,
            "classifier": serde_json::json!({
                "bytes_per_block": Classifier::BYTES_PER_BLOCK,
                "tracked_blocks": classifier.tracked_blocks(),
                "ram_bytes": classifier.ram_bytes(),
                "plans": classifier.plans(),
                "idle_streams": classifier.idle_streams().iter().map(|s| s.0).collect::<Vec<_>>(),
                "history_restored": classifier.restored(),
            }),
            "cleaner": cleaner.map(|(s, e)| serde_json::json!({
                "stats": s,
                "last_error": e,
                "stopped": false,
            })),
        });
        serde_json::to_string_pretty(&doc).expect("json")
    }

    #[test]
    fn sends_the_bytes_the_untyped_document_sent_and_reads_them_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = small_ftl(dir.path());
        let classifier = Classifier::new(f.capacity_blocks());
        let stats = f.stats();
        let mut run = RunnerStats {
            throttle_ns_per_block: 25_000,
            clean_rate_blocks_per_s: 1234.5,
            foreground_slices: 2,
            background_slices: 7,
            errors: 1,
            checkpoints: 3,
            ..Default::default()
        };
        run.cleaner.segments_cleaned = 4;
        run.cleaner.blocks_copied = 96;
        run.cleaner.prefetch_wait_ns = 11;
        let rec = record();
        for (record, allocated, cleaner) in [
            (None, None, None),
            (
                Some(&rec),
                Some(3u64 << 20),
                Some((run, Some("a read failed".to_string()))),
            ),
        ] {
            let want = untyped(record, &stats, allocated, &classifier, cleaner.clone());
            let doc = StatsDocument::from_parts(
                record,
                &stats,
                allocated,
                ClassifierFigures::of(&classifier),
                cleaner,
            )
            .expect("document");
            let text = doc.to_json().expect("json");
            assert_eq!(text, want);
            // The CLI's end reads what the daemon's end wrote, and writes it back alike.
            let back = StatsDocument::from_json(&text).expect("parse");
            assert_eq!(back.to_json().expect("json"), want);
            assert_eq!(back.stats.mapped_blocks, stats.mapped_blocks);
            assert_eq!(back.stats.waf, stats.waf);
            assert_eq!(
                back.stats.counters.user_blocks_written,
                stats.counters.user_blocks_written
            );
            assert_eq!(back.device.as_ref(), record);
        }
    }

    #[test]
    fn typed_fields_are_keys_the_library_writes() {
        // A field renamed in the library would otherwise read as 0 here, silently.
        fn keys(v: Value, at: &str, into: &mut Vec<String>) {
            if let Value::Object(m) = v {
                for (k, v) in m {
                    let path = format!("{at}/{k}");
                    keys(v, &path, into);
                    into.push(path);
                }
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let f = small_ftl(dir.path());
        for (mirror, library) in [
            (
                serde_json::to_value(FtlFigures::default()).unwrap(),
                serde_json::to_value(f.stats()).unwrap(),
            ),
            (
                serde_json::to_value(CleanerRunFigures::default()).unwrap(),
                serde_json::to_value(RunnerStats::default()).unwrap(),
            ),
        ] {
            let (mut typed, mut written) = (Vec::new(), Vec::new());
            keys(mirror, "", &mut typed);
            keys(library, "", &mut written);
            for k in typed {
                assert!(written.contains(&k), "the library no longer writes {k}");
            }
        }
    }

    #[test]
    fn a_sparse_document_reads_as_zeros() {
        let d = StatsDocument::from_json(r#"{"stats": {"waf": 2, "counters": {}}}"#).unwrap();
        assert_eq!(d.stats.waf, 2.0);
        assert_eq!(d.stats.mapped_blocks, 0);
        assert!(d.device.is_none() && d.cleaner.is_none());
    }
}
