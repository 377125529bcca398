//! Starting a device daemon in the background and knowing when it is up: both ends of the
//! readiness protocol, and the naming of the log a background daemon writes.
//!
//! - The launcher end ([`start_background`], called by `ftlblk add` / `recover` in
//!   [`crate::device_cmd`]) starts `ftlblk <args>` (the same command with `--foreground`)
//!   as a detached process: `setsid`, stdin from /dev/null, stdout/stderr appended to a
//!   log in the run directory, the write end of a pipe inherited under
//!   `$FTLBLK_NOTIFY_FD`, the log's path under `$FTLBLK_LOG`. It then waits (at most
//!   [`START_TIMEOUT`]) for the daemon's report and returns its device record, or fails
//!   with the daemon's message, or the tail of its log when it died without one.
//! - The daemon end ([`Notifier`], used by [`crate::daemon`]) takes the pipe from the
//!   environment and sends exactly one line, `OK <json record>` once `/dev/ublkbN` is live
//!   or `ERR <message>` when it fails first, then closes it. End-of-file without a line
//!   means the daemon died. A daemon started in the foreground has no pipe: reports are
//!   no-ops.
//! - The log: `add` without `--id` does not know N yet and logs to `add-<pid>.log`
//!   ([`provisional_log`]); the daemon renames it to `N.log` once the kernel has given the
//!   device its id ([`settle_log`]).
//!
//! Uses [`crate::runfiles`] (paths, [`DeviceRecord`]) and [`crate::error`], nothing else
//! of the binary.

use crate::error::CliError;
use crate::runfiles::{self, DeviceRecord};
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Environment variable naming the readiness pipe's write end (set by the launcher).
pub const NOTIFY_FD_ENV: &str = "FTLBLK_NOTIFY_FD";
/// Environment variable naming the log file the launcher opened for the daemon.
pub const LOG_ENV: &str = "FTLBLK_LOG";

/// How long `add`/`recover` wait for the daemon to report (formatting and recovering a
/// large backing under emulation can take a while).
pub const START_TIMEOUT: Duration = Duration::from_secs(600);

/// The report of a daemon whose device is live: `OK ` and its record as one line of JSON.
const READY: &str = "OK ";
/// The report of a daemon that failed before its device was live: `ERR ` and the message.
const FAILED: &str = "ERR ";

/// The log file the launcher named in `$FTLBLK_LOG` (none in the foreground).
pub fn log_from_env() -> Option<PathBuf> {
    std::env::var_os(LOG_ENV).map(PathBuf::from)
}

/// The log a daemon for device `id` starts with: `N.log`, or `add-<pid>.log` while the
/// kernel has not picked the id yet.
pub fn provisional_log(id: Option<u32>) -> PathBuf {
    match id {
        Some(id) => runfiles::log_path(id),
        None => runfiles::run_dir().join(format!("add-{}.log", std::process::id())),
    }
}

/// Once the device has its id: renames a provisional log to `N.log` and returns the log
/// in force (the old name when the rename fails).
pub fn settle_log(log: Option<&PathBuf>, id: u32) -> Option<PathBuf> {
    log.map(|p| settle_log_at(p, &runfiles::log_path(id)))
}

/// [`settle_log`] with `N.log` at `want`. An earlier daemon's log there moves to
/// `N.log.1` first (replacing an older one): the rename replaced it, and the log a
/// failed close points the user to was gone once the next `add` took the same id (found
/// by review, 2026-11-29).
fn settle_log_at(p: &Path, want: &Path) -> PathBuf {
    if p == want {
        return p.to_path_buf();
    }
    if want.exists() {
        let mut older = want.as_os_str().to_owned();
        older.push(".1");
        let _ = std::fs::rename(want, PathBuf::from(older));
    }
    if std::fs::rename(p, want).is_ok() {
        want.to_path_buf()
    } else {
        p.to_path_buf()
    }
}

/// Starts `ftlblk <args>` as a detached daemon logging to `log` and waits for its report.
pub fn start_background(args: Vec<OsString>, log: &Path) -> Result<DeviceRecord, CliError> {
    runfiles::ensure_run_dir()?;
    let exe = std::env::current_exe().map_err(|e| CliError::io("cannot find my executable", e))?;
    // Never through a link planted at its name (a run directory others can write to).
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)
        .map_err(|e| CliError::io(format!("cannot open the log {}", log.display()), e))?;
    let logf2 = logf
        .try_clone()
        .map_err(|e| CliError::io(format!("log {}", log.display()), e))?;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(CliError::io("pipe", std::io::Error::last_os_error()));
    }
    // SAFETY: freshly created, owned by nothing else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let wfd = wr.as_raw_fd();
    let mut cmd = Command::new(&exe);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(logf))
        .stderr(Stdio::from(logf2))
        .current_dir("/")
        .env(NOTIFY_FD_ENV, wfd.to_string())
        .env(LOG_ENV, log);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Let the daemon inherit the pipe's write end.
            let flags = libc::fcntl(wfd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(wfd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::io(format!("cannot start the daemon {}", exe.display()), e))?;
    drop(wr);
    let line = read_report(rd, START_TIMEOUT);
    match line {
        Ok(Some(l)) if l.starts_with(READY) => serde_json::from_str(&l[READY.len()..])
            .map_err(|e| CliError::Launch(format!("the daemon's report is garbled ({e}): {l}"))),
        Ok(Some(l)) if l.starts_with(FAILED) => {
            let _ = child.wait();
            Err(CliError::Launch(l[FAILED.len()..].to_string()))
        }
        Ok(other) => {
            let status = child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            Err(CliError::Launch(format!(
                "the daemon exited ({status}) before the device was live{}; last lines of {}:\n{}",
                other
                    .map(|l| format!(" (it said: {l})"))
                    .unwrap_or_default(),
                log.display(),
                tail(log, 15)
            )))
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(CliError::Launch(format!(
                "{e}; the daemon was killed; last lines of {}:\n{}",
                log.display(),
                tail(log, 15)
            )))
        }
    }
}

/// Reads the readiness pipe until end-of-file or the first line; `Ok(None)` on a silent EOF.
fn read_report(rd: OwnedFd, limit: Duration) -> Result<Option<String>, CliError> {
    let deadline = Instant::now() + limit;
    let mut f = File::from(rd);
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CliError::Launch(format!(
                "the daemon did not report within {limit:?}"
            )));
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(CliError::io("poll", e));
        }
        if r == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.contains(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CliError::io("reading the daemon's report", e)),
        }
    }
    let s = String::from_utf8_lossy(&got);
    Ok(s.lines().next().map(|l| l.trim().to_string()))
}

/// The last `n` lines of the log (empty when it cannot be read).
fn tail(p: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The daemon's end of the readiness pipe; a no-op without one. Sends at most one report.
pub struct Notifier(Mutex<Option<File>>);

impl Notifier {
    /// Takes the pipe named by `$FTLBLK_NOTIFY_FD` (and clears the variable).
    pub fn from_env() -> Notifier {
        let fd = std::env::var(NOTIFY_FD_ENV)
            .ok()
            .and_then(|s| s.parse::<i32>().ok());
        std::env::remove_var(NOTIFY_FD_ENV);
        let file = fd.filter(|&fd| fd > 2).and_then(|fd| {
            // SAFETY: the launcher passed this descriptor to us for exactly this purpose;
            // check that it is open before taking ownership of it.
            (unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == 0)
                .then(|| unsafe { File::from_raw_fd(fd) })
        });
        Notifier(Mutex::new(file))
    }

    fn send(&self, line: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut f) = g.take() {
            let one_line = line.replace('\n', " ");
            let _ = writeln!(f, "{one_line}");
        }
    }

    /// Reports the live device.
    pub fn ok(&self, rec: &DeviceRecord) {
        if let Ok(s) = serde_json::to_string(rec) {
            self.send(&format!("{READY}{s}"));
        }
    }

    /// Reports a failure (ignored once the device was reported live).
    pub fn err(&self, msg: &str) {
        self.send(&format!("{FAILED}{msg}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0i32; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn a_settled_log_keeps_the_earlier_daemons_log() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new, want) = (
            dir.path().join("add-1.log"),
            dir.path().join("add-2.log"),
            dir.path().join("7.log"),
        );
        std::fs::write(&old, "the first daemon's close failed\n").unwrap();
        assert_eq!(settle_log_at(&old, &want), want);
        std::fs::write(&new, "the second daemon\n").unwrap();
        assert_eq!(settle_log_at(&new, &want), want);
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&want), "the second daemon\n");
        assert_eq!(
            read(&dir.path().join("7.log.1")),
            "the first daemon's close failed\n"
        );
        // Already there: nothing moves.
        assert_eq!(settle_log_at(&want, &want), want);
        assert_eq!(read(&want), "the second daemon\n");
    }

    #[test]
    fn report_pipe_protocol() {
        let (rd, wr) = pipe();
        let mut w = File::from(wr);
        std::io::Write::write_all(&mut w, b"ERR backing busy\n").unwrap();
        drop(w);
        assert_eq!(
            read_report(rd, Duration::from_secs(5)).unwrap(),
            Some("ERR backing busy".into())
        );
        let (rd, wr) = pipe();
        drop(wr);
        assert_eq!(read_report(rd, Duration::from_secs(5)).unwrap(), None);
    }

    #[test]
    fn notifier_sends_one_line_the_launcher_reads() {
        let (rd, wr) = pipe();
        let n = Notifier(Mutex::new(Some(File::from(wr))));
        n.err("cannot open\nthe backing");
        n.err("a second report is dropped");
        drop(n);
        assert_eq!(
            read_report(rd, Duration::from_secs(5)).unwrap(),
            Some("ERR cannot open the backing".into())
        );
    }
}
