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

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
    }
}
