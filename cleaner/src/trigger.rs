//! When to clean and how hard to hold writers back: pure functions.

use std::time::Duration;

/// Background cleaning interval (High-Frequency BSC): `Ci = MinCi * Free / MinFree` while
/// `Free > MinFree`, else `MinCi`.
pub fn background_interval(free: usize, min_free: usize, min_interval: Duration) -> Duration {
    if free > min_free && min_free > 0 {
        min_interval.mul_f64(free as f64 / min_free as f64)
    } else {
        min_interval
    }
}

/// Foreground cleaning runs while free segments are at or below the low watermark.
pub fn foreground_needed(free: usize, low_watermark: usize) -> bool {
    free <= low_watermark
}

/// The writers' pace (interval between two blocks, all writers together) from the
/// cleaner's measured net rate (`clean_rate`: free blocks it produces per second of
/// cleaning, copies subtracted) and the free space (`avail` segments, dead ones
/// included): none at or above `start`; below it writers may go at `clean_rate` times a
/// factor that falls linearly from 1.5 at `start` to 0.5 at the `reserve`, so free space
/// settles where the factor is 1, between the two, and writers are spread evenly at the
/// rate the cleaner sustains instead of stalling when space runs out. Never slower than
/// one block per `max_pace`. With no measurement yet (`clean_rate` 0), falls back to
/// [`throttle_delay`] spread over `writers`.
pub fn write_pace(
    avail: usize,
    reserve: usize,
    start: usize,
    clean_rate: f64,
    max_pace: Duration,
    writers: u32,
) -> Duration {
    if avail >= start || start <= reserve {
        return Duration::ZERO;
    }
    if clean_rate <= 0.0 {
        return throttle_delay(avail, reserve, start, max_pace) / writers.max(1);
    }
    let span = (start - reserve) as f64;
    let factor = 0.5 + (avail.max(reserve) - reserve) as f64 / span;
    let pace = Duration::from_secs_f64(1.0 / (clean_rate * factor));
    pace.min(max_pace)
}

/// The space the writers' pace ([`write_pace`]) sees: free segments plus the dead ones a
/// free record returns at once (`freeable`); with `freeable_only` false, every dead
/// segment. Dead segments closed since the last checkpoint come back only with the next
/// one (about 40 ms); under zipf:0.99, where hot segments die young, they were a third of
/// what the pace counted on, free space ran out behind it, and writers waited for the
/// checkpoint instead of being slowed ahead of it.
pub fn pace_space(free: usize, dead: usize, freeable: usize, freeable_only: bool) -> usize {
    if freeable_only {
        free + freeable.min(dead)
    } else {
        free + dead
    }
}

/// Proportional write throttle (as pblk and SPDK do): no delay while free segments are
/// above `start`; then a delay growing linearly as free space falls towards the
/// `reserve`, reaching `max_delay` at it. Writers slow down smoothly; they never stop.
pub fn throttle_delay(free: usize, reserve: usize, start: usize, max_delay: Duration) -> Duration {
    if free >= start || start <= reserve {
        return Duration::ZERO;
    }
    let span = (start - reserve) as f64;
    let short = (start - free.max(reserve)) as f64;
    max_delay.mul_f64(short / span)
}

/// What the cleaning thread knows when it decides whether to checkpoint now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInputs {
    /// Free segments.
    pub free: usize,
    /// Closed segments without live blocks (free once a checkpoint is durable).
    pub dead: usize,
    /// Of `dead`, those a free record may free now (`Ftl::freeable_segments`: closed
    /// before the last checkpoint).
    pub freeable: usize,
    /// Of `freeable`, those whose blocks were all killed by entries in chunks already
    /// sealed (`Ftl::freeable_and_settled`): a free record frees them without sealing a
    /// chunk early.
    pub settled: usize,
    /// How long some freeable segment has been waiting for its killers' chunks to seal
    /// (zero when every freeable one is settled).
    pub unsettled_for: Duration,
    /// Free segments at or below which any dead segment is worth a checkpoint at once.
    pub urgent: usize,
    /// Dead segments worth a checkpoint whatever the free space.
    pub batch: usize,
    /// The FTL's own rule (blocks appended since the last checkpoint) says one is due.
    pub due: bool,
    /// How long no foreground request arrived.
    pub idle_for: Duration,
    /// How long since this thread's last checkpoint.
    pub since_last: Duration,
}

/// Whether to checkpoint now: when the FTL says one is due; when a batch of dead
/// segments waits (a checkpoint costs a device sync, an index commit and a padded chunk
/// per open stream, so freeing one segment at a time cost the cleaner more than it
/// cleaned: 5 ms per 1 MiB segment); when any dead segment waits and free space is down
/// to `urgent`; and when dead segments wait on an idle device, `idle` after the last
/// request and at most once per `idle`, so space a TRIM or `fstrim` freed goes back to
/// the backing (discarded) within seconds instead of when space runs short.
pub fn checkpoint_needed(i: CheckpointInputs, idle: Duration) -> bool {
    i.due
        || (i.dead > 0 && i.dead >= i.batch)
        || (i.dead > 0 && i.free <= i.urgent)
        || (i.dead > 0 && i.idle_for >= idle && i.since_last >= idle)
}

/// The free-segment level at or below which dead segments a free record may not free are
/// worth a checkpoint at once: the reserve, plus the segments writers and relocation
/// append while one checkpoint runs (`checkpoint` its recent duration,
/// `appended_blocks_per_s` the log's recent append rate, users' and relocations'
/// blocks), plus one; never below `reserve + 2`, never above `reserve + cap`. A
/// checkpoint started at a fixed `reserve + 2` finished, under zipf:0.99 at 90K IOPS
/// (155 segments/s appended, 40 ms checkpoints: 6 segments), after free space had run
/// out, and writers waited for it (`Space::wait`).
pub fn checkpoint_urgent(
    reserve: usize,
    checkpoint: Duration,
    appended_blocks_per_s: f64,
    blocks_per_segment: f64,
    cap: usize,
) -> usize {
    let during = if blocks_per_segment > 0.0 && appended_blocks_per_s.is_finite() {
        (checkpoint.as_secs_f64() * appended_blocks_per_s.max(0.0) / blocks_per_segment).ceil()
    } else {
        0.0
    };
    let lead = (during.min(cap as f64) as usize + 1).clamp(2, cap.max(2));
    reserve + lead
}

/// How the cleaning thread returns dead segments (or persists the map) now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// A full checkpoint (map pages, segment table; frees every dead segment).
    Checkpoint,
    /// Free records for the freeable dead segments (`Ftl::free_dead_with`): one log sync
    /// and a small index commit, no map pages. With `seal`, every freeable one, the open
    /// chunks that killed their blocks sealed first (`FreeMode::Seal`); without, only the
    /// settled ones (`FreeMode::Settled`).
    FreeDead { seal: bool },
}

/// What to run now, if anything: a checkpoint when the FTL says one is due (the map's
/// share of recovery time), or when [`checkpoint_needed`]'s rules call for one for the
/// dead segments closed since the last checkpoint, which no free record may free (a
/// batch of them, free space short, an idle device; it frees the freeable ones too);
/// otherwise free records as soon as any dead segment is freeable (they cost a log sync
/// and a few bytes of index, about a third of a checkpoint under load, and seal only the
/// chunks that killed the segments, so no batch is gathered first: a segment waiting for
/// a batch is spare space writers do not have). Freeable segments never hold the others
/// back: on zipf:0.99, where hot segments die on their own soon after they close, free
/// records first (checkpoints only when due) raised the WAF from 2.34 to 2.47.
///
/// A free record frees the settled segments first, without sealing anything; it seals
/// the open chunks that killed the others (a partly filled chunk written on the reclaim
/// thread, about a third of a free record's time) only when free space is down to
/// `urgent` or one has waited [`SETTLE_WAIT`] for its killers' chunks to fill.
pub fn reclaim_now(i: CheckpointInputs, idle: Duration) -> Option<Reclaim> {
    reclaim_next(i, idle, false, false)
}

/// [`reclaim_now`], given what already runs: a checkpoint (`checkpointing`) and a free
/// record (`freeing`) each on a thread of their own, at most one of each. A checkpoint
/// lets free records run while it syncs and commits its map pages (ftl's checkpoint rule
/// 8; `freeable` then counts only the segments they may free), so while one runs, the
/// free records go on; a due checkpoint starts while a free record runs (it takes its
/// snapshot when the record is done), the others wait for it. Under uniform overwrites of a full 2 GiB
/// device, 90% of the writers' waits for free space fell inside checkpoints (44 ms each)
/// when one ran at a time.
pub fn reclaim_next(
    i: CheckpointInputs,
    idle: Duration,
    checkpointing: bool,
    freeing: bool,
) -> Option<Reclaim> {
    let waiting = CheckpointInputs {
        dead: i.dead.saturating_sub(i.freeable),
        ..i
    };
    let settled = i.settled.min(i.freeable);
    // The running record's segments are dead and no longer freeable until it is done:
    // counted as waiting for a checkpoint they started one after every record (500 a
    // uniform run against 38). Beside a record, only a due checkpoint starts.
    let checkpoint = if freeing {
        i.due
    } else {
        checkpoint_needed(waiting, idle)
    };
    if checkpoint && !checkpointing {
        Some(Reclaim::Checkpoint)
    } else if freeing {
        None
    } else if i.freeable > settled && (i.free <= i.urgent || i.unsettled_for >= SETTLE_WAIT) {
        Some(Reclaim::FreeDead { seal: true })
    } else if settled > 0 {
        Some(Reclaim::FreeDead { seal: false })
    } else {
        None
    }
}

/// How long a freeable dead segment waits for the open chunks that killed its blocks to
/// fill and seal before a free record seals them early. Under load chunks fill within
/// milliseconds (a GC chunk within the next victim's relocation); a stream that
/// writes rarely, or an idle device, would hold the segment back for good.
pub const SETTLE_WAIT: Duration = Duration::from_millis(20);

/// Dead segments freed together by one checkpoint on a device of `segments` segments:
/// a sixty-fourth of them, at least one (the FTL's own `checkpoint_due` uses the same).
pub fn dead_batch(segments: usize) -> usize {
    (segments / 64).max(1)
}

/// The free space the runner holds for writers above its floor (in segments), adapted to
/// what they need. Every free segment held back is spare the cleaner does not have, so
/// its victims are fuller: on a full 2 GiB device under uniform overwrites, holding 4
/// fewer segments took the WAF from 2.888 to 2.835-2.840 (2 A/B pairs). But a workload
/// whose space comes back in bursts (zipf:0.99, hot segments dying between checkpoints)
/// needs the room: with the same 4 fewer, its writers waited for free segments three times
/// as long (8 -> 25 s a run) and its write p99.9 doubled.
///
/// So the headroom starts at its most and is judged once per [`Headroom::WINDOW`] by the
/// longest wait of a writer for a free segment in it: one longer than
/// [`Headroom::RAISE_ABOVE`] raises it by [`Headroom::RAISE`]; when every wait was shorter
/// than [`Headroom::LOWER_BELOW`] it falls by one. Uniform overwrites then hold 0-3
/// segments, zipf:0.99 4-6. A wait is a writer's whole stall, from the first time it
/// found no free segment until it had one (woken by every segment freed, it may have
/// waited several times). A window with fewer than [`Headroom::MIN_OPS`] foreground
/// requests does not lower it (an idle device keeps what it learnt), but a long wait
/// raises it whatever the count: writers starved of space send few requests (found by
/// review). Counting how many writers
/// waited instead (raise above 1 in 2000 requests) did not tell the two apart: uniform
/// overwrites stayed at 4-6 too, their waits come in groups of a few milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    level: usize,
    max: usize,
    /// Start of the window: when, and the requests counted then.
    since: std::time::Instant,
    ops: u64,
    /// The longest wait in this window, and in the last one judged.
    longest: Duration,
    last_longest: Duration,
}

impl Headroom {
    /// How often the level is judged.
    pub const WINDOW: Duration = Duration::from_secs(1);
    /// A wait for a free segment longer than this raises the level...
    pub const RAISE_ABOVE: Duration = Duration::from_millis(8);
    /// ... and a window whose waits were all shorter than this lowers it.
    pub const LOWER_BELOW: Duration = Duration::from_millis(4);
    /// Segments added after a long wait.
    pub const RAISE: usize = 2;
    /// Foreground requests a window needs to lower the level.
    pub const MIN_OPS: u64 = 1000;

    /// Starts at `max` (no adaptation when `max` is 0), counting requests from the
    /// cumulative `ops` at `now`.
    pub fn new(max: usize, ops: u64, now: std::time::Instant) -> Self {
        Headroom {
            level: max,
            max,
            since: now,
            ops,
            longest: Duration::ZERO,
            last_longest: Duration::ZERO,
        }
    }

    /// The current headroom, in segments.
    pub fn level(&self) -> usize {
        self.level
    }

    /// The longest wait of the last window judged.
    pub fn last_longest(&self) -> Duration {
        self.last_longest
    }

    /// Takes the longest wait for a free segment since the last call and the cumulative
    /// count of foreground requests; returns the headroom.
    pub fn update(&mut self, longest: Duration, ops: u64, now: std::time::Instant) -> usize {
        self.longest = self.longest.max(longest);
        if now.saturating_duration_since(self.since) < Self::WINDOW {
            return self.level;
        }
        if self.longest > Self::RAISE_ABOVE {
            self.level = (self.level + Self::RAISE).min(self.max);
        } else if self.longest < Self::LOWER_BELOW && ops.saturating_sub(self.ops) >= Self::MIN_OPS
        {
            self.level = self.level.saturating_sub(1);
        }
        *self = Headroom {
            since: now,
            ops,
            longest: Duration::ZERO,
            last_longest: self.longest,
            ..*self
        };
        self.level
    }
}

/// Windows of read-driven defragmentation rewritten per turn of the runner (at most 4
/// MiB of relocations between two looks at free space and foreground work).
pub const DEFRAG_WINDOWS_PER_TURN: usize = 32;

/// While users' requests keep coming, one turn of defragmentation at most this often
/// (at most [`DEFRAG_WINDOWS_PER_TURN`] windows, 4 MiB, per 50 ms: a few percent of a
/// disk), so the reads that queued the windows are not slowed by their repair; when the
/// device is idle, turns run back to back.
pub const DEFRAG_BUSY_INTERVAL: Duration = Duration::from_millis(50);

/// While large reads keep coming (a sequential scan, the reads that queue most windows),
/// one turn at most this often: repairing the range as it is read took about 5% of the
/// scan's speed even at one turn per [`DEFRAG_BUSY_INTERVAL`] (1 GiB read at 643 against
/// 672 MB/s, six alternated pairs of `ftlblk bench --tests fragread`, 2026-11-29), and a
/// range scanned once gains nothing from being repaired before the scan ends. Not never:
/// on a device that scans without end, the windows still get their turn now and then.
pub const DEFRAG_SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// No large read for this long: the scan has ended (or paused), and the paced turns of
/// [`DEFRAG_BUSY_INTERVAL`] apply again.
pub const SCAN_GAP: Duration = Duration::from_millis(200);

/// What [`defrag_now`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct DefragInputs {
    /// Windows queued for rewriting.
    pub waiting: usize,
    /// Free plus dead segments.
    pub avail: usize,
    /// Where writers start being throttled.
    pub throttle_start: usize,
    /// No foreground request for the runner's idle gap.
    pub idle: bool,
    pub since_last_turn: Duration,
    /// Since the last large read (`ftl::Ftl::large_reads` moved).
    pub since_large_read: Duration,
}

/// Whether the runner rewrites queued read windows now (`ftl::Ftl::defrag_step`): some
/// wait and free space (free plus dead segments) is above the point where writers are
/// throttled, so defragmentation never costs a writer a throttle or the cleaner its
/// room; foreground cleaning comes first. When the device is idle, back to back; while
/// large reads keep coming, once per [`DEFRAG_SCAN_INTERVAL`]; while other requests keep
/// coming, once per [`DEFRAG_BUSY_INTERVAL`].
pub fn defrag_now(i: &DefragInputs) -> bool {
    let every = if i.since_large_read < SCAN_GAP {
        DEFRAG_SCAN_INTERVAL
    } else {
        DEFRAG_BUSY_INTERVAL
    };
    i.waiting > 0 && i.avail > i.throttle_start && (i.idle || i.since_last_turn >= every)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn headroom_falls_while_writers_wait_briefly_and_rises_after_a_long_wait() {
        let t0 = Instant::now();
        let w = Headroom::WINDOW;
        let short = Headroom::LOWER_BELOW / 2;
        let long = Headroom::RAISE_ABOVE + Duration::from_millis(1);
        let busy = Headroom::MIN_OPS;
        let mut h = Headroom::new(6, 0, t0);
        assert_eq!(h.level(), 6, "starts at its most");
        assert_eq!(h.update(short, busy, t0 + w / 2), 6, "judged once a window");
        assert_eq!(
            h.update(Duration::ZERO, busy, t0 + w),
            5,
            "short waits: one less"
        );
        assert_eq!(h.last_longest(), short, "the window's longest wait");
        assert_eq!(h.update(Duration::ZERO, 2 * busy, t0 + 2 * w), 4);
        // A long wait anywhere in the window counts at its end.
        assert_eq!(h.update(long, 2 * busy + 1, t0 + 2 * w + w / 3), 4);
        assert_eq!(h.update(short, 3 * busy, t0 + 3 * w), 4 + Headroom::RAISE);
        assert_eq!(
            h.update(long, 4 * busy, t0 + 4 * w),
            6,
            "never above its most"
        );
        // Between the two bounds it holds.
        let mid = (Headroom::LOWER_BELOW + Headroom::RAISE_ABOVE) / 2;
        assert_eq!(h.update(mid, 5 * busy, t0 + 5 * w), 6);
        for i in 6..20 {
            h.update(Duration::ZERO, i * busy, t0 + i as u32 * w);
        }
        assert_eq!(h.level(), 0, "never below the floor");
    }

    #[test]
    fn headroom_falls_only_under_load_but_rises_after_any_long_wait() {
        let t0 = Instant::now();
        let w = Headroom::WINDOW;
        let mut h = Headroom::new(6, 100, t0);
        let few = 100 + Headroom::MIN_OPS - 1;
        assert_eq!(h.update(Duration::ZERO, few, t0 + w), 6, "too few requests");
        let long = Headroom::RAISE_ABOVE * 2;
        for i in 2..6 {
            h.update(
                Duration::ZERO,
                few + i * Headroom::MIN_OPS,
                t0 + i as u32 * w,
            );
        }
        assert_eq!(h.level(), 2);
        // Starved writers send few requests: a long wait still raises it.
        let few = few + 6 * Headroom::MIN_OPS;
        assert_eq!(h.update(long, few, t0 + 6 * w), 2 + Headroom::RAISE);
        let mut fixed = Headroom::new(0, 0, t0);
        assert_eq!(fixed.update(long, Headroom::MIN_OPS, t0 + w), 0);
    }

    /// Room, work and a device idle since long ago.
    fn defrag_inputs() -> DefragInputs {
        DefragInputs {
            waiting: 3,
            avail: 20,
            throttle_start: 10,
            idle: true,
            since_last_turn: Duration::ZERO,
            since_large_read: Duration::from_secs(60),
        }
    }

    #[test]
    fn defragmentation_waits_for_room_and_work() {
        let i = defrag_inputs();
        assert!(defrag_now(&i));
        assert!(
            !defrag_now(&DefragInputs { waiting: 0, ..i }),
            "nothing queued"
        );
        assert!(
            !defrag_now(&DefragInputs { avail: 10, ..i }),
            "writers would be throttled"
        );
        assert!(!defrag_now(&DefragInputs { avail: 4, ..i }));
    }

    #[test]
    fn defragmentation_yields_to_foreground_io() {
        let i = DefragInputs {
            since_last_turn: DEFRAG_BUSY_INTERVAL / 2,
            ..defrag_inputs()
        };
        assert!(defrag_now(&i), "idle: back to back");
        let busy = DefragInputs { idle: false, ..i };
        assert!(!defrag_now(&busy), "busy: paced");
        assert!(defrag_now(&DefragInputs {
            since_last_turn: DEFRAG_BUSY_INTERVAL,
            ..busy
        }));
    }

    #[test]
    fn defragmentation_waits_for_a_scan_to_end() {
        let scanning = DefragInputs {
            idle: false,
            since_last_turn: DEFRAG_BUSY_INTERVAL,
            since_large_read: SCAN_GAP / 2,
            ..defrag_inputs()
        };
        assert!(!defrag_now(&scanning), "a turn per 50 ms during a scan");
        assert!(
            defrag_now(&DefragInputs {
                since_last_turn: DEFRAG_SCAN_INTERVAL,
                ..scanning
            }),
            "an endless scan still gets a turn now and then"
        );
        assert!(
            defrag_now(&DefragInputs {
                since_large_read: SCAN_GAP,
                ..scanning
            }),
            "the scan ended: paced turns again"
        );
        assert!(
            defrag_now(&DefragInputs {
                idle: true,
                since_last_turn: Duration::ZERO,
                ..scanning
            }),
            "idle: back to back"
        );
    }

    /// A busy device with plenty of space: 3 dead segments, one of them freeable and
    /// settled, no checkpoint due.
    fn busy() -> CheckpointInputs {
        CheckpointInputs {
            free: 50,
            dead: 3,
            freeable: 1,
            settled: 1,
            unsettled_for: Duration::ZERO,
            urgent: 10,
            batch: 8,
            due: false,
            idle_for: Duration::from_millis(10),
            since_last: Duration::from_secs(30),
        }
    }

    #[test]
    fn dead_segments_are_checkpointed_when_space_is_short_or_the_device_idle() {
        let s = Duration::from_secs(1);
        let busy = CheckpointInputs {
            freeable: 0,
            settled: 0,
            ..busy()
        };
        assert!(!checkpoint_needed(busy, s), "plenty of space, busy device");
        assert!(checkpoint_needed(CheckpointInputs { free: 10, ..busy }, s));
        assert!(checkpoint_needed(CheckpointInputs { dead: 8, ..busy }, s));
        assert!(!checkpoint_needed(
            CheckpointInputs {
                dead: 0,
                batch: 0,
                ..busy
            },
            s
        ));
        assert!(checkpoint_needed(
            CheckpointInputs {
                due: true,
                dead: 0,
                ..busy
            },
            s
        ));
        let idle = CheckpointInputs {
            idle_for: Duration::from_secs(2),
            ..busy
        };
        assert!(checkpoint_needed(idle, s), "idle with dead segments");
        assert!(!checkpoint_needed(CheckpointInputs { dead: 0, ..idle }, s));
        assert!(
            !checkpoint_needed(
                CheckpointInputs {
                    since_last: Duration::from_millis(200),
                    ..idle
                },
                s
            ),
            "at most one idle checkpoint per interval"
        );
    }

    #[test]
    fn freeable_segments_are_freed_at_once_and_the_rest_wait_for_a_checkpoint() {
        let s = Duration::from_secs(1);
        let busy = busy();
        assert_eq!(
            reclaim_now(busy, s),
            Some(Reclaim::FreeDead { seal: false })
        );
        // A batch of segments only a checkpoint frees: a checkpoint, freeable or not.
        let batch = CheckpointInputs { dead: 10, ..busy };
        assert_eq!(reclaim_now(batch, s), Some(Reclaim::Checkpoint));
        let all_freeable = CheckpointInputs {
            dead: 10,
            freeable: 10,
            ..busy
        };
        assert_eq!(
            reclaim_now(all_freeable, s),
            Some(Reclaim::FreeDead { seal: false })
        );
        // Short of space with one segment only a checkpoint frees: a checkpoint.
        let short = CheckpointInputs { free: 10, ..busy };
        assert_eq!(reclaim_now(short, s), Some(Reclaim::Checkpoint));
        let short_all_freeable = CheckpointInputs {
            free: 10,
            dead: 1,
            ..busy
        };
        assert_eq!(
            reclaim_now(short_all_freeable, s),
            Some(Reclaim::FreeDead { seal: false })
        );
        // A due checkpoint wins (it frees them too).
        let due = CheckpointInputs { due: true, ..busy };
        assert_eq!(reclaim_now(due, s), Some(Reclaim::Checkpoint));
        // None freeable: the checkpoint rules decide.
        let none = CheckpointInputs {
            freeable: 0,
            ..busy
        };
        assert_eq!(reclaim_now(none, s), None);
        let short = CheckpointInputs { free: 10, ..none };
        assert_eq!(reclaim_now(short, s), Some(Reclaim::Checkpoint));
        let idle = CheckpointInputs {
            idle_for: Duration::from_secs(2),
            ..none
        };
        assert_eq!(reclaim_now(idle, s), Some(Reclaim::Checkpoint));
        let nothing = CheckpointInputs { dead: 0, ..none };
        assert_eq!(reclaim_now(nothing, s), None);
    }

    #[test]
    fn free_records_go_on_while_a_checkpoint_runs_and_one_of_each_runs_at_most() {
        let s = Duration::from_secs(1);
        let due = CheckpointInputs {
            due: true,
            ..busy()
        };
        let free = Some(Reclaim::FreeDead { seal: false });
        assert_eq!(
            reclaim_next(due, s, false, false),
            Some(Reclaim::Checkpoint)
        );
        assert_eq!(
            reclaim_next(due, s, true, false),
            free,
            "beside the checkpoint"
        );
        assert_eq!(
            reclaim_next(due, s, false, true),
            Some(Reclaim::Checkpoint),
            "beside the free record"
        );
        assert_eq!(reclaim_next(due, s, true, true), None);
        let not_due = CheckpointInputs { due: false, ..due };
        assert_eq!(reclaim_next(not_due, s, false, false), free);
        assert_eq!(reclaim_next(not_due, s, true, false), free);
        assert_eq!(
            reclaim_next(not_due, s, false, true),
            None,
            "one record at a time"
        );
        // Short of space, with segments only a checkpoint frees: beside a record (whose
        // own segments look like those), not until it is done.
        let short = CheckpointInputs {
            free: 5,
            dead: 4,
            ..not_due
        };
        assert_eq!(
            reclaim_next(short, s, false, false),
            Some(Reclaim::Checkpoint)
        );
        assert_eq!(reclaim_next(short, s, false, true), None);
        // Segments only the running checkpoint frees (dead at its snapshot): none more.
        let theirs = CheckpointInputs {
            dead: 12,
            freeable: 0,
            settled: 0,
            ..not_due
        };
        assert_eq!(reclaim_next(theirs, s, true, false), None);
        assert_eq!(
            reclaim_next(theirs, s, false, false),
            Some(Reclaim::Checkpoint)
        );
    }

    #[test]
    fn a_free_record_seals_chunks_early_only_when_space_is_short_or_the_wait_is_long() {
        let s = Duration::from_secs(1);
        let busy = CheckpointInputs {
            freeable: 3,
            unsettled_for: Duration::from_millis(2),
            idle_for: Duration::ZERO,
            since_last: Duration::ZERO,
            ..busy()
        };
        // The settled one now, the others when their chunks fill.
        assert_eq!(
            reclaim_now(busy, s),
            Some(Reclaim::FreeDead { seal: false })
        );
        let none_settled = CheckpointInputs { settled: 0, ..busy };
        assert_eq!(reclaim_now(none_settled, s), None);
        // Waited long enough: sealed.
        let long = CheckpointInputs {
            unsettled_for: SETTLE_WAIT,
            ..none_settled
        };
        assert_eq!(reclaim_now(long, s), Some(Reclaim::FreeDead { seal: true }));
        // Space short: sealed at once, settled or not.
        for settled in [0, 1] {
            let short = CheckpointInputs {
                free: 10,
                settled,
                ..busy
            };
            assert_eq!(
                reclaim_now(short, s),
                Some(Reclaim::FreeDead { seal: true })
            );
        }
        // All settled: nothing to seal, even when short.
        let all = CheckpointInputs {
            free: 10,
            settled: 3,
            unsettled_for: Duration::ZERO,
            ..busy
        };
        assert_eq!(reclaim_now(all, s), Some(Reclaim::FreeDead { seal: false }));
    }

    #[test]
    fn the_checkpoint_starts_early_enough_to_finish_before_space_runs_out() {
        let ms = Duration::from_millis;
        // 40 ms at 155 segments/s of 1024 blocks: 6.2 segments appended meanwhile.
        assert_eq!(
            checkpoint_urgent(2, ms(40), 155.0 * 1024.0, 1024.0, 8),
            2 + 8
        );
        // 40 ms at 100 segments/s: 4 appended meanwhile, one more for the margin.
        assert_eq!(
            checkpoint_urgent(2, ms(40), 100.0 * 1024.0, 1024.0, 16),
            2 + 4 + 1
        );
        // Idle or unmeasured: the old fixed margin of two.
        assert_eq!(checkpoint_urgent(2, ms(40), 0.0, 1024.0, 8), 4);
        assert_eq!(checkpoint_urgent(2, Duration::ZERO, 1e6, 1024.0, 8), 4);
        // A stalled checkpoint does not make every dead segment urgent.
        assert_eq!(
            checkpoint_urgent(2, Duration::from_secs(5), 1e6, 1024.0, 8),
            2 + 8
        );
        assert_eq!(checkpoint_urgent(2, ms(40), f64::NAN, 1024.0, 8), 4);
        assert_eq!(checkpoint_urgent(3, ms(40), 1e6, 0.0, 8), 5);
    }

    #[test]
    fn the_pace_does_not_count_on_segments_waiting_for_a_checkpoint() {
        assert_eq!(pace_space(5, 8, 3, true), 8);
        assert_eq!(pace_space(5, 8, 3, false), 13);
        assert_eq!(
            pace_space(5, 2, 9, true),
            7,
            "never more than the dead ones"
        );
        // With 8 dead segments waiting for a checkpoint, writers are slowed already.
        let rate = 100_000.0;
        let max = Duration::from_millis(1);
        let counted = write_pace(pace_space(6, 8, 0, false), 2, 16, rate, max, 32);
        let waiting = write_pace(pace_space(6, 8, 0, true), 2, 16, rate, max, 32);
        assert!(waiting > counted, "{waiting:?} <= {counted:?}");
    }

    #[test]
    fn interval_follows_free_space() {
        let m = Duration::from_millis(10);
        assert_eq!(background_interval(40, 10, m), Duration::from_millis(40));
        assert_eq!(background_interval(10, 10, m), m);
        assert_eq!(background_interval(3, 10, m), m);
    }

    #[test]
    fn throttle_is_proportional_and_bounded() {
        let max = Duration::from_micros(100);
        assert_eq!(throttle_delay(20, 2, 10, max), Duration::ZERO);
        assert_eq!(throttle_delay(10, 2, 10, max), Duration::ZERO);
        let a = throttle_delay(8, 2, 10, max);
        let b = throttle_delay(4, 2, 10, max);
        assert!(Duration::ZERO < a && a < b && b < max, "{a:?} {b:?}");
        assert_eq!(throttle_delay(2, 2, 10, max), max);
        assert_eq!(throttle_delay(0, 2, 10, max), max);
    }

    #[test]
    fn the_pace_follows_the_cleaning_rate_and_free_space() {
        let max = Duration::from_millis(1);
        // Above the start: unpaced.
        assert_eq!(write_pace(20, 2, 20, 10_000.0, max, 32), Duration::ZERO);
        // Halfway: exactly the cleaner's rate (10k blocks/s: 100 us per block).
        let mid = write_pace(11, 2, 20, 10_000.0, max, 32);
        assert!((mid.as_secs_f64() - 1e-4).abs() < 1e-9, "{mid:?}");
        // Less free space: slower; at the reserve, half the rate.
        let low = write_pace(2, 2, 20, 10_000.0, max, 32);
        assert!((low.as_secs_f64() - 2e-4).abs() < 1e-9, "{low:?}");
        assert!(write_pace(5, 2, 20, 10_000.0, max, 32) > mid);
        assert!(write_pace(18, 2, 20, 10_000.0, max, 32) < mid);
        // A faster cleaner: a faster pace; never slower than max_pace.
        assert!(write_pace(11, 2, 20, 40_000.0, max, 32) < mid);
        assert_eq!(write_pace(2, 2, 20, 1.0, max, 32), max);
        // No measurement yet: the proportional delay spread over the writers.
        assert_eq!(
            write_pace(2, 2, 20, 0.0, max, 4),
            throttle_delay(2, 2, 20, max) / 4
        );
    }

    #[test]
    fn foreground_watermark() {
        assert!(foreground_needed(3, 3));
        assert!(!foreground_needed(4, 3));
    }
}
