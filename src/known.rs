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
//! and the daemon; uses [`crate::error`] and [`crate::runfiles`]'s durable write.

use crate::error::CliError;
use serde::{Deserialize, Serialize};
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

/// The path a record is kept under: the deepest existing ancestor of `path` resolved
/// (symbolic links, `..`), the rest appended with `.` and `..` taken out by hand. A
/// missing file has no canonical form, but the mount point above it still exists, so
/// `/srv/db.img` with `/srv` a link to `/mnt/big` and `/mnt/big/db.img` are one backing
/// (found by review, 2026-11-29: paths compared as spelled missed such a record).
fn absolute(path: &Path) -> PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<Component> = abs.components().collect();
    // The longest prefix that resolves (at least the root), then the rest by hand.
    let (mut out, rest) = (1..=parts.len())
        .rev()
        .find_map(|k| {
            let prefix: PathBuf = parts[..k].iter().collect();
            prefix.canonicalize().ok().map(|c| (c, &parts[k..]))
        })
        .unwrap_or_else(|| (abs.clone(), &parts[parts.len()..]));
    for part in rest {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out
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
    std::fs::create_dir_all(&dir)
        .and_then(|()| crate::runfiles::write_durably(&dir, &tmp, &file, &text))
        .map_err(|e| CliError::io(context(), e))
}

/// [`record`] in the state directory in force; a failure is a warning on stderr (the
/// format itself succeeded), for root only: another user's format cannot write
/// `/var/lib/ftlblk`, and the service, root, records the backing at its first open.
pub fn record_or_warn(path: &Path, uuid: &str) {
    if let Err(e) = record(&state_dir(), path, uuid) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!(
                "ftlblk: warning: {e}; a later `add` will not know this backing if it goes \
                 missing"
            );
        }
    }
}

/// For `add`, once its backing opened: records it if no record names it yet (a backing
/// formatted before records were kept, or by a user who could not write them). One
/// look at a file per start.
pub fn record_if_unknown(path: &Path, uuid: &str) {
    if recorded(&state_dir(), path).is_none() {
        record_or_warn(path, uuid);
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

/// For `add` about to create a missing backing (its index at `index`): refused when
/// this machine formatted one there before.
pub fn may_create(state: &Path, path: &Path, index: &Path) -> Result<(), CliError> {
    let Some(k) = recorded(state, path) else {
        return Ok(());
    };
    let quote = |p: &Path| ftl::error::shell_quote(&p.display().to_string());
    let index_arg = if index == ftl::backing::default_index_dir(path) {
        String::new()
    } else {
        format!(" --index {}", quote(index))
    };
    Err(CliError::BadArgs(format!(
        "backing {} does not exist, but a backing formatted on this machine was there \
         (uuid {}): is the file system that holds it mounted? To start over with a new \
         empty device there, create it with `ftlblk format --backing {}{index_arg} --size \
         SIZE` first",
        path.display(),
        k.uuid,
        quote(path),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_backing_that_is_missing_is_not_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let b = dir.path().join("mnt/ftl/db.img");
        let idx = ftl::backing::default_index_dir(&b);
        may_create(&state, &b, &idx).expect("nothing recorded: created");
        record(&state, &b, "1234").unwrap();
        let e = may_create(&state, &b, &idx).expect_err("recorded and missing");
        let msg = e.to_string();
        assert!(
            msg.contains("mounted") && msg.contains("ftlblk format"),
            "{msg}"
        );
        assert!(msg.contains("1234") && !msg.contains("--index"), "{msg}");
        // An index of its own is in the command the message gives.
        let e = may_create(&state, &b, Path::new("/var/lib/x.ftlidx")).unwrap_err();
        assert!(e.to_string().contains("--index /var/lib/x.ftlidx"), "{e}");
        // Another path is not this one.
        let other = dir.path().join("mnt/ftl/other.img");
        may_create(&state, &other, &idx).unwrap();
        // The same path spelt through a link or with `..` is.
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        let via_link = dir.path().join("link/mnt/ftl/../ftl/db.img");
        assert!(
            may_create(&state, &via_link, &idx).is_err(),
            "{}",
            via_link.display()
        );
        // A record that does not read still refuses.
        std::fs::write(record_file(&state, &b), b"{").unwrap();
        assert!(may_create(&state, &b, &idx).is_err());
    }

    #[test]
    fn a_relative_path_is_the_absolute_one() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let abs = std::env::current_dir()
            .unwrap()
            .canonicalize()
            .unwrap()
            .join("x.img");
        record(&state, Path::new("x.img"), "u").unwrap();
        assert_eq!(recorded(&state, &abs).map(|k| k.path), Some(abs));
    }
}
