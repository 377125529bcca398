//! Kernel control of ublk devices (`/dev/ublk-control`) for the CLI and the daemon.
//!
//! libublk's control ring is thread-local: every function here creates a fresh
//! `UblkCtrl` for the device id in the calling thread and drops it before returning, so
//! they may be called from any thread (a signal-handling thread, another process).
//! Errors come back as messages a user can act on.
//!
//! Used by the device commands, the daemon and its control plane; uses only
//! [`crate::error`].

use crate::error::{describe_ublk, CliError};
use libublk::ctrl::UblkCtrl;
use libublk::{sys, UblkError};
use std::path::Path;

/// The kernel's ublk control device.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// Fails with the standard explanation when the kernel has no ublk driver.
pub fn require_ublk() -> Result<(), CliError> {
    if !Path::new(CONTROL_PATH).exists() {
        return Err(CliError::NoUblk);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(CliError::NotRoot);
    }
    Ok(())
}

/// Turns libublk's `Ok(negative errno)` (it passes EBUSY through as a value) into an error.
pub fn check(r: Result<i32, UblkError>) -> Result<i32, UblkError> {
    match r {
        Ok(n) if n < 0 => Err(UblkError::OtherError(n)),
        other => other,
    }
}

/// A control handle for an existing device `id`.
pub fn open(id: u32) -> Result<UblkCtrl, CliError> {
    require_ublk()?;
    let id32 = i32::try_from(id)
        .map_err(|_| CliError::BadArgs(format!("device id {id} is out of range")))?;
    UblkCtrl::new_simple(id32).map_err(|e| match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) if n == -libc::ENODEV => {
            CliError::NotFound(id)
        }
        e => CliError::Device(format!(
            "ublk device {id} not found ({})",
            describe_ublk(&e)
        )),
    })
}

/// Whether the kernel still knows device `id` (GET_DEV_INFO answers): after a delete,
/// until the last opener of its disk closes it, though its nodes are gone.
pub fn id_held(id: u32) -> bool {
    open(id).is_ok()
}

/// Kernel state of device `id`: "live", "quiesced" (no server: `recover` it), "dead"
/// (stopped), "fail-io".
pub fn state(id: u32) -> Result<&'static str, CliError> {
    let ctrl = open(id)?;
    Ok(match ctrl.dev_info().state as u32 {
        sys::UBLK_S_DEV_LIVE => "live",
        sys::UBLK_S_DEV_QUIESCED => "quiesced",
        sys::UBLK_S_DEV_DEAD => "dead",
        sys::UBLK_S_DEV_FAIL_IO => "fail-io",
        _ => "unknown",
    })
}

/// STOP_DEV: the queues abort, the daemon's `run_target` returns. Safe while it serves.
pub fn kill(id: u32) -> Result<(), CliError> {
    let ctrl = open(id)?;
    check(ctrl.kill_dev())
        .map(|_| ())
        .map_err(|e| CliError::ublk(format!("stopping ublk device {id}"), e))
}

/// STOP_DEV then DEL_DEV_ASYNC (kernels 6.9 and later): the kernel removes the device
/// once its last opener closes it, and this returns at once. A kernel without it gets
/// the waiting DEL_DEV ([`delete`]). A device already gone counts as deleted.
/// The waiting one held `del` for as long as anyone kept `/dev/ublkbN` open without
/// claiming it (a shell's `exec 3<`, qemu, dd), past its --timeout (found by review,
/// 2026-11-30).
pub fn kill_and_delete_async(id: u32) -> Result<(), CliError> {
    let ctrl = open(id)?;
    if let Err(e) = check(ctrl.kill_dev()) {
        eprintln!("ftlblk: stopping ublk device {id}: {}", describe_ublk(&e));
    }
    match check(ctrl.del_dev_async()) {
        Ok(_) => Ok(()),
        Err(UblkError::OtherError(n)) | Err(UblkError::UringIOError(n))
            if n == -libc::ENODEV || n == -libc::ENOENT =>
        {
            Ok(())
        }
        Err(_) => {
            drop(ctrl);
            delete(id)
        }
    }
}

/// DEL_DEV of a stopped device: returns once the kernel has released it (its last opener
/// closed `/dev/ublkbN`). A device already gone counts as deleted.
pub fn delete(id: u32) -> Result<(), CliError> {
    let ctrl = match open(id) {
        Err(CliError::NotFound(_)) => return Ok(()),
        other => other?,
    };
    match check(ctrl.del_dev()) {
        Ok(_) => Ok(()),
        Err(UblkError::OtherError(n)) | Err(UblkError::UringIOError(n))
            if n == -libc::ENODEV || n == -libc::ENOENT =>
        {
            Ok(())
        }
        Err(e) => Err(CliError::ublk(format!("deleting ublk device {id}"), e)),
    }
}

/// Whether block device `path` is claimed exclusively (a mounted file system, a device
/// mapper or md member): an `O_EXCL` open fails with EBUSY. A missing node is not.
pub fn claimed(path: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(path)
        .is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_well() {
        assert!(describe_ublk(&UblkError::OtherError(-libc::ENOENT)).contains("No such file"));
        assert!(check(Ok(-libc::EBUSY)).is_err());
        assert_eq!(check(Ok(3)).unwrap(), 3);
        if !Path::new(CONTROL_PATH).exists() {
            let e = require_ublk().unwrap_err().to_string();
            assert!(e.contains("modprobe ublk_drv"), "{e}");
            assert!(open(0).is_err());
        }
    }
}
