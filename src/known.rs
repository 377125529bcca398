//! Backings formatted on this machine (`/var/lib/ftlblk/backings/`, or
//! `$FTLBLK_STATE_DIR/backings/`): what keeps `add` from formatting a new, empty backing
//! where a known one is missing.
//!
//! `add` creates and formats a backing file that does not exist (a config file's `size`
//! is "for a backing file created on first start"). At a boot where the file system
//! holding the backing was not mounted (a late network or iSCSI disk, a `nofail` mount),
//! that made a fresh empty device in its place on the root file system, served as
//! `/dev/ublkbN`, its writes hidden once the real mount appeared (found by review,
//! 2026-11-29). Now every format by `ftlblk format` or `add` records the backing's path;
//! `add` refuses to create a recorded backing that is missing, and `ftlblk format` (the
//! explicit way to start over) may create it again.
//!
//! One file per backing, named by a hash of its absolute path, holding a [`Known`] as
//! JSON; written atomically (temp file, fsync, rename, fsync of the directory). A record
//! that cannot be written is a warning, not a failed format. Used by the format command
//! and the daemon; uses only [`crate::error`].

use crate::error::CliError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The record of one formatted backing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Known {
    pub path: PathBuf,
    pub uuid: String,
    /// When it was formatted (seconds since the epoch).
    pub formatted_secs: u64,
}

/// The state directory in force: `$FTLBLK_STATE_DIR`, or `/var/lib/ftlblk`.
pub fn state_dir() -> PathBuf {
    std::env::var_os("FTLBLK_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/ftlblk"))
}

/// The absolute path of `path` as written (not resolved: a missing file has no
/// canonical form, and a config names its backing the same way every time).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// FNV-1a, 64 bits: a stable file name for a path.
fn name_of(path: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.json")
}

fn record_file(state: &Path, path: &Path) -> PathBuf {
    state.join("backings").join(name_of(&absolute(path)))
}

/// Records that `path` was just formatted as `uuid`, under `state`.
pub fn record(state: &Path, path: &Path, uuid: &str) -> Result<(), CliError> {
    let dir = state.join("backings");
    let file = record_file(state, path);
    let context = || format!("cannot record the backing in {}", file.display());
    let rec = Known {
        path: absolute(path),
        uuid: uuid.to_string(),
        formatted_secs: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let text = serde_json::to_string_pretty(&rec).map_err(|e| CliError::json(context(), e))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name_of(&rec.path),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &file)?;
        std::fs::File::open(&dir)?.sync_all()
    };
    write().map_err(|e| CliError::io(context(), e))
}

/// [`record`] in the state directory in force; a failure is a warning on stderr (the
/// format itself succeeded).
pub fn record_or_warn(path: &Path, uuid: &str) {
    if let Err(e) = record(&state_dir(), path, uuid) {
        eprintln!(
            "ftlblk: warning: {e}; a later `add` will not know this backing if it goes missing"
        );
    }
}

/// The record of `path` under `state`, if this machine formatted it (a record that does
/// not read counts as one: refusing to create is the safe side).
pub fn recorded(state: &Path, path: &Path) -> Option<Known> {
    let file = record_file(state, path);
    let text = std::fs::read_to_string(&file).ok()?;
    Some(serde_json::from_str(&text).unwrap_or(Known {
        path: absolute(path),
        uuid: "unknown (its record does not read)".into(),
        formatted_secs: 0,
    }))
}

/// For `add` about to create a missing backing: refused when this machine formatted one
/// there before.
pub fn may_create(state: &Path, path: &Path) -> Result<(), CliError> {
    match recorded(state, path) {
        None => Ok(()),
        Some(k) => Err(CliError::BadArgs(format!(
            "backing {} does not exist, but a backing formatted on this machine was there \
             (uuid {}): is the file system that holds it mounted? To start over with a new \
             empty device there, create it with `ftlblk format --backing {} --size SIZE` \
             first",
            path.display(),
            k.uuid,
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_backing_that_is_missing_is_not_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let b = dir.path().join("mnt/ftl/db.img");
        may_create(&state, &b).expect("nothing recorded: created");
        record(&state, &b, "1234").unwrap();
        let e = may_create(&state, &b).expect_err("recorded and missing");
        let msg = e.to_string();
        assert!(
            msg.contains("mounted") && msg.contains("ftlblk format"),
            "{msg}"
        );
        assert!(msg.contains("1234"), "{msg}");
        // Another path is not this one.
        may_create(&state, &dir.path().join("mnt/ftl/other.img")).unwrap();
        // A record that does not read still refuses.
        std::fs::write(record_file(&state, &b), b"{").unwrap();
        assert!(may_create(&state, &b).is_err());
    }

    #[test]
    fn a_relative_path_is_the_absolute_one() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let abs = std::env::current_dir().unwrap().join("x.img");
        record(&state, Path::new("x.img"), "u").unwrap();
        assert_eq!(recorded(&state, &abs).map(|k| k.path), Some(abs));
    }
}
