//! The run directory (`/run/ftlblk`, or `$FTLBLK_RUN_DIR`): how the CLI finds its daemons.
//!
//! Contract, per device id `N`:
//! - `N.json` is a [`DeviceRecord`], written atomically (temp file + rename + directory
//!   sync) by the daemon as soon as the kernel has given it the device (before it starts
//!   it), kept written while it serves ([`keep_record`]), and removed by the daemon on a
//!   clean exit. After a crash
//!   (kill -9) it stays: `recover` reads the backing, index and queue layout from it.
//! - `N.sock` is the daemon's stats socket (see `control`), present while it serves.
//! - `N.log` is the daemon's stdout/stderr when it runs in the background; kept on exit
//!   (the next daemon of the same id moves it to `N.log.1`).
//!
//! A record is *current* when its daemon is alive ([`daemon_alive`]: the pid is a live
//! `ftlblk` started when the record says) or the kernel still has the device
//! (`/dev/ublkcN` or `/sys/class/ublk-char/ublkcN`).
//!
//! Used by the device commands, the launcher, the daemon and its control plane; uses only
//! [`crate::error`].

use crate::error::CliError;
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The run directory in force (`$FTLBLK_RUN_DIR` overrides `/run/ftlblk`); also where
/// daemons keep their staging files ([`ftl::backing::default_staging_dir`]).
pub fn run_dir() -> PathBuf {
    ftl::backing::default_staging_dir()
}

/// The staging file at `path` when a server left it behind: it exists, no server holds
/// it, and a session took it (so it may hold writes that server completed and never got
/// to the backing: its close failed, or it was killed). A server's clean close removes
/// it; one that failed to start leaves a blank one. One that cannot be read counts.
pub fn left_staging(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    match ftl::staging::StagingArea::open_file_snapshot(path) {
        Ok(area) => area.owner().is_some(),
        // A live server's (its exclusive lock): not left behind.
        Err(ftl::Error::Busy(_)) => false,
        Err(_) => true,
    }
}

/// Creates the run directory.
pub fn ensure_run_dir() -> Result<PathBuf, CliError> {
    let d = run_dir();
    std::fs::create_dir_all(&d)
        .map_err(|e| CliError::io(format!("cannot create {}", d.display()), e))?;
    Ok(d)
}

pub fn record_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.json"))
}

pub fn socket_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.sock"))
}

pub fn log_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.log"))
}

/// `/dev/ublkbN`.
pub fn bdev_path(id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkb{id}"))
}

/// `/dev/ublkcN`.
pub fn cdev_path(id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkc{id}"))
}

/// Whether the kernel still has ublk device `id` (its char device exists).
pub fn kernel_has_device(id: u32) -> bool {
    cdev_path(id).exists() || Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists()
}

/// What a daemon publishes about the device it serves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceRecord {
    pub id: u32,
    pub block_device: PathBuf,
    pub char_device: PathBuf,
    pub backing: PathBuf,
    pub index: PathBuf,
    pub size_bytes: u64,
    pub block_size: u32,
    pub queues: u16,
    pub depth: u16,
    pub io_buf_bytes: u32,
    pub cleaner: bool,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: Option<PathBuf>,
    pub uuid: String,
    /// How many times this device was re-attached by `recover`.
    pub recoveries: u32,
    /// Bytes of RAM the map's page cache may hold (`add --map-cache`; 0 in records of
    /// older daemons: the default).
    #[serde(default)]
    pub map_cache_bytes: u64,
    /// Where the daemon serves its metrics (`add --metrics-listen`; `recover` keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Milliseconds a freed segment waits for its discard (`add --discard-delay`; absent
    /// in records of older daemons: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard_delay_ms: Option<u64>,
    /// When the daemon started, in clock ticks after boot (field 22 of `/proc/PID/stat`):
    /// with the pid, it names the process, so a pid the kernel gave to another `ftlblk`
    /// after the daemon died is not taken for it ([`daemon_alive`]). 0 in records of
    /// older daemons: the pid alone decides.
    #[serde(default)]
    pub pid_start: u64,
}

/// Writes `N.json` atomically.
pub fn write_record(rec: &DeviceRecord) -> Result<(), CliError> {
    let dir = ensure_run_dir()?;
    let path = record_path(rec.id);
    // Its own temp file per process: an old daemon's timer (keep_record) and a new one's
    // start writing the same id's record at once wrote into one file.
    let tmp = dir.join(format!(".{}.json.{}.tmp", rec.id, std::process::id()));
    let context = || format!("cannot write the device record {}", path.display());
    let mut doc = serde_json::to_value(rec).map_err(|e| CliError::json(context(), e))?;
    doc["version"] = RECORD_VERSION.into();
    let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::json(context(), e))?;
    write_durably(&dir, &tmp, &path, &text).map_err(|e| CliError::io(context(), e))
}

/// Replaces `path` (in directory `dir`) by `text` and a newline, atomically and durably:
/// written to `tmp` (in `dir`), synced, renamed over `path`, and the directory synced
/// (the rename is durable only with its directory; a run directory on tmpfs makes this
/// free, one on a disk does not).
pub fn write_durably(dir: &Path, tmp: &Path, path: &Path, text: &str) -> io::Result<()> {
    // A new file of its own, never through a link planted at its name: in a run
    // directory others can write to (`FTLBLK_RUN_DIR`), a symlink there had root truncate
    // whatever it pointed at (found by review, 2026-11-30). A stale one (a link too) goes.
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes this process's record of device `id` when dropped armed (the daemon's guard
/// over a new device's start: one that fails is deleted, and its record must go with it).
pub struct RecordGuard {
    id: u32,
    uuid: String,
    armed: bool,
}

impl RecordGuard {
    /// The record of device `id`, served from the backing of `uuid`.
    pub fn new(id: u32, uuid: String, armed: bool) -> Self {
        RecordGuard { id, uuid, armed }
    }

    /// The device started: the record stays.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if self.armed {
            let (pid, start) = own_process();
            remove_record_of(self.id, pid, start, &self.uuid);
        }
    }
}

/// Writes `rec` (this process's record, `own`: pid and start time) unless `N.json`
/// already is it; says whether it wrote. A record that is missing (never written: the
/// write failed when the device started; or removed under a running daemon), unreadable,
/// or a dead daemon's is written again; one naming another live daemon is left (the id
/// may be another device's once ours is deleted). The control plane calls it on its
/// timer, so a record that could not be written at the start is written once it can be.
pub fn keep_record(rec: &DeviceRecord, own: (u32, u64)) -> Result<bool, CliError> {
    let found = read_record_lenient(rec.id);
    let alive = |r: &DeviceRecord| daemon_alive(r);
    if !record_needs_writing(found.as_ref(), rec, own, alive) {
        return Ok(false);
    }
    write_record(rec).map(|_| true)
}

/// Whether `found` (the record file's content; `None`: missing or unreadable) must be
/// replaced by this daemon's `rec` ([`keep_record`]).
fn record_needs_writing(
    found: Option<&DeviceRecord>,
    rec: &DeviceRecord,
    own: (u32, u64),
    alive: impl Fn(&DeviceRecord) -> bool,
) -> bool {
    match found {
        None => true,
        Some(f) if f == rec => false,
        Some(f) => !another_daemons(f, own, || alive(f)),
    }
}

/// The version of the device record's layout, its `version` field (records of daemons
/// before it have none: version 1 too). A later one is refused: its fields may mean what
/// this build does not know, and `recover` acts on them.
pub const RECORD_VERSION: u32 = 1;

/// Reads `N.json`; `Ok(None)` when there is none. A record of a later layout, or one
/// naming another device than its file, is an error (found by review, 2026-11-29: any
/// record was taken, and `recover` reused its queues and paths).
pub fn read_record(id: u32) -> Result<Option<DeviceRecord>, CliError> {
    let path = record_path(id);
    match std::fs::read_to_string(&path) {
        Ok(s) => parse_record(id, &s)
            .map(Some)
            .map_err(|why| CliError::Device(format!("device record {}: {why}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CliError::io(path.display().to_string(), e)),
    }
}

/// `N.json` as far as it parses, unchecked (its version and id): for telling whose it
/// is (pid, start time) and for listing. A record `read_record` refuses is still a live
/// daemon's: removed or overwritten as unreadable, a later build's record lost its
/// protection (found by review of the version check, 2026-11-29).
fn read_record_lenient(id: u32) -> Option<DeviceRecord> {
    let text = std::fs::read_to_string(record_path(id)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The record of device `id` in `text`, checked: its layout's version, its id.
fn parse_record(id: u32, text: &str) -> Result<DeviceRecord, String> {
    #[derive(Deserialize)]
    struct Head {
        version: Option<u32>,
    }
    let head: Head = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let version = head.version.unwrap_or(1);
    if version > RECORD_VERSION {
        return Err(format!(
            "written by a later ftlblk (record version {version}; this build reads up to \
             {RECORD_VERSION})"
        ));
    }
    let rec: DeviceRecord = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if rec.id != id {
        return Err(format!("it names device {}, not {id}", rec.id));
    }
    Ok(rec)
}

/// Every readable record in the run directory, by id.
pub fn all_records() -> Vec<DeviceRecord> {
    let Ok(rd) = std::fs::read_dir(run_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<DeviceRecord> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id: u32 = name.strip_suffix(".json")?.parse().ok()?;
            read_record_lenient(id)
        })
        .collect();
    out.sort_by_key(|r| r.id);
    out
}

/// Removes `N.json` and `N.sock` (the log stays).
pub fn remove_record(id: u32) {
    let _ = std::fs::remove_file(record_path(id));
    let _ = std::fs::remove_file(socket_path(id));
}

/// Removes `N.json` and `N.sock` when the record is the one the process `pid` started
/// at `start` wrote, or a dead daemon's of the same backing (`uuid`), or none readable.
/// Once a device is deleted in the kernel its id is free: an `add` may take it and write
/// its own record while the old daemon still closes its FTL, and the old daemon's (or
/// `del`'s) cleanup removed the new device's record (found by review, 2026-11-27); and
/// when that new daemon was killed meanwhile, its record (all `recover` has) went with
/// the old daemon's cleanup, and the next `add` of its backing made a second device over
/// it (found by review, 2026-11-29). The start time tells the new daemon from the old
/// when the kernel gave it the old one's pid. Says whether it removed them.
pub fn remove_record_of(id: u32, pid: u32, start: u64, uuid: &str) -> bool {
    let rec = read_record_lenient(id);
    if record_removable(rec.as_ref(), (pid, start), uuid, daemon_alive) {
        remove_record(id);
        true
    } else {
        false
    }
}

/// Whether the cleanup of the daemon `own` (pid, start time) of the backing `uuid` may
/// remove `rec`: none readable, its own, or a dead daemon's of the same backing. Not a
/// live daemon's, nor a dead one's of another backing (a device the kernel keeps for its
/// `recover`). `alive`: whether the recorded daemon lives.
fn record_removable(
    rec: Option<&DeviceRecord>,
    own: (u32, u64),
    uuid: &str,
    alive: impl Fn(&DeviceRecord) -> bool,
) -> bool {
    match rec {
        None => true,
        Some(r) if another_daemons(r, own, || alive(r)) => false,
        Some(r) => is_own(r, own) || r.uuid == uuid,
    }
}

fn is_own(rec: &DeviceRecord, own: (u32, u64)) -> bool {
    rec.pid == own.0 && (own.1 == 0 || same_start(rec.pid_start, Some(own.1)))
}

/// Whether `rec` belongs to another live daemon than the process `own` (pid, start time;
/// a start time of 0 on either side: the pid alone decides). `alive`: whether the
/// recorded daemon lives.
fn another_daemons(rec: &DeviceRecord, own: (u32, u64), alive: impl Fn() -> bool) -> bool {
    !is_own(rec, own) && alive()
}

/// Whether the daemon `rec` names is alive: its pid is a live `ftlblk` that started
/// when the record says. After a kill -9 the kernel may give the pid to another
/// process, another daemon's included; `recover` then refused with "still served by"
/// that daemon, and `del` waited for it to exit.
pub fn daemon_alive(rec: &DeviceRecord) -> bool {
    process_alive(rec.pid, rec.pid_start)
}

/// Whether `pid` is a live `ftlblk` started at `start` ([`pid_start_time`]; 0: at any
/// time, for records of older daemons).
pub fn process_alive(pid: u32, start: u64) -> bool {
    pid_alive(pid) && same_start(start, pid_start_time(pid))
}

fn same_start(recorded: u64, now: Option<u64>) -> bool {
    recorded == 0 || now == Some(recorded)
}

/// This process: its pid and start time (0 if unreadable), as its record names it.
pub fn own_process() -> (u32, u64) {
    let pid = std::process::id();
    (pid, pid_start_time(pid).unwrap_or(0))
}

/// When process `pid` started, in clock ticks after boot (field 22 of
/// `/proc/PID/stat`); `None` if there is no such process.
pub fn pid_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the fields after the last ')' start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether `pid` is a live (not zombie) ftlblk process.
fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    if matches!(state, Some("Z") | Some("X") | None) {
        return false;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    comm.trim() == "ftlblk"
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A durable write never goes through a link planted at its temp file's name: the
    /// file it points at keeps its bytes, and the record is written.
    #[test]
    fn a_link_at_the_temp_files_name_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let (tmp, path) = (d.path().join(".7.json.1.tmp"), d.path().join("7.json"));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        write_durably(d.path(), &tmp, &path, "{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        assert!(!tmp.exists());
    }

    /// A record of device `id` for the tests (this process's pid).
    pub(crate) fn sample(id: u32) -> DeviceRecord {
        DeviceRecord {
            id,
            block_device: bdev_path(id),
            char_device: cdev_path(id),
            backing: "/tmp/x.img".into(),
            index: "/tmp/x.img.ftlidx".into(),
            size_bytes: 1 << 30,
            block_size: 4096,
            queues: 2,
            depth: 128,
            io_buf_bytes: 512 << 10,
            cleaner: true,
            pid: std::process::id(),
            pid_start: 0,
            socket: socket_path(id),
            log: None,
            uuid: "u".into(),
            recoveries: 0,
            map_cache_bytes: 64 << 20,
            metrics_listen: Some("127.0.0.1:9400".into()),
            discard_delay_ms: Some(2000),
        }
    }

    /// A staging file is left behind by a server that died (or whose close failed), not
    /// while a server holds it, and not after a clean close (which removes it).
    #[test]
    fn a_staging_file_is_left_only_by_a_server_that_did_not_close() {
        use ftl::backing::{format_backing, open_backing_staged, staging_file, StagingPlace};
        let d = tempfile::tempdir().unwrap();
        let (img, idx, run) = (
            d.path().join("b.img"),
            d.path().join("b.idx"),
            d.path().join("run"),
        );
        std::fs::create_dir(&run).unwrap();
        let sb = format_backing(
            &img,
            &idx,
            Some(64 << 20),
            &ftl::FormatOptions::default(),
            false,
        )
        .unwrap();
        let file = staging_file(&run, &sb.uuid_string());
        let place = StagingPlace::Dir(run.clone());
        let open = || {
            open_backing_staged(&img, &idx, ftl::Config::default(), &place)
                .unwrap()
                .0
        };
        assert!(!left_staging(&file), "no file");
        let f = open();
        f.write(3, &[7u8; 4096], false, ftl::StreamId(1)).unwrap();
        assert!(file.exists());
        assert!(!left_staging(&file), "a live server's");
        drop(f); // killed: no close
        assert!(left_staging(&file), "a killed server's");
        let f = open();
        f.close().unwrap();
        assert!(!left_staging(&file), "after a clean close");
    }

    /// A cleanup removes no live daemon's record but its own, and of a dead daemon's only
    /// one of its own backing: another backing's names a device the kernel keeps for its
    /// `recover`.
    #[test]
    fn a_cleanup_removes_its_own_record_and_dead_ones_of_its_backing_only() {
        let rec = sample(7);
        let (own, other) = ((rec.pid, rec.pid_start), (rec.pid + 1, 5));
        let (live, dead) = (|_: &DeviceRecord| true, |_: &DeviceRecord| false);
        assert!(record_removable(None, own, "u", live));
        assert!(record_removable(Some(&rec), own, "u", live), "its own");
        assert!(
            record_removable(Some(&rec), own, "v", live),
            "its own, whatever the uuid"
        );
        assert!(
            !record_removable(Some(&rec), other, "u", live),
            "a live daemon's"
        );
        assert!(
            record_removable(Some(&rec), other, "u", dead),
            "dead, same backing"
        );
        assert!(
            !record_removable(Some(&rec), other, "v", dead),
            "dead, another backing"
        );
    }

    /// A record is read back as written (its version added), one without a version is
    /// an older daemon's (version 1), one of a later version or naming another device
    /// is refused.
    #[test]
    fn a_record_of_a_later_layout_or_another_device_is_refused() {
        let rec = sample(7);
        let mut doc = serde_json::to_value(&rec).unwrap();
        let older = doc.to_string();
        assert_eq!(
            parse_record(7, &older).unwrap(),
            rec,
            "no version: version 1"
        );
        doc["version"] = RECORD_VERSION.into();
        assert_eq!(parse_record(7, &doc.to_string()).unwrap(), rec);
        doc["version"] = (RECORD_VERSION + 1).into();
        let e = parse_record(7, &doc.to_string()).unwrap_err();
        assert!(e.contains("later ftlblk"), "{e}");
        let e = parse_record(8, &older).unwrap_err();
        assert!(e.contains("names device 7, not 8"), "{e}");
    }

    #[test]
    fn record_round_trip_and_listing() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("FTLBLK_RUN_DIR", dir.path());
        let rec = sample(7);
        write_record(&rec).unwrap();
        assert_eq!(read_record(7).unwrap(), Some(rec.clone()));
        assert_eq!(read_record(8).unwrap(), None);
        std::fs::write(dir.path().join("junk.json"), "{").unwrap();
        assert_eq!(all_records(), vec![rec.clone()]);
        // A live other daemon's record is left; its own daemon's, or a dead one's, goes.
        let alive = |p: u32| move || p == 42;
        let of = |pid: u32, pid_start: u64| DeviceRecord {
            pid,
            pid_start,
            ..rec.clone()
        };
        assert!(another_daemons(&of(42, 0), (7, 0), alive(42)));
        assert!(!another_daemons(&of(42, 0), (42, 0), alive(42)));
        assert!(!another_daemons(&of(43, 0), (7, 0), alive(43)));
        // The pid reused: the record of a daemon started later under the same pid is
        // another daemon's; the same start time (or an older record without one) is ours.
        assert!(another_daemons(&of(42, 900), (42, 500), alive(42)));
        assert!(!another_daemons(&of(42, 500), (42, 500), alive(42)));
        assert!(!another_daemons(&of(42, 0), (42, 500), alive(42)));
        // The test process is no `ftlblk`: its record counts as a dead daemon's.
        // Kept: this process's record is not written again; a missing one is.
        assert!(!keep_record(&rec, (rec.pid, 0)).unwrap());
        remove_record(7);
        assert!(keep_record(&rec, (rec.pid, 0)).unwrap());
        assert_eq!(read_record(7).unwrap(), Some(rec.clone()));
        // The start guard: armed, it removes this process's record; disarmed, not.
        RecordGuard::new(7, rec.uuid.clone(), true).disarm();
        assert_eq!(read_record(7).unwrap(), Some(rec.clone()));
        drop(RecordGuard::new(7, rec.uuid.clone(), true));
        assert_eq!(read_record(7).unwrap(), None);
        write_record(&rec).unwrap();
        // A dead daemon's record of another backing stays (the kernel keeps its
        // device for `recover`); of the same backing it goes.
        assert!(!remove_record_of(7, rec.pid + 1, 0, "another-uuid"));
        assert_eq!(read_record(7).unwrap(), Some(rec.clone()));
        assert!(remove_record_of(7, rec.pid + 1, 0, &rec.uuid));
        assert_eq!(read_record(7).unwrap(), None);
        remove_record(7);
        assert_eq!(read_record(7).unwrap(), None);
        // A later build's record: refused by read_record, still whose it is for the
        // ownership checks, and listed.
        let mut doc = serde_json::to_value(&rec).unwrap();
        doc["version"] = (RECORD_VERSION + 1).into();
        std::fs::write(record_path(7), doc.to_string()).unwrap();
        assert!(read_record(7).is_err());
        assert_eq!(read_record_lenient(7).map(|r| r.pid), Some(rec.pid));
        assert!(all_records().iter().any(|r| r.id == 7));
        remove_record(7);
        std::env::remove_var("FTLBLK_RUN_DIR");
    }

    /// The control plane writes the record again when it is missing, unreadable or a
    /// dead daemon's (a write that failed at the start is retried), never over the record
    /// of another live daemon, and not at all when it already is this one.
    #[test]
    fn a_record_is_written_again_only_when_it_is_not_ours_or_another_live_daemons() {
        let rec = DeviceRecord {
            pid: 100,
            pid_start: 5,
            recoveries: 1,
            ..sample(3)
        };
        let own = (100, 5);
        let dead = |_: &DeviceRecord| false;
        let live = |_: &DeviceRecord| true;
        assert!(record_needs_writing(None, &rec, own, live));
        assert!(!record_needs_writing(Some(&rec), &rec, own, live));
        // The previous session's record (recover): its daemon is dead.
        let old = DeviceRecord {
            pid: 90,
            pid_start: 2,
            recoveries: 0,
            ..rec.clone()
        };
        assert!(record_needs_writing(Some(&old), &rec, own, dead));
        // Another live daemon's: the id is its device's now.
        assert!(!record_needs_writing(Some(&old), &rec, own, live));
        // Ours, but stale in a field (written by this process before a change): rewritten.
        let stale = DeviceRecord {
            socket: "/elsewhere".into(),
            ..rec.clone()
        };
        assert!(record_needs_writing(Some(&stale), &rec, own, live));
    }

    #[test]
    fn pid_checks() {
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX - 1));
        assert!(!process_alive(u32::MAX - 1, 0));
        assert_eq!(pid_start_time(u32::MAX - 1), None);
    }

    /// A pid names the daemon only with its start time: a process started at another
    /// time under the same pid is not it.
    #[test]
    fn a_pid_is_the_daemon_only_with_its_start_time() {
        let me = pid_start_time(std::process::id()).expect("our own start time");
        assert!(me > 0);
        assert_eq!(pid_start_time(std::process::id()), Some(me), "stable");
        // A child started later has a start time of its own, not before ours.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let theirs = pid_start_time(child.id()).expect("the child's start time");
        assert!(theirs >= me);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(same_start(me, Some(me)));
        assert!(
            !same_start(me, Some(me + 1)),
            "the pid reused by a later process"
        );
        assert!(!same_start(me, None), "no such process");
        assert!(
            same_start(0, Some(me + 1)),
            "a record of an older daemon: the pid decides"
        );
    }
}
