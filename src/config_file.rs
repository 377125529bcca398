//! Device configuration files: `/etc/ftlblk/NAME.toml`, read by `ftlblk add --config
//! FILE` (and so by the `ftlblk@NAME` systemd unit). The keys are `ftlblk add`'s options;
//! sizes are strings with a suffix ("8G") or integers (bytes); a relative path is taken
//! from the file's directory. An unknown key, a value of the wrong type or a bad size is
//! an error that names the key and the line.
//!
//! ```toml
//! backing = "/var/lib/ftlblk/db.img"   # required
//! size = "64G"                         # a backing file created on first start
//! index = "/var/lib/ftlblk/db.ftlidx"
//! queues = 4
//! depth = 128
//! io_buf_size = "512K"
//! map_cache = "1G"
//! cleaner = true
//! id = 7                               # /dev/ublkb7
//! metrics_listen = "127.0.0.1:9400"
//! discard_delay = 2                    # seconds a freed segment waits for its discard
//! ```
//!
//! Used by [`crate::device_cmd::add`]; owns nothing else.

use crate::args::parse_size;
use crate::error::CliError;
use serde::de::{Unexpected, Visitor};
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};

/// What a configuration file says.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceFile {
    pub backing: PathBuf,
    pub index: Option<PathBuf>,
    #[serde(default, deserialize_with = "size")]
    pub size: Option<u64>,
    pub queues: Option<u16>,
    pub depth: Option<u16>,
    #[serde(default, deserialize_with = "size")]
    pub io_buf_size: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    pub map_cache: Option<u64>,
    pub cleaner: Option<bool>,
    pub id: Option<u32>,
    pub metrics_listen: Option<String>,
    /// Seconds (an integer or a decimal number).
    #[serde(default, deserialize_with = "seconds")]
    pub discard_delay: Option<f64>,
}

/// Seconds: 2 or 0.5, within what `--discard-delay` takes. A visitor rather than an
/// untagged enum: `discard_delay = "2"` said "data did not match any variant of
/// untagged enum", and -1 passed the file to fail later without naming it (found by
/// review, 2026-11-29).
fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    struct V;
    impl V {
        fn check<E: serde::de::Error>(&self, v: f64) -> Result<f64, E> {
            crate::args::check_seconds(v).map_err(|e| E::custom(e.to_string()))
        }
    }
    impl<'de> Visitor<'de> for V {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number of seconds, like 2 or 0.5")
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<f64, E> {
            self.check(n as f64)
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<f64, E> {
            self.check(n as f64)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<f64, E> {
            self.check(v)
        }
    }
    d.deserialize_any(V).map(Some)
}

/// A size: "8G" (the CLI's suffixes) or a whole number of bytes (a visitor, for the
/// message: see [`seconds`]).
fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size like \"8G\" or a whole number of bytes")
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            parse_size(s).map_err(|e| E::custom(format!("invalid size {s:?}: {e}")))
        }
    }
    d.deserialize_any(V).map(Some)
}

/// Parses `text` (the contents of `path`), resolving relative paths against `path`'s
/// directory.
pub fn parse(path: &Path, text: &str) -> Result<DeviceFile, CliError> {
    let mut f: DeviceFile =
        toml::from_str(text).map_err(|e| CliError::BadArgs(format!("{}: {e}", path.display())))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let resolve = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = dir.join(&*p);
        }
    };
    resolve(&mut f.backing);
    if let Some(i) = f.index.as_mut() {
        resolve(i);
    }
    Ok(f)
}

/// Reads and parses the configuration file at `path`.
pub fn load(path: &Path) -> Result<DeviceFile, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::io(format!("configuration file {}", path.display()), e))?;
    parse(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<DeviceFile, String> {
        parse(Path::new("/etc/ftlblk/db.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn every_key_reads() {
        let f = p(r#"
            backing = "/srv/db.img"
            index = "db.ftlidx"
            size = "64G"
            queues = 4
            depth = 64
            io_buf_size = 1048576
            map_cache = "1G"
            cleaner = false
            id = 7
            metrics_listen = "127.0.0.1:9400"
            discard_delay = 5
        "#)
        .unwrap();
        assert_eq!(
            f,
            DeviceFile {
                backing: "/srv/db.img".into(),
                index: Some("/etc/ftlblk/db.ftlidx".into()),
                size: Some(64 << 30),
                queues: Some(4),
                depth: Some(64),
                io_buf_size: Some(1 << 20),
                map_cache: Some(1 << 30),
                cleaner: Some(false),
                id: Some(7),
                metrics_listen: Some("127.0.0.1:9400".into()),
                discard_delay: Some(5.0),
            }
        );
        let half = p("backing = \"db.img\"\ndiscard_delay = 0.5").unwrap();
        assert_eq!(half.discard_delay, Some(0.5));
        let min = p(r#"backing = "db.img""#).unwrap();
        assert_eq!(min.backing, PathBuf::from("/etc/ftlblk/db.img"));
        assert_eq!(min.size, None);
    }

    #[test]
    fn bad_keys_are_named() {
        for (text, want) in [
            ("backing = \"/a\"\ndpeth = 3", "dpeth"),
            ("backing = \"/a\"\nqueues = \"four\"", "queues"),
            ("backing = \"/a\"\nsize = \"8X\"", "size"),
            ("size = \"8G\"", "backing"),
            ("backing = \"/a\"\nqueues = 70000", "queues"),
            // A wrong type says what is expected, on the key's line (found by review,
            // 2026-11-29: "did not match any variant of untagged enum Size").
            ("backing = \"/a\"\nsize = -1", "a size like"),
            ("backing = \"/a\"\nsize = 1.5", "a size like"),
            (
                "backing = \"/a\"\ndiscard_delay = \"2\"",
                "a number of seconds",
            ),
            ("backing = \"/a\"\ndiscard_delay = -1", "discard delay -1 s"),
        ] {
            let e = p(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains("/etc/ftlblk/db.toml"), "{e}");
        }
    }
}
