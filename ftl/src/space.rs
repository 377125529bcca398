//! Free-space flow control between writers and the cleaner: one type, [`SpaceWaiters`].
//!
//! Owns: the throttle (a pace for all writers together, one block per interval, slots
//! handed out in arrival order), the wait for a free segment (while a cleaner is attached,
//! or, `wait_unattached`, while a discard holds segments), the foreground-request counter
//! the cleaner yields to, and the time writers spent in each wait. Knows nothing of
//! segments or the log: the engine calls
//! [`SpaceWaiters::throttle`] before a write and [`SpaceWaiters::wait`] when no segment is
//! free; the checkpoint calls [`SpaceWaiters::notify`] when it freed segments; the cleaner
//! sets the pace (through `Ftl::set_write_pace`).

use crate::sync::{lock, wait_timeout, AtomicBool, AtomicU64, Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Unused pacing time a writer may draw on: a pause of the writers does not buy a
/// burst longer than this.
const PACE_SLACK_NS: u64 = 1_000_000;

/// Writers waiting for free segments, and the cleaner's signals to them.
pub struct SpaceWaiters {
    generation: Mutex<u64>,
    cv: Condvar,
    cleaner_attached: AtomicBool,
    /// The throttle: nanoseconds between two blocks admitted, over all writers (0: none).
    pace_ns: AtomicU64,
    /// When (nanoseconds after `clock`) the next block may go.
    next_slot_ns: AtomicU64,
    /// Notified (under its lock) when the pace changes: writers asleep in the throttle
    /// follow it.
    pace_changed: Mutex<()>,
    pace_cv: Condvar,
    clock: Instant,
    /// Foreground requests started (the cleaner compares it across a slice).
    foreground_ops: AtomicU64,
    /// Users' reads started, and the count the cleaner's last victim read saw
    /// ([`SpaceWaiters::reads_since_last_look`]).
    foreground_reads: AtomicU64,
    reads_seen: AtomicU64,
    /// Nanoseconds writers spent in the throttle, and waiting for free segments.
    throttled_ns: AtomicU64,
    space_wait_ns: AtomicU64,
    /// The longest writer's stall for free segments ([`SpaceWaiters::note_stall`]) since
    /// [`SpaceWaiters::take_longest_stall`] last took it.
    longest_stall_ns: AtomicU64,
}

impl Default for SpaceWaiters {
    fn default() -> Self {
        SpaceWaiters {
            generation: Mutex::new(0),
            cv: Condvar::new(),
            cleaner_attached: AtomicBool::new(false),
            pace_ns: AtomicU64::new(0),
            next_slot_ns: AtomicU64::new(0),
            pace_changed: Mutex::new(()),
            pace_cv: Condvar::new(),
            clock: Instant::now(),
            foreground_ops: AtomicU64::new(0),
            foreground_reads: AtomicU64::new(0),
            reads_seen: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
            space_wait_ns: AtomicU64::new(0),
            longest_stall_ns: AtomicU64::new(0),
        }
    }
}

impl SpaceWaiters {
    /// Reserves `blocks` slots of the pace; returns how long the caller must wait for
    /// them (zero when unpaced or the schedule is behind). The slots are handed out in
    /// arrival order with a compare-and-swap on the next free slot, so writers are
    /// spread evenly at the pace instead of each sleeping a fixed delay.
    #[cfg(test)]
    fn reserve_slots(&self, blocks: u64) -> Duration {
        self.reserve_slots_at_pace(blocks).0
    }

    /// [`Self::reserve_slots`], also giving the pace (nanoseconds per block) the wait was
    /// reserved at.
    fn reserve_slots_at_pace(&self, blocks: u64) -> (Duration, u64) {
        let pace = self.pace_ns.load(Ordering::Relaxed);
        if pace == 0 {
            return (Duration::ZERO, 0);
        }
        let cost = pace.saturating_mul(blocks);
        let now = self.clock.elapsed().as_nanos() as u64;
        let mut cur = self.next_slot_ns.load(Ordering::Relaxed);
        loop {
            let start = cur.max(now.saturating_sub(PACE_SLACK_NS));
            match self.next_slot_ns.compare_exchange_weak(
                cur,
                start.saturating_add(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (Duration::from_nanos(start.saturating_sub(now)), pace),
                Err(c) => cur = c,
            }
        }
    }

    /// Holds a writer of `blocks` blocks for its slots of the pace.
    pub fn throttle(&self, blocks: u64) {
        let (d, pace) = self.reserve_slots_at_pace(blocks);
        if !d.is_zero() {
            let waited = self.sleep_at_pace(d, pace);
            self.throttled_ns
                .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Sleeps `d`, reserved at `pace` nanoseconds per block. A pace change meanwhile
    /// scales what is left of the sleep (ends it when the throttle stops), as
    /// [`Self::set_pace`] scales the slots not yet handed out: a writer already asleep
    /// when the cleaner caught up slept out the slow pace (up to hundreds of ms with 32
    /// writers; found by review, 2026-11-27). Returns how long it slept.
    #[cfg(not(feature = "shuttle"))]
    fn sleep_at_pace(&self, d: Duration, mut pace: u64) -> Duration {
        let began = Instant::now();
        let mut deadline = began + d;
        let mut g = lock(&self.pace_changed);
        loop {
            // Looked at under the lock: a change after this look notifies only once this
            // thread waits.
            let now_pace = self.pace_ns.load(Ordering::Relaxed);
            let now = Instant::now();
            if now_pace != pace {
                let left = deadline.saturating_duration_since(now).as_nanos();
                let left = left * now_pace as u128 / pace as u128;
                deadline = now + Duration::from_nanos(left.min(u64::MAX as u128) as u64);
                pace = now_pace;
            }
            if now >= deadline || pace == 0 {
                return began.elapsed();
            }
            g = wait_timeout(&self.pace_cv, g, deadline - now);
        }
    }

    /// Under shuttle a timed wait never times out: a plain sleep (a scheduling point).
    #[cfg(feature = "shuttle")]
    fn sleep_at_pace(&self, d: Duration, _pace: u64) -> Duration {
        shuttle::thread::sleep(d);
        d
    }

    /// Sets the pace: writers together are admitted one block per `interval` (zero: no
    /// throttle). The slots handed out beyond now are rescaled to the new pace (dropped
    /// with none): a schedule reserved at a slow pace outlived it, and writers admitted
    /// after the throttle came back at a fast pace waited out the old one (up to seconds;
    /// found by review, 2026-11-27).
    pub fn set_pace(&self, interval: Duration) {
        let new = interval.as_nanos().min(u64::MAX as u128) as u64;
        let old = self.pace_ns.swap(new, Ordering::Relaxed);
        if old == new || old == 0 {
            return;
        }
        // Writers asleep in the throttle rescale what is left of their sleep.
        drop(lock(&self.pace_changed));
        self.pace_cv.notify_all();
        let now = self.clock.elapsed().as_nanos() as u64;
        let _ = self
            .next_slot_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                (cur > now).then(|| {
                    let owed = (cur - now) as u128 * new as u128 / old as u128;
                    now.saturating_add(owed.min(u64::MAX as u128) as u64)
                })
            });
    }

    /// The current pace (zero: none).
    pub fn pace(&self) -> Duration {
        Duration::from_nanos(self.pace_ns.load(Ordering::Relaxed))
    }

    /// Declares whether a cleaner runs (writers short of space then wait for it), and
    /// wakes the waiters either way.
    pub fn attach(&self, attached: bool) {
        self.cleaner_attached.store(attached, Ordering::SeqCst);
        self.notify();
    }

    /// Whether a cleaner is attached.
    pub fn attached(&self) -> bool {
        self.cleaner_attached.load(Ordering::SeqCst)
    }

    /// How many times segments were freed so far (or the FTL failed): a writer that found
    /// no room notes it under its stream lock, and [`SpaceWaiters::wait`] from it returns
    /// at once if segments were freed since, however long the writer took to get there.
    pub fn generation(&self) -> u64 {
        *lock(&self.generation)
    }

    /// Waits up to `limit` for segments to be freed after [`SpaceWaiters::generation`]
    /// said `since`, while a cleaner is attached. False when none is, or nothing was
    /// freed in time. (Waiting from the generation at the call missed a segment freed
    /// while the writer, having found no room, wrote the chunks it had sealed: it waited
    /// for the next one, and with none in `limit` failed with ENOSPC while a segment was
    /// free; found by review, 2026-11-27.)
    pub fn wait(&self, since: u64, limit: Duration) -> bool {
        self.attached() && self.wait_unattached(since, limit)
    }

    /// The wait of [`SpaceWaiters::wait`] whether or not a cleaner is attached: a writer
    /// with none waits so for segments a discard under way gives back (discard rule 6).
    /// Counted among the writers' waits.
    pub fn wait_unattached(&self, since: u64, limit: Duration) -> bool {
        let began = Instant::now();
        let freed = self.wait_from(since, limit);
        let waited = began.elapsed().as_nanos() as u64;
        self.space_wait_ns.fetch_add(waited, Ordering::Relaxed);
        freed
    }

    /// A writer that waited for free segments ([`SpaceWaiters::wait`], maybe several
    /// times: every segment freed wakes every waiter) has one, or gave up, `stalled` after
    /// it first found none.
    pub fn note_stall(&self, stalled: Duration) {
        self.longest_stall_ns
            .fetch_max(stalled.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Waits up to `limit` for segments to be freed, whether or not a cleaner is attached,
    /// and not counted among the writers' waits (the cleaner's own, `append_loop`). False
    /// when nothing was freed in time.
    pub fn wait_for_free(&self, limit: Duration) -> bool {
        let start = self.generation();
        self.wait_from(start, limit)
    }

    /// Waits up to `limit` for the generation to move past `start`; true at once if it
    /// already did.
    fn wait_from(&self, start: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = lock(&self.generation);
        while *g == start {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = wait_timeout(&self.cv, g, deadline - now);
        }
        true
    }

    /// Wakes writers: segments were freed (or the FTL failed).
    pub fn notify(&self) {
        let mut g = lock(&self.generation);
        *g += 1;
        drop(g);
        self.cv.notify_all();
    }

    /// Counts a foreground request.
    pub fn note_foreground(&self) {
        self.foreground_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a user's read request that reaches the backing (its blocks are counted as
    /// foreground requests where they are located).
    pub fn note_user_read(&self) {
        self.foreground_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Users' reads started since the last call by any victim read (the prefetch thread
    /// and the cleaner's own reads both ask, `ftl::victim_read_depth`). Never counts one
    /// twice: the mark only moves forward.
    pub fn reads_since_last_look(&self) -> u64 {
        let now = self.foreground_reads.load(Ordering::Relaxed);
        now.saturating_sub(self.reads_seen.fetch_max(now, Ordering::Relaxed))
    }

    /// Foreground requests started so far.
    pub fn foreground_ops(&self) -> u64 {
        self.foreground_ops.load(Ordering::Relaxed)
    }

    /// Nanoseconds writers have spent in the throttle and waiting for free segments.
    pub fn wait_ns(&self) -> (u64, u64) {
        (
            self.throttled_ns.load(Ordering::Relaxed),
            self.space_wait_ns.load(Ordering::Relaxed),
        )
    }

    /// The longest writer's stall for free segments since the last call, and starts over.
    pub fn take_longest_stall(&self) -> Duration {
        Duration::from_nanos(self.longest_stall_ns.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_spreads_writers_evenly() {
        let s = SpaceWaiters::default();
        assert_eq!(s.reserve_slots(10), Duration::ZERO, "no pace, no wait");
        s.set_pace(Duration::from_millis(1));
        // Back-to-back reservations queue behind each other: the schedule moves on by
        // the cost of each, less the slack a pause of the writers left.
        let a = s.reserve_slots(2);
        let b = s.reserve_slots(2);
        assert!(b >= a + Duration::from_micros(1900), "{a:?} then {b:?}");
        assert!(b <= Duration::from_millis(4), "{b:?}");
    }

    #[test]
    fn users_reads_are_counted_once_for_each_look() {
        let s = SpaceWaiters::default();
        assert_eq!(s.reads_since_last_look(), 0);
        s.note_user_read();
        s.note_user_read();
        s.note_foreground();
        assert_eq!(s.reads_since_last_look(), 2, "writes are not reads");
        assert_eq!(s.reads_since_last_look(), 0, "seen once");
    }

    #[test]
    fn a_schedule_reserved_at_a_slow_pace_follows_the_pace() {
        let s = SpaceWaiters::default();
        s.set_pace(Duration::from_millis(1));
        let _ = s.reserve_slots(10_000);
        // Off, then back at a pace a thousand times faster: no wait for the old schedule.
        s.set_pace(Duration::ZERO);
        s.set_pace(Duration::from_micros(1));
        assert!(s.reserve_slots(1) < Duration::from_millis(2));
        // Slower to faster while the schedule runs ahead: the debt shrinks with the pace.
        let _ = s.reserve_slots(10_000);
        s.set_pace(Duration::from_nanos(100));
        let d = s.reserve_slots(1);
        assert!(
            d <= Duration::from_millis(2),
            "10 ms of slots at 1 us are 1 ms at 100 ns: waited {d:?}"
        );
    }

    /// A writer already asleep in the throttle follows a pace change: when the throttle
    /// stops, it wakes at once instead of sleeping out ten seconds of slots reserved at
    /// the slow pace; at a pace ten times faster, its sleep shrinks tenfold.
    #[test]
    fn a_writer_asleep_in_the_throttle_follows_the_pace() {
        for (new, bound) in [(Duration::ZERO, 3), (Duration::from_micros(100), 3)] {
            let s = std::sync::Arc::new(SpaceWaiters::default());
            s.set_pace(Duration::from_millis(1));
            let _ = s.reserve_slots(10_000);
            let s2 = s.clone();
            let t = std::thread::spawn(move || {
                let began = Instant::now();
                s2.throttle(1);
                began.elapsed()
            });
            std::thread::sleep(Duration::from_millis(100));
            s.set_pace(new);
            let slept = t.join().expect("writer");
            assert!(
                slept < Duration::from_secs(bound),
                "10 s reserved at 1 ms a block, then the pace became {new:?}: slept {slept:?}"
            );
        }
    }

    #[test]
    fn waiting_for_space_needs_a_cleaner_and_ends_on_notify() {
        let s = std::sync::Arc::new(SpaceWaiters::default());
        assert!(
            !s.wait(s.generation(), Duration::from_secs(5)),
            "no cleaner: no wait"
        );
        s.attach(true);
        assert!(
            !s.wait(s.generation(), Duration::from_millis(20)),
            "nothing freed in time"
        );
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.wait(s2.generation(), Duration::from_secs(30)));
        // Notified until it returns: a notify before it read the generation is not seen.
        while !t.is_finished() {
            s.notify();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t.join().unwrap(), "woken by notify");
        assert!(s.wait_ns().1 > 0);
        // A notify after the generation was read and before the wait began is seen.
        let seen = s.generation();
        s.notify();
        let began = std::time::Instant::now();
        assert!(
            s.wait(seen, Duration::from_secs(30)),
            "freed since it was seen"
        );
        assert!(began.elapsed() < Duration::from_secs(1), "returned at once");
    }

    #[test]
    fn the_longest_stall_is_taken_once() {
        let s = SpaceWaiters::default();
        s.attach(true);
        assert!(!s.wait(s.generation(), Duration::from_millis(2)));
        assert_eq!(
            s.take_longest_stall(),
            Duration::ZERO,
            "a wait is not a stall"
        );
        s.note_stall(Duration::from_millis(3));
        s.note_stall(Duration::from_millis(15));
        s.note_stall(Duration::from_millis(4));
        assert_eq!(s.take_longest_stall(), Duration::from_millis(15));
        assert_eq!(s.take_longest_stall(), Duration::ZERO, "starts over");
        assert!(s.wait_ns().1 >= Duration::from_millis(2).as_nanos() as u64);
    }
}
