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
    /// Free segments at which the throttle starts.
    pub throttle_start: usize,
    /// The FTL's own rule (blocks appended since the last checkpoint) says one is due.
    pub due: bool,
    /// How long no foreground request arrived.
    pub idle_for: Duration,
    /// How long since this thread's last checkpoint.
    pub since_last: Duration,
}

/// Whether to checkpoint now: when the FTL says one is due; when dead segments wait and
/// writers are short of space (at the throttle's start); and when dead segments wait on
/// an idle device, `idle` after the last request and at most once per `idle`, so space
/// a TRIM or `fstrim` freed goes back to the backing (discarded) within seconds instead
/// of when space runs short.
pub fn checkpoint_needed(i: CheckpointInputs, idle: Duration) -> bool {
    i.due
        || (i.dead > 0 && i.free <= i.throttle_start)
        || (i.dead > 0 && i.idle_for >= idle && i.since_last >= idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_segments_are_checkpointed_when_space_is_short_or_the_device_idle() {
        let s = Duration::from_secs(1);
        let busy = CheckpointInputs {
            free: 50,
            dead: 3,
            throttle_start: 10,
            due: false,
            idle_for: Duration::from_millis(10),
            since_last: Duration::from_secs(30),
        };
        assert!(!checkpoint_needed(busy, s), "plenty of space, busy device");
        assert!(checkpoint_needed(CheckpointInputs { free: 10, ..busy }, s));
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
    fn foreground_watermark() {
        assert!(foreground_needed(3, 3));
        assert!(!foreground_needed(4, 3));
    }
}
