//! The one error type of the ftl crate. Every variant maps to an errno for the ublk edge.

use std::io;
use std::path::PathBuf;

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the FTL can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// I/O error from the backing device.
    #[error("backing device I/O error during {op} at byte {offset}: {source}")]
    Io {
        op: &'static str,
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// Error opening or locking the backing device.
    #[error("{}", open_message(.path, .source))]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another process holds the backing.
    #[error("backing {0} is already in use by another ftlblk server (exclusive lock held)")]
    Busy(String),
    /// Request outside the exported capacity.
    #[error("request out of range: blocks {lba}..{end} but the device has {capacity} blocks")]
    OutOfRange { lba: u64, end: u64, capacity: u64 },
    /// Request not a whole number of blocks.
    #[error("request not block aligned: {0}")]
    Unaligned(String),
    /// A block request the device does not implement (e.g. a zone operation).
    #[error("unsupported request: {0}")]
    Unsupported(String),
    /// A block request that cannot be valid (larger than the request buffer, ...).
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// Format or open parameters make no sense.
    #[error("invalid parameters: {0}")]
    InvalidParameters(String),
    /// The backing is smaller than the minimum the geometry needs.
    #[error("backing too small: {0}")]
    TooSmall(String),
    /// The backing already holds an ftlblk format and `force` was not given.
    #[error("backing {0} is already formatted as ftlblk (use --force to overwrite it and lose its data)")]
    AlreadyFormatted(String),
    /// The backing holds no ftlblk format but other data (a file system, partition
    /// table, image, or an ftlblk backing whose superblocks are lost) and `force` was not
    /// given.
    #[error("{0} holds data that is not an ftlblk format ({1}): a file system, partition table or disk image? Formatting would destroy it; check the path, or format it with `ftlblk format --backing ... --force` (a device that reads back ones after a discard: zero it with blkdiscard -z)")]
    ForeignData(String, String),
    /// The index directory holds the checkpoint of a backing and `force` was not given.
    #[error("{index} holds the map of the ftlblk backing {uuid}; formatting would erase it. Give this backing an index of its own (--index), remove that index if its backing is gone, or format anyway with `ftlblk format --backing ... --force`")]
    IndexInUse { index: String, uuid: String },
    /// No valid superblock.
    #[error("no valid ftlblk superblock on {0}: {1}")]
    NotFormatted(String, String),
    /// Superblock with reserved flags set: a newer build's feature.
    #[error("{backing} holds an ftlblk superblock with flags {flags:#x} this build does not know: a newer ftlblk formatted it, serve it with that one")]
    UnsupportedFeatures { backing: String, flags: u32 },
    /// Superblock from a newer or unknown version.
    #[error("{backing} holds an ftlblk superblock of version {found}; this build knows version {supported}: a newer ftlblk formatted it, serve it with that one")]
    UnsupportedVersion {
        backing: String,
        found: u32,
        supported: u32,
    },
    /// Backing smaller now than when it was formatted.
    #[error("{backing} is smaller than when it was formatted ({formatted} bytes, now {now}): the end of its log is missing; give it back its size (a file: truncate -s {formatted})")]
    Shrunk {
        backing: String,
        formatted: u64,
        now: u64,
    },
    /// A checksum or structural check failed on persisted metadata.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// Data read back does not match its recorded checksum.
    #[error("checksum mismatch reading block {lba} (physical block {pba})")]
    DataChecksum { lba: u64, pba: u64 },
    /// A block's map entry kept changing while it was read (relocated or overwritten
    /// each time): the read gave up rather than return data it could not verify.
    #[error("block {lba} kept moving during {tries} reads")]
    KeptMoving { lba: u64, tries: usize },
    /// The index store (sled) failed.
    #[error("index error: {0}")]
    Index(String),
    /// The index refuses every commit since one failed (`index::sled_store` rule 2): it
    /// commits again only once opened again, so the FTL turns read-only.
    #[error("index can no longer commit: {0}")]
    IndexStuck(String),
    /// The index does not belong to this backing, or cannot be read.
    /// (`path` and `backing` are "index" and "BACKING" from code that knows no paths;
    /// [`Error::naming_index`] fills them in.)
    #[error(
        "index {path} cannot serve this backing: {why}. If the index of this backing is \
         lost or damaged, rebuild it from the log: `ftlblk check --backing {} \
         --index {} --rebuild-index`",
        shell_quote(.backing),
        shell_quote(.path)
    )]
    IndexMismatch {
        path: String,
        backing: String,
        why: String,
    },
    /// No free segment to write into.
    #[error("device full: no free segment left to write into")]
    NoSpace,
    /// The FTL was poisoned by an earlier fatal error and refuses further writes.
    #[error("device is read-only after an earlier fatal error: {0}")]
    ReadOnly(String),
}

/// What [`Error::Open`] says: its source as it is when that already names the path (the
/// file backend's errors do: "cannot stat backing X: ..."), else prefixed with it.
fn open_message(path: &std::path::Path, source: &io::Error) -> String {
    let s = source.to_string();
    let p = path.display().to_string();
    if s.contains(&p) {
        s
    } else {
        format!("cannot open {p}: {s}")
    }
}

/// `s` as one word of a shell command line: as it is when it holds only characters no
/// shell treats specially, else in single quotes. For the commands messages suggest,
/// which a user pastes (a path with a space broke them; found by review, 2026-11-29).
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:=@%+,-".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl Error {
    /// Names the index directory and the backing in an [`Error::IndexMismatch`] (the
    /// directory in an [`Error::IndexInUse`]) raised by code that knows neither (the
    /// command it gives was to be run as printed, and a literal `--index index` rebuilt a
    /// directory of that name; found by review, 2026-11-27).
    pub fn naming_index(self, index_dir: &std::path::Path, backing: &std::path::Path) -> Self {
        match self {
            Error::IndexMismatch { why, .. } => Error::IndexMismatch {
                path: index_dir.display().to_string(),
                backing: backing.display().to_string(),
                why,
            },
            Error::IndexInUse { uuid, .. } => Error::IndexInUse {
                index: format!("index {}", index_dir.display()),
                uuid,
            },
            e => e,
        }
    }

    /// Wraps a device error with the operation and byte offset.
    pub fn io(op: &'static str, offset: u64, source: io::Error) -> Self {
        Error::Io { op, offset, source }
    }

    /// The negative-errno value a block request completing with this error reports.
    pub fn errno(&self) -> i32 {
        let e = match self {
            Error::Io { .. }
            | Error::DataChecksum { .. }
            | Error::KeptMoving { .. }
            | Error::Corrupt(_)
            | Error::Index(_)
            | Error::IndexStuck(_) => libc::EIO,
            Error::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Busy(_) => libc::EBUSY,
            Error::OutOfRange { .. }
            | Error::Unaligned(_)
            | Error::InvalidParameters(_)
            | Error::BadRequest(_) => libc::EINVAL,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::TooSmall(_) => libc::ENOSPC,
            Error::NoSpace => libc::ENOSPC,
            Error::AlreadyFormatted(_) | Error::ForeignData(..) | Error::IndexInUse { .. } => {
                libc::EEXIST
            }
            Error::NotFormatted(..) | Error::IndexMismatch { .. } => libc::EINVAL,
            Error::UnsupportedVersion { .. } | Error::UnsupportedFeatures { .. } => {
                libc::EPROTONOSUPPORT
            }
            Error::Shrunk { .. } => libc::EINVAL,
            Error::ReadOnly(_) => libc::EROFS,
        };
        -e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(
            Error::OutOfRange {
                lba: 1,
                end: 2,
                capacity: 1
            }
            .errno(),
            -libc::EINVAL
        );
        assert_eq!(
            Error::io("read", 0, io::Error::other("x")).errno(),
            -libc::EIO
        );
        assert_eq!(Error::NoSpace.errno(), -libc::ENOSPC);
        assert_eq!(Error::DataChecksum { lba: 0, pba: 0 }.errno(), -libc::EIO);
        assert_eq!(Error::KeptMoving { lba: 0, tries: 16 }.errno(), -libc::EIO);
    }

    /// The commands messages suggest paste whole whatever the paths hold.
    #[test]
    fn suggested_commands_quote_their_paths() {
        assert_eq!(
            shell_quote("/var/lib/ftlblk/a.img"),
            "/var/lib/ftlblk/a.img"
        );
        assert_eq!(shell_quote("/srv/my disk.img"), "'/srv/my disk.img'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        let e = Error::IndexMismatch {
            path: "/srv/my disk.ftlidx".into(),
            backing: "/srv/my disk.img".into(),
            why: "w".into(),
        }
        .to_string();
        assert!(
            e.contains("`ftlblk check --backing '/srv/my disk.img' --index '/srv/my disk.ftlidx' --rebuild-index`"),
            "{e}"
        );
    }
}
