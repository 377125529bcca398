//! The command line's shared vocabulary: sizes (`512M`, `2G`) and the options several
//! commands take (where a backing and its index are, the geometry of a new format).
//!
//! Owns [`parse_size`], [`BackingArgs`] and [`GeometryArgs`]. Any command module may use
//! it; it uses only [`crate::error`], so commands depend on it and [`crate::cli`] depends
//! on the commands, never the other way round.

use crate::error::CliError;
use clap::Args;
use ftl::backing::default_index_dir;
use ftl::FormatOptions;
use std::path::PathBuf;

/// Where the backing and its index are.
#[derive(Args, Debug, Clone)]
pub struct BackingArgs {
    /// Backing file or block device.
    #[arg(long)]
    pub backing: PathBuf,
    /// Directory of the sled index (default: <backing>.ftlidx beside a file; for a block
    /// device /var/lib/ftlblk/<its path, / as ->.ftlidx, e.g. dev-vg0-data.ftlidx).
    #[arg(long)]
    pub index: Option<PathBuf>,
}

impl BackingArgs {
    pub fn index_dir(&self) -> PathBuf {
        self.index
            .clone()
            .unwrap_or_else(|| default_index_dir(&self.backing))
    }

    /// [`BackingArgs::index_dir`] for a new format: never an index of the earlier name.
    pub fn index_dir_for_format(&self) -> PathBuf {
        self.index
            .clone()
            .unwrap_or_else(|| ftl::backing::default_index_dir_for_format(&self.backing))
    }
}

/// Geometry options of `format`.
#[derive(Args, Debug, Clone, Default)]
pub struct GeometryArgs {
    /// Size to create a missing backing file with, and to use of the backing (e.g. 2G, 512M).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Segment size: the unit of log space and of cleaning; a power of two matching the
    /// SSD's erase unit (default: at least 512 segments, 1 MiB .. 256 MiB; cleaning needs
    /// hundreds of segments to separate hot data from cold).
    #[arg(long, value_parser = parse_size)]
    pub segment_size: Option<u64>,
    /// Over-provisioning in percent of the physical size (default 20).
    #[arg(long)]
    pub op_percent: Option<f64>,
    /// Flash page size for block patching: a FLUSH pads the log to it (power of two,
    /// 4K to 1M and at most a quarter of the segment; default 16K).
    #[arg(long, value_parser = parse_size)]
    pub page_size: Option<u64>,
}

impl GeometryArgs {
    pub fn options(&self) -> Result<FormatOptions, CliError> {
        let op_permille = match self.op_percent {
            // The range the format accepts (it said 0..100 and the format then refused
            // what it had let through).
            Some(p) if !(1.0..=90.0).contains(&p) => {
                return Err(CliError::BadArgs(format!(
                    "--op-percent {p} must be in 1..=90"
                )))
            }
            Some(p) => Some((p * 10.0).round() as u32),
            None => None,
        };
        let page = match self.page_size {
            Some(p) if p > u32::MAX as u64 => {
                return Err(CliError::BadArgs(format!("--page-size {p} is too large")))
            }
            Some(p) => Some(p as u32),
            None => None,
        };
        Ok(FormatOptions {
            segment_bytes: self.segment_size,
            op_permille,
            flash_page_bytes: page,
            size_bytes: self.size,
            ..Default::default()
        })
    }
}

/// Parses sizes like 4096, 64K, 512M, 2G, 1T (powers of 1024); a clap value parser.
pub fn parse_size(s: &str) -> Result<u64, CliError> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            // One suffix, whole: `1BB`, `1KIBIB` or `5iB` are not sizes (a suffix
            // stripped as often as it repeated took them; found by review, 2026-11-29).
            let mult: u64 = match s[i..].to_ascii_uppercase().as_str() {
                "B" => 1,
                "K" | "KB" | "KIB" => 1 << 10,
                "M" | "MB" | "MIB" => 1 << 20,
                "G" | "GB" | "GIB" => 1 << 30,
                "T" | "TB" | "TIB" => 1 << 40,
                other => {
                    return Err(CliError::BadArgs(format!(
                        "unknown size suffix {other:?} in {s:?} (use K, M, G, T)"
                    )))
                }
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| CliError::BadArgs(format!("{s:?} is not a size (e.g. 512M, 2G)")))?;
    n.checked_mul(mult)
        .ok_or_else(|| CliError::BadArgs(format!("size {s:?} overflows")))
}

/// Longest discard delay accepted (`add --discard-delay`): a day.
pub const MAX_DISCARD_DELAY_S: f64 = 86_400.0;

/// A number of seconds for `--discard-delay` ("2", "0.5", "0"), at most a day.
pub fn parse_seconds(s: &str) -> Result<f64, CliError> {
    let v: f64 = s.trim().parse().map_err(|_| {
        CliError::BadArgs(format!("{s:?} is not a number of seconds (e.g. 2, 0.5)"))
    })?;
    check_seconds(v)
}

/// `v` if it is a number of seconds from 0 to [`MAX_DISCARD_DELAY_S`].
pub fn check_seconds(v: f64) -> Result<f64, CliError> {
    if (0.0..=MAX_DISCARD_DELAY_S).contains(&v) {
        Ok(v)
    } else {
        Err(CliError::BadArgs(format!(
            "discard delay {v} s must be between 0 and {MAX_DISCARD_DELAY_S} s"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("2").ok(), Some(2.0));
        assert_eq!(parse_seconds(" 0.5 ").ok(), Some(0.5));
        assert_eq!(parse_seconds("0").ok(), Some(0.0));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("2s").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("1e9").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("64K").ok(), Some(64 << 10));
        assert_eq!(parse_size("2G").ok(), Some(2 << 30));
        assert_eq!(parse_size("2GiB").ok(), Some(2 << 30));
        assert!(parse_size("2X").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_size("512b").ok(), Some(512));
        assert_eq!(parse_size("3MB").ok(), Some(3 << 20));
        for bad in ["1BB", "1KIBIB", "5iB", "2GG", "1KBB"] {
            assert!(parse_size(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn op_percent_is_validated() {
        let g = GeometryArgs {
            op_percent: Some(150.0),
            ..Default::default()
        };
        assert!(g.options().is_err());
        let g = GeometryArgs {
            op_percent: Some(7.5),
            ..Default::default()
        };
        assert_eq!(g.options().unwrap().op_permille, Some(75));
        // The format's own range, 1% .. 90%.
        for bad in [0.5, 95.0] {
            let g = GeometryArgs {
                op_percent: Some(bad),
                ..Default::default()
            };
            assert!(g.options().is_err(), "{bad}");
        }
    }
}
