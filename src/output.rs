//! How the commands print: byte counts for people (`1.5 MiB`), documents as pretty JSON.
//!
//! Uses only [`crate::error`]; any command module may use it.

use crate::error::CliError;
use serde::Serialize;

/// Prints `v` as pretty JSON on stdout.
pub fn print_json<T: Serialize + ?Sized>(v: &T) -> Result<(), CliError> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| CliError::json("cannot write JSON", e))?;
    print_line(&text)
}

/// Prints `text` and a newline on stdout. A reader that went away (`| grep -q`, `| head`)
/// is not an error: `println!` panicked on the broken pipe.
pub fn print_line(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let wrote = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match wrote {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| CliError::io("writing to stdout", e)),
    }
}

/// `println!` through [`print_line`]: a reader that went away is not a panic. Evaluates to
/// its `Result`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::print_line(&format!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes `text` and a newline to `w`, ignoring any failure: what the server logs from
/// its data path must not stop it. `eprintln!` panics when stderr fails, and the
/// daemon's stderr is its log in `/run` (tmpfs): once that was full, a request whose
/// failure was being logged never completed (found by review, 2026-11-29).
pub fn write_line_lossy(w: &mut impl std::io::Write, text: &str) {
    let _ = w
        .write_all(text.as_bytes())
        .and_then(|()| w.write_all(b"\n"))
        .and_then(|()| w.flush());
}

/// `eprintln!` that never panics ([`write_line_lossy`] on stderr).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write_line_lossy(&mut std::io::stderr().lock(), &format!($($arg)*))
    };
}
pub(crate) use errln;

/// A kind of log line printed at most [`RateLimited::PER_SECOND`] times a second; the
/// lines left out are counted and their number said with the next line printed. For the
/// lines one request can cause (a failed read): a failing backing logged one per
/// request, as fast as requests came, into a log on tmpfs.
pub struct RateLimited {
    second: std::sync::atomic::AtomicU64,
    printed: std::sync::atomic::AtomicU64,
    left_out: std::sync::atomic::AtomicU64,
}

impl RateLimited {
    pub const PER_SECOND: u64 = 10;

    pub const fn new() -> Self {
        use std::sync::atomic::AtomicU64;
        RateLimited {
            second: AtomicU64::new(0),
            printed: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// The line `text` gives, with the count of lines left out before it, if this second
    /// has room for it (`now_secs`: the current second).
    pub fn admit(&self, now_secs: u64, text: impl FnOnce() -> String) -> Option<String> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.second.swap(now_secs, Relaxed) != now_secs {
            self.printed.store(0, Relaxed);
        }
        if self.printed.fetch_add(1, Relaxed) >= Self::PER_SECOND {
            self.left_out.fetch_add(1, Relaxed);
            return None;
        }
        Some(match self.left_out.swap(0, Relaxed) {
            0 => text(),
            n => format!("{} ({n} more like it left out of the log)", text()),
        })
    }

    /// Logs the line `text` gives on stderr if this second has room for it.
    pub fn log(&self, text: impl FnOnce() -> String) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(line) = self.admit(now, text) {
            write_line_lossy(&mut std::io::stderr().lock(), &line);
        }
    }
}

impl Default for RateLimited {
    fn default() -> Self {
        Self::new()
    }
}

/// `b` bytes in the largest binary unit that keeps the figure at least 1 (one decimal).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that always fails: what a full file system under stderr is.
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }
    }

    #[test]
    fn a_log_line_on_a_full_file_system_is_lost_not_a_panic() {
        write_line_lossy(&mut Full, "ftlblk: read of block 7: I/O error");
        let mut ok = Vec::new();
        write_line_lossy(&mut ok, "line");
        assert_eq!(ok, b"line\n");
    }

    #[test]
    fn a_line_per_request_is_limited_per_second_and_the_rest_counted() {
        let r = RateLimited::new();
        let printed: Vec<String> = (0..100)
            .filter_map(|i| r.admit(5, || format!("failed {i}")))
            .collect();
        assert_eq!(printed.len() as u64, RateLimited::PER_SECOND);
        assert_eq!(printed[0], "failed 0");
        // The next second: room again, and the 90 left out are said.
        let next = r.admit(6, || "failed 100".into()).expect("a new second");
        assert_eq!(next, "failed 100 (90 more like it left out of the log)");
        assert_eq!(
            r.admit(6, || "failed 101".into()).as_deref(),
            Some("failed 101")
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
    }
}
