//! `ftlblk stats`: asks a device's daemon for its figures over the stats socket
//! (`/run/ftlblk/N.sock`, served by [`crate::control`]) and prints them as a table, or as
//! the daemon sent them (`--json`).
//!
//! Owns [`StatsArgs`], the socket's client end and the table ([`format_stats`]); the
//! document itself is [`crate::stats_doc::StatsDocument`]. Called by [`crate::cli`] only.

use crate::error::CliError;
use crate::output::human_bytes;
use crate::runfiles;
use crate::stats_doc::StatsDocument;
use clap::Args;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long `stats` waits for the daemon's document.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Clone)]
pub struct StatsArgs {
    /// Device number N of /dev/ublkbN.
    #[arg(short = 'n', long = "number")]
    pub id: u32,
    /// Print the daemon's JSON document as is instead of a table.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the figures once in the Prometheus / OpenMetrics text format, as the daemon
    /// serves them on `--metrics-listen`.
    #[arg(long)]
    pub prometheus: bool,
}

/// `ftlblk stats`.
pub fn run(a: StatsArgs) -> Result<(), CliError> {
    let id = a.id;
    let doc = fetch_stats(id)?;
    if a.json {
        return crate::output::print_line(&doc);
    }
    let doc = StatsDocument::from_json(&doc)
        .map_err(|e| CliError::json("the daemon's stats are not a stats document", e))?;
    if a.prometheus {
        let text = crate::metrics::render(&doc).map_err(CliError::Metrics)?;
        return crate::output::print_line(text.trim_end_matches('\n'));
    }
    crate::output::print_line(format_stats(&doc).trim_end_matches('\n'))
}

/// The document device `id`'s daemon sends, as text.
fn fetch_stats(id: u32) -> Result<String, CliError> {
    let sock = runfiles::socket_path(id);
    let s = match UnixStream::connect(&sock) {
        Ok(s) => s,
        Err(e) => {
            return Err(match runfiles::read_record(id) {
                // A record that cannot be read is not a missing one: say why.
                Err(re) => re,
                Ok(Some(r)) if !runfiles::daemon_alive(&r) => CliError::Device(format!(
                    "the daemon of device {id} (pid {}) is not running; if /dev/ublkb{id} still \
                     exists, re-attach it with `ftlblk recover -n {id}`",
                    r.pid
                )),
                Ok(Some(_)) => CliError::io(
                    format!(
                        "cannot reach the daemon of device {id} at {}",
                        sock.display()
                    ),
                    e,
                ),
                Ok(None) => CliError::Device(format!(
                    "ublk device {id} not found (no {}; is it served by ftlblk?)",
                    runfiles::record_path(id).display()
                )),
            });
        }
    };
    checked_document(id, read_document(s, &sock)?)
}

/// What the daemon of device `id` sent, if it is a document: nothing (closed unanswered)
/// and `{"error": ...}` are errors.
fn checked_document(id: u32, doc: String) -> Result<String, CliError> {
    if doc.trim().is_empty() {
        // Closed unanswered: the daemon serves its cap of stats connections at once (it
        // printed an empty line and exited 0).
        return Err(CliError::Device(format!(
            "the daemon of device {id} closed the connection without its stats (too many \
             connections at once?); try again"
        )));
    }
    match daemon_error(&doc) {
        // `stats --json` printed the daemon's error as its document and exited 0.
        Some(why) => Err(CliError::Device(format!(
            "the daemon of device {id} could not build its stats: {why}"
        ))),
        None => Ok(doc),
    }
}

/// The daemon's error, when what it sent is one (`{"error": ...}`) instead of a stats
/// document.
fn daemon_error(doc: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(doc).ok()?;
    let o = v.as_object()?;
    match (o.len(), o.get("error")) {
        (1, Some(e)) => Some(e.as_str().map_or_else(|| e.to_string(), str::to_string)),
        _ => None,
    }
}

/// Reads a connected socket to its end (the daemon closes it after one document).
fn read_document(mut s: UnixStream, sock: &Path) -> Result<String, CliError> {
    let reading = || format!("reading {}", sock.display());
    s.set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|e| CliError::io(reading(), e))?;
    let mut doc = String::new();
    s.read_to_string(&mut doc)
        .map_err(|e| CliError::io(reading(), e))?;
    Ok(doc)
}

/// The human-readable `stats` table.
/// A latency in microseconds, in the unit that reads best.
fn us(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.0} ms", v as f64 / 1000.0)
    } else if v >= 1000 {
        format!("{:.2} ms", v as f64 / 1000.0)
    } else {
        format!("{v} us")
    }
}

pub fn format_stats(d: &StatsDocument) -> String {
    let (s, c) = (&d.stats, &d.stats.counters);
    let bs = s.block_size.max(1);
    let blocks = |b: u64| format!("{} ({b} blocks)", human_bytes(b * bs));
    let exported = s.exported_blocks;
    let mapped = s.mapped_blocks;
    let mut out = String::new();
    let mut row = |k: &str, val: String| out.push_str(&format!("{k:<22} {val}\n"));
    let unknown = || "?".to_string();
    let dev = d.device.as_ref();
    row(
        "device",
        format!(
            "{} (id {}, pid {})",
            dev.map_or_else(unknown, |r| r.block_device.display().to_string()),
            dev.map_or(0, |r| r.id),
            dev.map_or(0, |r| r.pid)
        ),
    );
    row(
        "backing",
        dev.map_or_else(unknown, |r| r.backing.display().to_string()),
    );
    row(
        "capacity",
        format!(
            "{} ({exported} blocks of {bs} B)",
            human_bytes(exported * bs)
        ),
    );
    row("user written", blocks(c.user_blocks_written));
    row("backing written", blocks(c.backing_blocks_written));
    row("WAF", format!("{:.3}", s.waf));
    row(
        "free segments",
        format!(
            "{} of {} ({} dead, waiting for a free record or checkpoint; {} free not yet \
             discarded on the backing)",
            s.free_segments, s.segment_count, s.dead_segments, s.undiscarded_segments
        ),
    );
    row(
        "mapped blocks",
        format!(
            "{mapped} ({:.1}% of capacity)",
            if exported == 0 {
                0.0
            } else {
                mapped as f64 * 100.0 / exported as f64
            }
        ),
    );
    row("flushes", c.flushes.to_string());
    row("trimmed blocks", c.trimmed_blocks.to_string());
    if s.tombstone_carry_failures > 0 {
        row(
            "TRIM carry failures",
            format!(
                "{} (those segments stay allocated until a carry works; last: {})",
                s.tombstone_carry_failures,
                s.tombstone_carry_error.as_deref().unwrap_or("?")
            ),
        );
    }
    row("padding", human_bytes(c.padding_bytes));
    row("relocated blocks", c.relocated_blocks.to_string());
    row(
        "checkpoints",
        format!(
            "{} ({} segments freed right after their log sync)",
            s.checkpoints, s.segments_freed_early_by_checkpoints
        ),
    );
    row(
        "freed between checkpoints",
        format!(
            "{} segments by {} free records ({} while a checkpoint ran)",
            s.segments_freed_by_records, s.free_records, s.free_records_beside_checkpoints
        ),
    );
    row("epoch (opens)", s.epoch.to_string());
    let w = &s.wear;
    row(
        "segment reuse (wear)",
        format!(
            "min {} / mean {:.1} / max {} (max/mean {:.2}, spread {})",
            w.min, w.mean, w.max, w.max_over_mean, w.spread
        ),
    );
    if let Some(m) = &d.map_fragmentation {
        row(
            "fragmentation",
            format!(
                "{:.2} backing reads per 128 KiB read, mean contiguous run {:.1} blocks \
                 ({} windows sampled)",
                m.backing_reads_per_128k, m.mean_run_blocks, m.windows
            ),
        );
    }
    let fr = &s.fragmentation;
    row(
        "large reads",
        if fr.large_reads == 0 {
            "none yet".to_string()
        } else {
            format!(
                "{}, mean run {:.1} blocks (recent {:.1}: {} fragmentation)",
                fr.large_reads, fr.mean_run_blocks, fr.recent_mean_run_blocks, fr.level
            )
        },
    );
    row(
        "defragmentation",
        format!(
            "{} windows rewritten ({} blocks moved), {} waiting, {} dropped",
            fr.defrag_windows, fr.defrag_moved_blocks, fr.defrag_waiting, fr.defrag_dropped
        ),
    );
    if let Some(l) = &d.latency {
        for op in crate::metrics::Op::ALL {
            let x = l.of(op);
            if x.count > 0 {
                row(
                    &format!("{} latency", op.name()),
                    format!(
                        "p50 {} / p99 {} / p99.9 {} / max {} ({} requests)",
                        us(x.p50_us),
                        us(x.p99_us),
                        us(x.p999_us),
                        us(x.max_us),
                        x.count
                    ),
                );
            }
        }
    }
    if let Some(w) = d.waf_last_minute {
        row("WAF, last minute", format!("{w:.3}"));
    }
    let m = &s.map_cache;
    let lookups = (m.hits + m.misses).max(1);
    row(
        "map cache",
        format!(
            "{} of {} cached (bound {}), {} dirty, {:.1}% hits, {} evictions",
            human_bytes(s.map_ram_bytes),
            human_bytes(m.map_bytes),
            human_bytes(m.capacity_bytes),
            m.dirty_pages,
            m.hits as f64 * 100.0 / lookups as f64,
            m.evictions
        ),
    );
    let k = &d.classifier;
    row(
        "classifier RAM",
        format!(
            "{} ({} blocks tracked; history {})",
            human_bytes(k.ram_bytes),
            k.tracked_blocks,
            if k.history_restored {
                "restored at the start"
            } else {
                "begun at the start"
            }
        ),
    );
    row("index on disk", human_bytes(s.index_bytes_on_disk));
    row("discarded (TRIM out)", human_bytes(c.discarded_bytes));
    if let Some(a) = d.backing_allocated_bytes {
        row("backing allocated", human_bytes(a));
    }
    if let Some(cl) = &d.cleaner {
        let r = &cl.stats;
        if cl.stopped {
            row(
                "cleaner",
                "STOPPED: its thread ended (see the daemon's log); nothing cleans, and the \
                 figures below are its last"
                    .to_string(),
            );
        }
        row(
            "cleaner",
            format!(
                "{} segments emptied, {} blocks copied, {} errors",
                r.cleaner.segments_cleaned, r.cleaner.blocks_copied, r.errors
            ),
        );
        if r.cleaner.unnamed_live_found > 0 {
            row(
                "damaged summaries",
                format!(
                    "{} live blocks of cleaned segments were not named by their chunk \
                     summaries (damage on the backing); found through the map, checked \
                     against their checksums and moved",
                    r.cleaner.unnamed_live_found
                ),
            );
        }
        row(
            "cleaning slices",
            format!(
                "{} run ({} foreground, {} background), {} preempted",
                r.cleaner.slices, r.foreground_slices, r.background_slices, r.cleaner.preemptions
            ),
        );
        let throttle = r.throttle_ns_per_block;
        row(
            "write throttle",
            if throttle == 0 {
                "off".to_string()
            } else {
                format!(
                    "writers paced at {:.0} blocks/s (cleaner's rate {:.0} blocks/s)",
                    1e9 / throttle as f64,
                    r.clean_rate_blocks_per_s
                )
            },
        );
        row(
            "space headroom",
            format!(
                "{} segments held for writers above the floor (longest wait for space {:.1} ms)",
                r.headroom_segments,
                r.longest_space_wait_us as f64 / 1e3
            ),
        );
    } else {
        row("cleaner", "off".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(v: &serde_json::Value) -> StatsDocument {
        StatsDocument::from_json(&v.to_string()).expect("a stats document")
    }

    #[test]
    fn stats_table_has_the_figures() {
        let v = serde_json::json!({
            "device": {"id": 0, "block_device": "/dev/ublkb0", "pid": 42, "backing": "/tmp/t.img",
                       "char_device": "/dev/ublkc0", "index": "/tmp/t.img.ftlidx",
                       "size_bytes": 4096000, "block_size": 4096, "queues": 1, "depth": 128,
                       "io_buf_bytes": 524288, "cleaner": false, "socket": "/run/ftlblk/0.sock",
                       "log": null, "uuid": "u", "recoveries": 0},
            "stats": {
                "block_size": 4096, "exported_blocks": 1000, "mapped_blocks": 250,
                "free_segments": 10, "segment_count": 64, "dead_segments": 1,
                "waf": 1.25, "checkpoints": 3, "epoch": 2,
                "counters": {"user_blocks_written": 800, "backing_blocks_written": 1000,
                             "flushes": 7, "trimmed_blocks": 5, "padding_bytes": 0,
                             "relocated_blocks": 0}
            },
            "cleaner": null
        });
        let mut frag = v.clone();
        frag["stats"]["fragmentation"] = serde_json::json!({
            "level": "high", "large_reads": 100, "mean_run_blocks": 2.4,
            "recent_mean_run_blocks": 2.5, "defrag_waiting": 3, "defrag_dropped": 1,
            "defrag_windows": 90, "defrag_moved_blocks": 2880});
        frag["map_fragmentation"] = serde_json::json!({
            "windows": 256, "backing_reads_per_128k": 13.2, "mean_run_blocks": 2.4});
        let t3 = format_stats(&doc(&frag));
        for want in [
            "fragmentation          13.20 backing reads per 128 KiB read, mean contiguous run 2.4 \
             blocks (256 windows sampled)",
            "large reads            100, mean run 2.4 blocks (recent 2.5: high fragmentation)",
            "defragmentation        90 windows rewritten (2880 blocks moved), 3 waiting, 1 dropped",
        ] {
            assert!(t3.contains(want), "missing {want:?} in\n{t3}");
        }
        let mut with_cleaner = v.clone();
        with_cleaner["cleaner"] = serde_json::json!({"stats": {
            "cleaner": {"segments_cleaned": 4, "blocks_copied": 96, "slices": 9, "preemptions": 3},
            "foreground_slices": 2, "background_slices": 7, "throttle_ns_per_block": 25000,
            "clean_rate_blocks_per_s": 30000.0, "errors": 0, "headroom_segments": 3,
            "longest_space_wait_us": 4500}});
        with_cleaner["backing_allocated_bytes"] = serde_json::json!(3u64 << 20);
        let t2 = format_stats(&doc(&with_cleaner));
        for want in [
            "4 segments emptied, 96 blocks copied",
            "9 run (2 foreground, 7 background), 3 preempted",
            "writers paced at 40000 blocks/s (cleaner's rate 30000 blocks/s)",
            "space headroom         3 segments held for writers above the floor (longest wait \
             for space 4.5 ms)",
            "backing allocated      3.0 MiB",
        ] {
            assert!(t2.contains(want), "missing {want:?} in\n{t2}");
        }
        assert!(!t2.contains("damaged summaries"), "{t2}");
        with_cleaner["cleaner"]["stats"]["cleaner"]["unnamed_live_found"] = serde_json::json!(3);
        let t4 = format_stats(&doc(&with_cleaner));
        assert!(
            t4.contains("damaged summaries      3 live blocks of cleaned segments were not named"),
            "{t4}"
        );
        let t = format_stats(&doc(&v));
        for want in [
            "/dev/ublkb0",
            "WAF                    1.250",
            "free segments          10 of 64",
            "mapped blocks          250 (25.0% of capacity)",
            "flushes                7",
            "trimmed blocks         5",
            "cleaner                off",
            "large reads            none yet",
        ] {
            assert!(t.contains(want), "missing {want:?} in\n{t}");
        }
    }

    /// A daemon that could not build its document sends `{"error": ...}`: an error for
    /// the command (it printed as the document, exit 0), not a document.
    #[test]
    fn the_daemons_error_is_an_error() {
        assert_eq!(
            daemon_error(r#"{"error":"index read failed"}"#).as_deref(),
            Some("index read failed")
        );
        assert_eq!(
            daemon_error(&StatsDocument::default().to_json().unwrap()),
            None
        );
        assert_eq!(daemon_error("not json"), None);
        let e = checked_document(3, String::new()).unwrap_err().to_string();
        assert!(e.contains("without its stats"), "{e}");
        let e = checked_document(3, r#"{"error":"x"}"#.into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("could not build its stats: x"), "{e}");
        let doc = StatsDocument::default().to_json().unwrap();
        assert_eq!(checked_document(3, doc.clone()).unwrap(), doc);
    }

    #[test]
    fn a_document_from_the_socket_prints() {
        // The socket's two ends without a device: a listener sends a document the way the
        // control plane does, the client reads it to its end and prints the table.
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("0.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let mut sent = StatsDocument::default();
        sent.stats.exported_blocks = 1000;
        sent.stats.mapped_blocks = 500;
        let text = sent.to_json().expect("json");
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            std::io::Write::write_all(&mut s, text.as_bytes()).expect("send");
        });
        let got = read_document(UnixStream::connect(&sock).expect("connect"), &sock).unwrap();
        server.join().expect("server");
        let t = format_stats(&StatsDocument::from_json(&got).expect("parse"));
        assert!(
            t.contains("mapped blocks          500 (50.0% of capacity)"),
            "{t}"
        );
        assert!(t.contains("device                 ? (id 0, pid 0)"), "{t}");
    }
}
