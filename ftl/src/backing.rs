//! Opening a real backing (file or block device) with its sled index: the production
//! composition of [`FileDevice`] and [`SledIndex`].
//!
//! Owns the production wiring (file device, sled index, staging file paths). Called by the
//! binary and the tools.

use crate::config::Config;
use crate::device::file::{FileDevice, OpenOptions};
use crate::engine::Ftl;
use crate::error::{Error, Result};
use crate::geometry::FormatOptions;
use crate::index::sled_store::SledIndex;
use crate::index::IndexStore;
use crate::lifecycle::OpenReport;
use crate::staging::{StagingArea, DEFAULT_SLOTS};
use crate::superblock::Superblock;
use std::io;
use std::path::{Path, PathBuf};

/// The FTL over a file or block device with a sled index.
pub type FileFtl = Ftl<FileDevice, SledIndex>;

/// Where the index of a block device lives when the user names none.
pub const BLOCK_INDEX_ROOT: &str = "/var/lib/ftlblk";

/// Where the index lives when the user names none: beside a file backing
/// (`<backing>.ftlidx`); for a block device under [`BLOCK_INDEX_ROOT`], named by the
/// device's whole path ([`block_index_name`]: `/dev/vg0/data` -> `dev-vg0-data.ftlidx`).
///
/// It was named by the basename alone, so `/dev/vg0/data` and `/dev/vg1/data` shared one
/// index: the second format was refused, and a `format --force` of one cleared the other's
/// map (found by review, 2026-11-29). An index of that earlier name is still used to
/// open a device that is formatted and has no index of the new name (recovery refuses
/// one of another backing by its uuid); a format takes the new name
/// ([`default_index_dir_for_format`]).
pub fn default_index_dir(backing: &Path) -> PathBuf {
    if !is_block_device(backing) {
        let mut p = backing.as_os_str().to_owned();
        p.push(".ftlidx");
        return PathBuf::from(p);
    }
    block_index_dir(Path::new(BLOCK_INDEX_ROOT), backing, || {
        holds_superblock(backing)
    })
}

/// Where a new format's index goes when the user names none: [`default_index_dir`], but
/// never an index of the earlier name (a `format --force` of `/dev/vg1/data` took
/// `data.ftlidx`, maybe `/dev/vg0/data`'s, and cleared it).
pub fn default_index_dir_for_format(backing: &Path) -> PathBuf {
    if is_block_device(backing) {
        Path::new(BLOCK_INDEX_ROOT).join(block_index_name(backing))
    } else {
        default_index_dir(backing)
    }
}

/// Whether `path` is a block device (a missing path is not).
fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false)
}

/// A block device's index under `root`: [`block_index_name`]'s directory; or, when that
/// does not exist, the earlier basename's (`<name>.ftlidx`) if it exists and `formatted()`
/// says the device holds an ftlblk format (the index's own uuid check then refuses one of
/// another device of that name with a clear error).
pub fn block_index_dir(root: &Path, backing: &Path, formatted: impl FnOnce() -> bool) -> PathBuf {
    let named = root.join(block_index_name(backing));
    if named.exists() {
        return named;
    }
    let legacy = backing
        .file_name()
        .map(|n| root.join(format!("{}.ftlidx", n.to_string_lossy())));
    match legacy {
        Some(legacy) if legacy.exists() && formatted() => legacy,
        _ => named,
    }
}

/// The index directory's name for a block device: its absolute path without the leading
/// `/`, each `/` written `-` and each `-` and `%` percent-encoded (`%2D`, `%25`), so two
/// paths never share a name: `/dev/mapper/vg0-data` -> `dev-mapper-vg0%2Ddata.ftlidx`.
pub fn block_index_name(backing: &Path) -> String {
    let abs = std::path::absolute(backing).unwrap_or_else(|_| backing.to_path_buf());
    let text = abs.to_string_lossy();
    let mut name = String::with_capacity(text.len() + 8);
    for c in text.trim_start_matches('/').chars() {
        match c {
            '%' => name.push_str("%25"),
            '-' => name.push_str("%2D"),
            '/' => name.push('-'),
            c => name.push(c),
        }
    }
    name.push_str(".ftlidx");
    name
}

/// Whether `path` holds an ftlblk superblock at its start (copy A; read with a plain
/// shared open, since another server may hold the device; any error reads as no).
fn holds_superblock(path: &Path) -> bool {
    use std::io::Read;
    let mut buf = vec![0u8; crate::device::BLOCK_SIZE];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
        && Superblock::decode(&buf).is_ok()
}

/// How long `open_device` keeps trying a held lock: a server that just exited may hold
/// it a moment longer (io_uring releases registered files asynchronously).
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens a backing exclusively; creates a sparse file of `create_size` bytes if missing.
pub fn open_device(path: &Path, create_size: Option<u64>) -> Result<FileDevice> {
    open_device_with(
        path,
        &OpenOptions {
            create_size,
            ..Default::default()
        },
    )
}

/// [`open_device`] for reading only, under a shared lock (`ftlblk check`: a read-only
/// image or snapshot failed the read-write open; found by review, 2026-11-29).
pub fn open_device_read_only(path: &Path) -> Result<FileDevice> {
    open_device_with(
        path,
        &OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
}

fn open_device_with(path: &Path, opts: &OpenOptions) -> Result<FileDevice> {
    let deadline = std::time::Instant::now() + LOCK_GRACE;
    loop {
        match FileDevice::open(path, opts) {
            Ok(d) => return Ok(d),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ResourceBusy
                ) =>
            {
                if std::time::Instant::now() >= deadline {
                    // EBUSY of O_EXCL on a block device: mounted, or claimed by anyone,
                    // said as the device said it (it was reported as another ftlblk
                    // server's lock; found by review, 2026-11-27).
                    return Err(if e.kind() == io::ErrorKind::ResourceBusy {
                        Error::Open {
                            path: path.to_path_buf(),
                            source: e,
                        }
                    } else {
                        Error::Busy(path.display().to_string())
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => {
                return Err(Error::Open {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        }
    }
}

fn open_index(dir: &Path) -> Result<SledIndex> {
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(|e| Error::Open {
                path: parent.to_path_buf(),
                source: e,
            })?;
        }
    }
    SledIndex::open(dir)
}

/// Formats a backing (creating a sparse file of `create_size` if it does not exist).
pub fn format_backing(
    path: &Path,
    index_dir: &Path,
    create_size: Option<u64>,
    opts: &FormatOptions,
    force: bool,
) -> Result<Superblock> {
    let dev = open_device(path, create_size)?;
    let opts = FormatOptions {
        discard_log: dev.is_block_device(),
        ..opts.clone()
    };
    let formatted = crate::lifecycle::formattable(&dev, &opts, force).and_then(|_| {
        // Only for a backing that can be formatted: a failed format left an index
        // directory that changed what the next `add` did.
        let index = open_index(index_dir)?;
        crate::lifecycle::format(&dev, &index, &opts, force)
    });
    if formatted.is_err() && dev.created() {
        // Removed while still locked: nobody else has it open.
        let _ = std::fs::remove_file(path);
    }
    formatted.map_err(|e| e.naming_index(index_dir, path))
}

/// Where an opened backing keeps its chunk buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagingPlace {
    /// Process memory: a `kill -9` loses writes not yet flushed (benchmarks, tools).
    Memory,
    /// `<dir>/<uuid>.stage`, shared-mapped: put `dir` on tmpfs (the server uses its run
    /// directory, `/run/ftlblk`). What a dead server staged there is replayed at the next
    /// open, so its completed writes survive; a clean close removes the file.
    Dir(PathBuf),
}

/// The staging file of the backing whose uuid (as [`Superblock::uuid_string`] prints it)
/// is `uuid`, under `dir`.
pub fn staging_file(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(format!("{uuid}.stage"))
}

/// Where the server keeps its staging files (its run directory): `$FTLBLK_RUN_DIR`, or
/// `/run/ftlblk` (tmpfs: gone after a power cut, kept after a `kill -9`).
pub fn default_staging_dir() -> PathBuf {
    std::env::var_os("FTLBLK_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

/// The server's default run directory.
pub const DEFAULT_RUN_DIR: &str = "/run/ftlblk";

/// Opens a formatted backing and its index for a tool (benchmark, info), recovering as
/// needed, with the chunk buffers in memory. If a server of this backing died and left
/// its staging file in [`default_staging_dir`], that file is replayed and used instead:
/// the writes it holds were completed, and opening without it would start a session
/// that makes them stale. [`Ftl::close`] removes it.
pub fn open_backing(path: &Path, index_dir: &Path, cfg: Config) -> Result<(FileFtl, OpenReport)> {
    open_backing_in(path, index_dir, cfg, &default_staging_dir())
}

/// [`open_backing`], looking for a dead server's staging file in `staging_dir`.
pub fn open_backing_in(
    path: &Path,
    index_dir: &Path,
    cfg: Config,
    staging_dir: &Path,
) -> Result<(FileFtl, OpenReport)> {
    let place = {
        let dev = open_device(path, None)?;
        // A look only: the open below repairs a damaged copy and reports it.
        let (sb, _) = crate::lifecycle::read_superblock_readonly(&dev)?;
        if staging_file(staging_dir, &sb.uuid_string()).exists() {
            StagingPlace::Dir(staging_dir.to_path_buf())
        } else {
            StagingPlace::Memory
        }
    };
    open_backing_staged(path, index_dir, cfg, &place)
}

/// Opens a formatted backing and its index with the chunk buffers at `place`, replaying
/// what a dead server left there.
pub fn open_backing_staged(
    path: &Path,
    index_dir: &Path,
    cfg: Config,
    place: &StagingPlace,
) -> Result<(FileFtl, OpenReport)> {
    let dev = open_device(path, None)?;
    // A look: the open below repairs a damaged copy once it found the index to be this
    // backing's, and reports it.
    let (sb, _) = crate::lifecycle::read_superblock_readonly(&dev)?;
    if !index_dir.exists() {
        return Err(Error::IndexMismatch {
            path: index_dir.display().to_string(),
            backing: path.display().to_string(),
            why: "the directory does not exist (give --index, or the index of this backing was removed)".into(),
        });
    }
    let index = open_index(index_dir).map_err(|e| e.naming_index(index_dir, path))?;
    // Opened only once the backing is locked: one server per staging file.
    let (staging, created_here) = match place {
        StagingPlace::Memory => (StagingArea::in_memory(DEFAULT_SLOTS)?, None),
        StagingPlace::Dir(dir) => {
            let file = staging_file(dir, &sb.uuid_string());
            let existed = file.exists();
            let area = StagingArea::open_file(&file, DEFAULT_SLOTS)?;
            (area, (!existed).then_some(file))
        }
    };
    // The backing stays claimed until a file made here is removed: another server
    // waiting for the backing would otherwise take the file for a dead server's and
    // stage in it, unlinked under it (found by review of the removal, 2026-11-29).
    let claim = created_here.as_ref().and_then(|_| dev.claim().ok());
    let opened = Ftl::open_staged(dev, index, cfg, staging);
    if opened.is_err() {
        // A file this call made holds nothing: a refused open does not leave 32 MiB of
        // it in the run directory (tmpfs, RAM; found by review, 2026-11-29). One a dead
        // server left is kept: its writes are replayed by the next open that succeeds.
        if let (Some(file), Some(_)) = (&created_here, &claim) {
            let _ = std::fs::remove_file(file);
        }
    }
    drop(claim);
    opened.map_err(|e| e.naming_index(index_dir, path))
}

/// The mark a rebuild keeps in its scratch index (`<index>.rebuild`) until the index is
/// complete: a leftover with it is a rebuild cut short, one without an index to keep.
const REBUILDING: &str = "ftlblk-rebuilding";

/// `path`, or `path-1`, `path-2`, ... : the first that does not exist.
fn unused_name(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    let mut n = 0u32;
    while p.exists() && n < 1000 {
        n += 1;
        p = PathBuf::from(format!("{}-{n}", path.display()));
    }
    p
}

/// Swaps the directories `a` and `b` in one step (`renameat2`, `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that live across the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What [`rebuild_backing_index`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RebuiltIndex {
    pub report: crate::rebuild::RebuildReport,
    /// Where the index that was replaced now is (`None`: there was none).
    pub old_index_moved_to: Option<PathBuf>,
}

/// Rebuilds the index of the backing at `path` from its log (`rebuild.rs`) into
/// `index_dir`. An index there that matches the backing is replaced only with `force`.
/// The new index is built beside it (`<index_dir>.rebuild`), then the two swap places in
/// one step and the old one is named `<index_dir>.old-<unix seconds>`, and the parent
/// directory is synced: an interrupted rebuild never leaves a half-built index, nor no
/// index, where the old one was (a leftover `.rebuild` holding a checkpoint is kept as
/// `.old-<seconds>-leftover` by the next run).
///
/// The map is built in slices of at most `memory` bytes of RAM
/// ([`crate::RebuildOptions::memory`]); with more than one, the records are sorted into
/// spill files in `<index_dir>.rebuild-spill` (about 32 bytes per block of the log),
/// removed when done.
pub fn rebuild_backing_index(
    path: &Path,
    index_dir: &Path,
    force: bool,
    memory: u64,
    progress: &mut dyn crate::rebuild::RebuildProgress,
) -> Result<RebuiltIndex> {
    let dev = open_device(path, None)?;
    let (sb, _) = crate::lifecycle::read_superblock_readonly(&dev)?;
    let exists = index_dir.exists();
    let mut old = None;
    if exists {
        // An index a running server holds is never moved from under it, and another
        // backing's is replaced only with --force: a mistyped --index (or the rebuild
        // the mismatch error suggests) moved another device's index aside, and that
        // device no longer opened (found by review, 2026-11-29).
        old = match SledIndex::open(index_dir) {
            Err(Error::Busy(_)) => {
                return Err(Error::Busy(format!(
                    "index {} is in use (a running server?): stop it before rebuilding",
                    index_dir.display()
                )))
            }
            old => old.ok(),
        };
        let owner = old.as_ref().and_then(|idx| {
            let v = idx.load_kind(crate::index::Key::CHECKPOINT).ok()?;
            let (_, rec) = v.into_iter().next()?;
            crate::records::CheckpointRecord::decode(&rec)
                .ok()
                .map(|c| c.uuid)
        });
        if !force {
            if owner.is_some_and(|u| u != sb.uuid) {
                return Err(Error::InvalidParameters(format!(
                    "index {} belongs to another backing (format {}), not this one ({}): give \
                     this backing's own index with --index, or --force to move that one aside \
                     and rebuild into its place",
                    index_dir.display(),
                    owner
                        .map(|u| crate::superblock::uuid_string(&u))
                        .unwrap_or_default(),
                    sb.uuid_string()
                )));
            }
            let usable = old
                .as_ref()
                .is_some_and(|idx| crate::recovery::load_index(idx, &sb, "index").is_ok());
            if usable {
                return Err(Error::InvalidParameters(format!(
                    "index {} matches the backing and loads: give --force to replace it with \
                     one rebuilt from the log (counters start again from zero; erase counts \
                     are kept)",
                    index_dir.display()
                )));
            }
        }
    }
    let name = index_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "index".into());
    let sibling = |suffix: String| index_dir.with_file_name(format!("{name}{suffix}"));
    let tmp = sibling(".rebuild".into());
    let io_err = |p: &Path| {
        let p = p.to_path_buf();
        move |e: io::Error| Error::Open { path: p, source: e }
    };
    let spill = sibling(".rebuild-spill".into());
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // A leftover `.rebuild` without the mark a rebuild keeps in it until it is done is
    // an index (an earlier run that died after the swap below left the index it
    // replaced there, maybe a damaged one, or one that died just before it its finished
    // rebuild): kept as an old index, not deleted. One with the mark is a rebuild cut
    // short.
    if tmp.exists() && !tmp.join(REBUILDING).exists() {
        let kept = unused_name(&sibling(format!(".old-{secs}-leftover")));
        std::fs::rename(&tmp, &kept).map_err(io_err(&tmp))?;
    }
    for leftover in [&tmp, &spill] {
        if leftover.exists() {
            std::fs::remove_dir_all(leftover).map_err(io_err(leftover))?;
        }
    }
    // The old index's wear history, if it can still be read (a sled database that
    // opens; records that do not decode count nothing).
    let wear = old.as_ref().and_then(|old| {
        crate::rebuild::erase_counts_read(old, sb.geometry.segment_count, &sb.uuid)
    });
    // Let go before the index is moved aside.
    drop(old);
    let wear_lost = wear.is_none();
    let wear = wear.unwrap_or_default();
    let report = {
        let idx = open_index(&tmp)?;
        let mark = tmp.join(REBUILDING);
        std::fs::write(&mark, b"").map_err(io_err(&mark))?;
        std::fs::File::open(&tmp)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&tmp))?;
        let opts = crate::RebuildOptions {
            batch: Config::default().checkpoint_page_batch,
            memory,
            spill_dir: Some(spill.clone()),
            wear,
            epoch_floor: crate::rebuild::clock_epoch_floor(),
        };
        let r = crate::rebuild::rebuild_with(&dev, &idx, &opts, progress);
        // The spill removed its own directory in it; the now empty one goes too.
        let _ = std::fs::remove_dir(&spill);
        let mut r = r?;
        if wear_lost {
            r.warnings.push(
                "no erase count could be read from the old index (none there, or it is \
                 unreadable or another backing's): every segment starts unworn, and wear \
                 levelling balances only the wear from here"
                    .into(),
            );
        }
        r
    };
    // Done: the mark goes before the rebuilt index moves into place.
    let mark = tmp.join(REBUILDING);
    std::fs::remove_file(&mark).map_err(io_err(&mark))?;
    std::fs::File::open(&tmp)
        .and_then(|d| d.sync_all())
        .map_err(io_err(&tmp))?;
    let mut moved = None;
    if exists {
        let old = unused_name(&sibling(format!(".old-{secs}")));
        // The new index and the old one swap places in one step, then the old one is
        // named: there is an index at the path at every instant. Moving the old one
        // aside first left none there until the second rename, and a death between the
        // two had the next run delete the finished rebuild and start again, its erase
        // counts lost with the old index's place (found by review, 2026-11-30). Where
        // the file system cannot exchange, the two renames.
        match exchange(&tmp, index_dir) {
            Ok(()) => {
                #[cfg(test)]
                if tests::STOP_AFTER_EXCHANGE.with(|s| s.replace(false)) {
                    return Err(Error::InvalidParameters("test: stopped".into()));
                }
                // The rebuilt index is in place: the old one keeps the scratch name if it
                // cannot be given its own (reported, not an error: the work is done).
                moved = Some(match std::fs::rename(&tmp, &old) {
                    Ok(()) => old.clone(),
                    Err(_) => tmp.clone(),
                });
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                std::fs::rename(index_dir, &old).map_err(io_err(index_dir))?;
                std::fs::rename(&tmp, index_dir).map_err(io_err(&tmp))?;
            }
            Err(e) => return Err(io_err(index_dir)(e)),
        }
        moved.get_or_insert(old);
    } else {
        std::fs::rename(&tmp, index_dir).map_err(io_err(&tmp))?;
    }
    // The renames are durable before the rebuild reports success.
    let parent = match index_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::File::open(&parent)
        .and_then(|d| d.sync_all())
        .map_err(io_err(&parent))?;
    Ok(RebuiltIndex {
        report,
        old_index_moved_to: moved,
    })
}

#[cfg(test)]
mod tests {
    thread_local! {
        /// Test hook: the next rebuild stops right after the two indexes swapped places.
        pub(super) static STOP_AFTER_EXCHANGE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A rebuild that dies after the new index took the old one's place leaves an index
    /// at the path, the rebuilt one (the old one moved aside first left none there until
    /// the second rename; found by review, 2026-11-30).
    #[test]
    fn a_rebuild_interrupted_between_its_renames_leaves_an_index_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let (b, idx) = (dir.path().join("b.img"), dir.path().join("b.img.ftlidx"));
        format_backing(&b, &idx, Some(64 << 20), &FormatOptions::default(), false).unwrap();
        let (sb, _) =
            crate::lifecycle::read_superblock_readonly(&open_device(&b, None).unwrap()).unwrap();
        let epoch_of = |p: &Path| {
            let i = SledIndex::open(p).unwrap();
            crate::recovery::load_index(&i, &sb, "index")
                .unwrap()
                .checkpoint
                .epoch
        };
        let before = epoch_of(&idx);
        STOP_AFTER_EXCHANGE.with(|s| s.set(true));
        let r = rebuild_backing_index(&b, &idx, true, 64 << 20, &mut |_: u32, _: u32| {});
        assert!(r.is_err(), "stopped");
        let rebuilt = epoch_of(&idx);
        assert!(
            rebuilt > before,
            "the rebuilt index is in place: {rebuilt} after {before}"
        );
        // The next rebuild goes through, and keeps the index the stopped one left in its
        // scratch place (the one it replaced) as an old index.
        rebuild_backing_index(&b, &idx, true, 64 << 20, &mut |_: u32, _: u32| {}).unwrap();
        epoch_of(&idx);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let kept: Vec<&String> = names.iter().filter(|n| n.ends_with("-leftover")).collect();
        assert_eq!(kept.len(), 1, "{names:?}");
        assert_eq!(
            epoch_of(&dir.path().join(kept[0])),
            before,
            "the replaced index"
        );
    }

    /// A rebuild cut short (its scratch index still marked) is removed by the next one,
    /// not kept as an old index; the old index goes to `.old-SECS`, or a free name next
    /// to it when that is taken.
    #[test]
    fn a_rebuild_cut_short_is_removed_and_old_names_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let (b, idx) = (dir.path().join("b.img"), dir.path().join("b.img.ftlidx"));
        format_backing(&b, &idx, Some(64 << 20), &FormatOptions::default(), false).unwrap();
        let cut = dir.path().join("b.img.ftlidx.rebuild");
        std::fs::create_dir(&cut).unwrap();
        std::fs::write(cut.join(REBUILDING), b"").unwrap();
        let first = rebuild_backing_index(&b, &idx, true, 64 << 20, &mut |_: u32, _: u32| {})
            .unwrap()
            .old_index_moved_to
            .unwrap();
        let second = rebuild_backing_index(&b, &idx, true, 64 << 20, &mut |_: u32, _: u32| {})
            .unwrap()
            .old_index_moved_to
            .unwrap();
        assert_ne!(first, second);
        assert!(first.exists() && second.exists());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with("-leftover") || n.ends_with(".rebuild")),
            "{names:?}"
        );
        assert!(
            !idx.join(REBUILDING).exists(),
            "the index in place carries no mark"
        );
    }

    /// An index a running server holds (here: held open by this test) is never moved
    /// from under it by a rebuild, even with --force (found by review, 2026-11-29: the
    /// lock error counted as an unusable index, and the live index was renamed).
    #[test]
    fn a_rebuild_refuses_an_index_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let (b, idx) = (dir.path().join("b.img"), dir.path().join("b.img.ftlidx"));
        format_backing(&b, &idx, Some(64 << 20), &FormatOptions::default(), false).unwrap();
        let held = SledIndex::open(&idx).unwrap();
        for force in [false, true] {
            let r = rebuild_backing_index(&b, &idx, force, 64 << 20, &mut |_: u32, _: u32| {});
            assert!(matches!(r, Err(Error::Busy(_))), "force {force}: {r:?}");
        }
        drop(held);
        let moved = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".old-")
            })
            .count();
        assert_eq!(moved, 0, "the index in use was moved aside");
    }
    use super::*;

    #[test]
    fn block_devices_of_one_basename_get_indexes_of_their_own() {
        let a = block_index_name(Path::new("/dev/vg0/data"));
        let b = block_index_name(Path::new("/dev/vg1/data"));
        assert_eq!(a, "dev-vg0-data.ftlidx");
        assert_eq!(b, "dev-vg1-data.ftlidx");
        // `-` and `/` never read alike, nor does an escape typed as a name.
        let dashed = block_index_name(Path::new("/dev/mapper/vg0-data"));
        let slashed = block_index_name(Path::new("/dev/mapper/vg0/data"));
        let typed = block_index_name(Path::new("/dev/mapper/vg0%2Ddata"));
        assert_eq!(dashed, "dev-mapper-vg0%2Ddata.ftlidx");
        assert_ne!(dashed, slashed);
        assert_ne!(dashed, typed);
    }

    #[test]
    fn an_index_of_the_earlier_name_is_used_only_for_a_formatted_device_without_a_new_one() {
        let root = tempfile::tempdir().unwrap();
        let dev = Path::new("/dev/vg0/data");
        let named = root.path().join("dev-vg0-data.ftlidx");
        let legacy = root.path().join("data.ftlidx");
        // Nothing yet: the new name.
        assert_eq!(block_index_dir(root.path(), dev, || true), named);
        // The earlier name exists: used for a formatted device (its own, or another's
        // of that basename that the index's uuid check refuses), not for a new format.
        std::fs::create_dir(&legacy).unwrap();
        assert_eq!(block_index_dir(root.path(), dev, || true), legacy);
        assert_eq!(block_index_dir(root.path(), dev, || false), named);
        // Once the new name exists it wins, formatted or not.
        std::fs::create_dir(&named).unwrap();
        assert_eq!(block_index_dir(root.path(), dev, || true), named);
        assert_eq!(block_index_dir(root.path(), dev, || false), named);
    }

    #[test]
    fn a_superblock_is_found_at_a_formatted_backings_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("b.img");
        assert!(!holds_superblock(&img), "a missing path");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(32 << 20))
            .unwrap();
        assert!(!holds_superblock(&img), "zeros");
        format_backing(
            &img,
            &dir.path().join("b.ftlidx"),
            None,
            &FormatOptions::default(),
            false,
        )
        .unwrap_or_else(|e| panic!("format: {e}"));
        assert!(holds_superblock(&img));
    }
}
