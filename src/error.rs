//! The binary's error type, [`CliError`]: what every fallible function of `src/` returns.
//!
//! `main` prints an error's Display on one line after `ftlblk: error: ` and exits with its
//! [`CliError::exit_code`] (2; 1 for a `check` that found problems); a
//! daemon also sends it to the `add`/`recover` that launched it ([`crate::launch`]). A
//! message says what failed, on what (a path, a device, a block) and, where the user can do
//! something about it, what. Errors of the library crates pass through with their own
//! messages; I/O and JSON errors always carry what was being done (no bare
//! `From<io::Error>`).
//!
//! A leaf: uses no other module of the binary; every module may use it.

use libublk::UblkError;
use std::io;
use std::path::PathBuf;

/// Why a command (or the daemon) failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The FTL failed (format, open, check, read, write, close, ...).
    #[error(transparent)]
    Ftl(#[from] ftl::Error),
    /// The FTL failed while doing `context` (a block, a phase).
    #[error("{context}: {source}")]
    FtlAt {
        context: String,
        #[source]
        source: ftl::Error,
    },
    /// The cleaner failed or refused (an unknown policy name).
    #[error(transparent)]
    Cleaner(#[from] cleaner::Error),
    /// A trace, a workload or a simulation of `replay` failed.
    #[error(transparent)]
    Replay(#[from] replay::Error),
    /// A system call or file operation failed while doing `context`.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// JSON that could not be written or read, while doing `context`.
    #[error("{context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
    /// An option's value, or a combination of options, that cannot work (clap's own checks
    /// come first).
    #[error("{0}")]
    BadArgs(String),
    /// `add` was given a block device (or another non-file) without an ftlblk format.
    #[error(
        "{} has no ftlblk format; add formats only files: run `ftlblk format --backing {}` first",
        .0.display(),
        ftl::error::shell_quote(&.0.display().to_string())
    )]
    Unformatted(PathBuf),
    /// The backing has no file descriptor to read through.
    #[error("the backing has no file descriptor")]
    NoBackingFd,
    /// The kernel has no ublk driver.
    #[error(
        "/dev/ublk-control missing: the kernel lacks ublk_drv; try modprobe ublk_drv, or use \
         scripts/vm-run.sh"
    )]
    NoUblk,
    /// ublk devices are created and driven through /dev/ublk-control, which needs root.
    #[error("ublk devices need root (/dev/ublk-control): run ftlblk with sudo")]
    NotRoot,
    /// A ublk control command failed while doing `context`.
    #[error("{context}: {}", describe_ublk(.source))]
    Ublk {
        context: String,
        #[source]
        source: UblkError,
    },
    /// The kernel refused to let device `id` be recovered.
    #[error(
        "START_USER_RECOVERY of ublk device {id} failed: {} (is its old server still \
         exiting, or was it created without user recovery?)",
        describe_ublk(.source)
    )]
    RecoveryRefused {
        id: u32,
        #[source]
        source: UblkError,
    },
    /// The kernel has no ublk device with this number.
    #[error("ublk device {0} not found")]
    NotFound(u32),
    /// A device is not in the state the command needs (no record, still served, gone,
    /// live, its daemon unreachable or slow to exit); the message says which and what to do.
    #[error("{0}")]
    Device(String),
    /// A background daemon did not report its device live: its own message, or why it is
    /// silent and the tail of its log.
    #[error("{0}")]
    Launch(String),
    /// `check` found problems (listed above the error).
    #[error("the checker found problems")]
    CheckFailed,
    /// `del` failed for these devices (each reported as it failed).
    #[error("could not delete device(s) {0:?}")]
    DeleteFailed(Vec<u32>),
    /// A thread of a benchmark panicked (its message is on stderr).
    #[error("{0} panicked")]
    Panicked(&'static str),
    /// A benchmark's own check failed (a read came back short or with other data).
    #[error("{0}")]
    Bench(String),
    /// A plot could not be drawn (the replay crate's plotting reports text).
    #[error("{0}")]
    Plot(String),
    /// The metrics exposition could not be written.
    #[error("cannot render the metrics: {0}")]
    Metrics(std::fmt::Error),
}

impl CliError {
    /// The process's exit status for this error: 1 when `check` found the backing not
    /// clean, 2 for every failure to do what was asked (a script can tell "could not
    /// check" from "found problems").
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::CheckFailed => 1,
            _ => 2,
        }
    }

    /// An I/O error while doing `context`.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        CliError::Io {
            context: context.into(),
            source,
        }
    }

    /// A JSON error while doing `context`.
    pub fn json(context: impl Into<String>, source: serde_json::Error) -> Self {
        CliError::Json {
            context: context.into(),
            source,
        }
    }

    /// An FTL error while doing `context`.
    pub fn ftl_at(context: impl Into<String>, source: ftl::Error) -> Self {
        CliError::FtlAt {
            context: context.into(),
            source,
        }
    }

    /// A ublk control error while doing `context`.
    pub fn ublk(context: impl Into<String>, source: UblkError) -> Self {
        CliError::Ublk {
            context: context.into(),
            source,
        }
    }
}

/// A libublk error as text (`OtherError(-2)` becomes "No such file or directory").
pub fn describe_ublk(e: &UblkError) -> String {
    match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) if *n < 0 => {
            io::Error::from_raw_os_error(-n).to_string()
        }
        UblkError::IOError(e) => e.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check` finding problems exits 1; every failure to do what was asked exits 2.
    #[test]
    fn not_clean_and_could_not_check_exit_differently() {
        assert_eq!(CliError::CheckFailed.exit_code(), 1);
        assert_eq!(CliError::BadArgs("x".into()).exit_code(), 2);
        assert_eq!(
            CliError::from(ftl::Error::Index("corrupt".into())).exit_code(),
            2
        );
    }

    #[test]
    fn messages_read_as_one_line_with_their_context() {
        let e = CliError::io(
            "cannot open the log /run/ftlblk/0.log",
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(
            e.to_string(),
            "cannot open the log /run/ftlblk/0.log: Permission denied (os error 13)"
        );
        let e = CliError::ublk(
            "deleting ublk device 3",
            UblkError::OtherError(-libc::EBUSY),
        );
        assert_eq!(
            e.to_string(),
            "deleting ublk device 3: Device or resource busy (os error 16)"
        );
        assert!(CliError::Unformatted("/dev/sdb".into())
            .to_string()
            .starts_with("/dev/sdb has no ftlblk format"));
        assert_eq!(
            CliError::DeleteFailed(vec![1, 2]).to_string(),
            "could not delete device(s) [1, 2]"
        );
        assert!(!CliError::NoUblk.to_string().contains('\n'));
    }

    #[test]
    fn is_send_and_sync() {
        // Worker threads return it, clap's value parsers box it.
        fn check<T: Send + Sync + 'static>() {}
        check::<CliError>();
    }
}
