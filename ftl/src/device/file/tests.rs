//! Tests of the file device (real files in a scratch directory).

use super::*;
use std::os::unix::fs::MetadataExt;

const MIB: u64 = 1 << 20;

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ftl-filedev-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp")
}

fn create(path: &Path, size: u64) -> FileDevice {
    let opts = OpenOptions {
        create_size: Some(size),
        ..OpenOptions::default()
    };
    FileDevice::open(path, &opts).expect("open")
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A slice of `len` bytes that is deliberately *not* 4 KiB-aligned.
fn unaligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    storage.clear();
    storage.resize(len + BLOCK_SIZE + 1, 0);
    let start = (0..=BLOCK_SIZE)
        .find(|&s| (storage.as_ptr() as usize + s) % BLOCK_SIZE == 7)
        .expect("offset");
    &mut storage[start..start + len]
}

#[test]
fn open_reports_size_and_kind() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, 8 * MIB);
    assert_eq!(dev.size(), 8 * MIB);
    assert!(!dev.is_block_device());
    assert!(dev.is_direct(), "ext4 /var/tmp should accept O_DIRECT");
    assert!(dev.raw_fd().is_some());
    let d = dev.describe();
    assert_eq!(d, format!("file {} ({} bytes)", path.display(), 8 * MIB));
}

#[test]
fn size_rounds_down_to_block() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, 3 * 4096 + 1000);
    assert_eq!(dev.size(), 3 * 4096);
    assert!(dev.read_at(3 * 4096, &mut [0u8; 4096]).is_err());
    let mut buf = AlignedBuf::new(4096);
    dev.read_at(2 * 4096, &mut buf).expect("last whole block");
}

#[test]
fn missing_path_without_create_size_is_not_found() {
    let dir = scratch();
    let path = dir.path().join("nope");
    let err = FileDevice::open(&path, &OpenOptions::default()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains(&path.display().to_string()));
}

/// An open that created the file and then failed (a size the file system refuses)
/// removes it again: a 0-byte backing left behind was called too small by the next `add`.
#[test]
fn a_file_created_by_a_failed_open_is_removed() {
    let dir = scratch();
    let path = dir.path().join("huge");
    let opts = OpenOptions {
        create_size: Some(u64::MAX / 2),
        ..Default::default()
    };
    assert!(FileDevice::open(&path, &opts).is_err());
    assert!(!path.exists());
    assert!(create(&path, 4096).created());
}

type Hook = Box<dyn FnOnce(&Path)>;

std::thread_local! {
    /// Runs once on this thread right after an open created its file (before its lock).
    static AFTER_CREATE: std::cell::RefCell<Option<Hook>> = std::cell::RefCell::new(None);
}

std::thread_local! {
    /// The directories an open on this thread synced after creating its file.
    static SYNCED_DIRS: std::cell::RefCell<Vec<std::path::PathBuf>> = Default::default();
}

pub(super) fn synced_dir(dir: &Path) {
    SYNCED_DIRS.with(|d| d.borrow_mut().push(dir.to_path_buf()));
}

/// A new backing's name is durable: its directory is synced, and each directory created
/// for it with the one holding it (found by review, 2026-11-29: none was).
#[test]
fn a_created_backing_is_named_durably() {
    let dir = scratch();
    let path = dir.path().join("x/y/b.img");
    SYNCED_DIRS.with(|d| d.borrow_mut().clear());
    assert!(create(&path, MIB).created());
    let synced = SYNCED_DIRS.with(|d| d.borrow().clone());
    let want = [
        dir.path().join("x/y"),
        dir.path().join("x"),
        dir.path().to_path_buf(),
    ];
    assert_eq!(synced, want);
    // An existing file: nothing to name.
    SYNCED_DIRS.with(|d| d.borrow_mut().clear());
    assert!(!create(&path, MIB).created());
    assert!(SYNCED_DIRS.with(|d| d.borrow().is_empty()));
    // A relative path: its new top directory is named in `.` (the test runs where cargo
    // put it; the new directory is removed again).
    let top = format!("ftlblk-named-{}", std::process::id());
    let rel = Path::new(&top).join("y/b.img");
    SYNCED_DIRS.with(|d| d.borrow_mut().clear());
    let created = create(&rel, MIB).created();
    let synced = SYNCED_DIRS.with(|d| d.borrow().clone());
    let _ = std::fs::remove_dir_all(&top);
    assert!(created);
    assert_eq!(
        synced,
        [
            Path::new(&top).join("y"),
            Path::new(&top).to_path_buf(),
            Path::new(".").to_path_buf()
        ]
    );
}

pub(super) fn after_create(path: &Path) {
    if let Some(f) = AFTER_CREATE.with(|h| h.borrow_mut().take()) {
        f(path);
    }
}

/// Another opener that locked the file between its creation and this open's lock owns
/// it: the failed open leaves it (it removed it, and a concurrent `format` that won the
/// lock formatted a file with no name left; found by review, 2026-11-29).
#[test]
fn a_file_another_opener_locked_first_is_not_removed() {
    let dir = scratch();
    let path = dir.path().join("raced");
    let holder: std::rc::Rc<std::cell::RefCell<Option<std::fs::File>>> = Default::default();
    let h = holder.clone();
    AFTER_CREATE.with(|c| {
        *c.borrow_mut() = Some(Box::new(move |p: &Path| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .expect("the other opener opens the new file");
            lock_exclusive(&f, p).expect("the other opener locks it first");
            *h.borrow_mut() = Some(f);
        }))
    });
    let err = FileDevice::open(
        &path,
        &OpenOptions {
            create_size: Some(MIB),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    assert!(holder.borrow().is_some(), "the hook ran");
    assert!(path.exists(), "the other opener's file was removed");
}

#[test]
fn existing_file_is_opened_not_resized() {
    let dir = scratch();
    let path = dir.path().join("dev");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(64 * 1024))
        .expect("make file");
    let dev = create(&path, 8 * MIB);
    assert_eq!(dev.size(), 64 * 1024);
}

#[test]
fn round_trip_aligned_and_unaligned() {
    let dir = scratch();
    let dev = create(&dir.path().join("dev"), 4 * MIB);
    let bs = BLOCK_SIZE;
    let cases: &[(u64, usize)] = &[
        (0, bs),
        (4096, bs),
        (12288, 3 * bs),
        (MIB, 64 * bs),
        (4 * MIB - 4096, bs),
        (4 * MIB - 8 * 4096, 8 * bs),
    ];
    let mut store = Vec::new();
    let mut store2 = Vec::new();
    for (i, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(i as u64 + 1, len);
        // Write from an unaligned buffer on even cases, an aligned one on odd.
        if i % 2 == 0 {
            let src = unaligned(&mut store, len);
            assert!(!is_aligned(src));
            src.copy_from_slice(&data);
            dev.write_at(off, src).expect("write unaligned");
        } else {
            let mut src = AlignedBuf::new(len);
            src.copy_from_slice(&data);
            dev.write_at(off, &src).expect("write aligned");
        }
        // Read back both ways.
        let mut a = AlignedBuf::new(len);
        dev.read_at(off, &mut a).expect("read aligned");
        assert_eq!(&a[..], &data[..], "aligned read case {i}");
        let u = unaligned(&mut store2, len);
        dev.read_at(off, u).expect("read unaligned");
        assert_eq!(&u[..], &data[..], "unaligned read case {i}");
    }
    dev.sync().expect("sync");
    // Overwrite one block in the middle of an earlier extent and check its neighbours.
    let newer = pattern(99, bs);
    dev.write_at(MIB + 4096, &newer).expect("overwrite");
    let mut all = AlignedBuf::new(64 * bs);
    dev.read_at(MIB, &mut all).expect("read extent");
    let old = pattern(4, 64 * bs);
    assert_eq!(&all[..bs], &old[..bs]);
    assert_eq!(&all[bs..2 * bs], &newer[..]);
    assert_eq!(&all[2 * bs..], &old[2 * bs..]);
    // Empty accesses are no-ops.
    dev.read_at(0, &mut []).expect("empty read");
    dev.write_at(0, &[]).expect("empty write");
}

#[test]
fn data_survives_reopen() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let data = pattern(7, 2 * BLOCK_SIZE);
    {
        let dev = create(&path, MIB);
        dev.write_at(8192, &data).expect("write");
        dev.sync().expect("sync");
    }
    let dev = FileDevice::open(&path, &OpenOptions::default()).expect("reopen");
    let mut buf = vec![0u8; 2 * BLOCK_SIZE];
    dev.read_at(8192, &mut buf).expect("read");
    assert_eq!(buf, data);
}

#[test]
fn buffered_mode_works() {
    let dir = scratch();
    let opts = OpenOptions {
        create_size: Some(MIB),
        direct: false,
        ..OpenOptions::default()
    };
    let dev = FileDevice::open(&dir.path().join("dev"), &opts).expect("open");
    assert!(!dev.is_direct());
    let mut store = Vec::new();
    let src = unaligned(&mut store, 2 * BLOCK_SIZE);
    src.copy_from_slice(&pattern(3, 2 * BLOCK_SIZE));
    dev.write_at(4096, src).expect("write");
    dev.sync().expect("sync");
    let mut out = vec![0u8; 2 * BLOCK_SIZE];
    dev.read_at(4096, &mut out).expect("read");
    assert_eq!(out, pattern(3, 2 * BLOCK_SIZE));
}

#[test]
fn out_of_range_and_unaligned_are_rejected() {
    let dir = scratch();
    let dev = create(&dir.path().join("dev"), MIB);
    let mut buf = AlignedBuf::new(2 * BLOCK_SIZE);
    let inval = |r: io::Result<()>| {
        let e = r.expect_err("must fail");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    };
    inval(dev.read_at(1, &mut buf[..BLOCK_SIZE]));
    inval(dev.read_at(0, &mut buf[..100]));
    inval(dev.read_at(MIB, &mut buf[..BLOCK_SIZE]));
    inval(dev.read_at(MIB - 4096, &mut buf[..]));
    inval(dev.read_at(u64::MAX - 4095, &mut buf[..BLOCK_SIZE]));
    inval(dev.write_at(512, &buf[..BLOCK_SIZE]));
    inval(dev.write_at(0, &buf[..BLOCK_SIZE + 1]));
    inval(dev.write_at(MIB, &buf[..BLOCK_SIZE]));
    inval(dev.discard(100, 4096));
    inval(dev.discard(0, 4097));
    inval(dev.discard(MIB - 4096, 8192));
    inval(dev.discard(4096, u64::MAX - 4095));
    let (a, b) = buf.split_at_mut(BLOCK_SIZE);
    let mut reqs = [(0u64, a), (MIB, b)];
    inval(dev.read_many(&mut reqs));
}

#[test]
fn second_open_fails_while_first_alive() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let first = create(&path, MIB);
    let err = FileDevice::open(&path, &OpenOptions::default()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    let msg = err.to_string();
    assert!(msg.contains("already in use by another process"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    // Buffered opens are locked out too.
    let opts = OpenOptions {
        direct: false,
        ..OpenOptions::default()
    };
    assert_eq!(
        FileDevice::open(&path, &opts).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    drop(first);
    let second = FileDevice::open(&path, &OpenOptions::default()).expect("reopen after drop");
    assert_eq!(second.size(), MIB);
}

#[test]
fn discard_punches_hole_and_reads_zeros() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, 4 * MIB);
    let len = 2 * MIB as usize;
    let mut data = AlignedBuf::new(len);
    data.copy_from_slice(&pattern(11, len));
    dev.write_at(0, &data).expect("write");
    dev.sync().expect("sync");
    let before = std::fs::metadata(&path).expect("stat").blocks();
    assert!(before * 512 >= 2 * MIB, "blocks before: {before}");

    dev.discard(MIB / 2, MIB).expect("discard");
    let after = std::fs::metadata(&path).expect("stat").blocks();
    assert!(
        after * 512 <= before * 512 - MIB + 64 * 1024,
        "blocks before {before} after {after}"
    );
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 4 * MIB);

    let mut out = AlignedBuf::new(len);
    dev.read_at(0, &mut out).expect("read");
    let h = (MIB / 2) as usize;
    assert_eq!(&out[..h], &data[..h]);
    assert!(out[h..h + MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(&out[h + MIB as usize..], &data[h + MIB as usize..]);
    // Empty discard and discarding a hole are fine.
    dev.discard(0, 0).expect("empty discard");
    dev.discard(MIB / 2, 4096).expect("discard hole");
}

/// Blocks of request `i` in the many-request tests.
fn blocks_for(i: usize) -> usize {
    1 + i % 3
}

/// Offsets of `n` requests of [`blocks_for`] blocks, a free block between each two.
fn spaced_offsets(n: usize) -> Vec<u64> {
    let mut offsets = Vec::new();
    let mut off = 0u64;
    for i in 0..n {
        offsets.push(off);
        off += (blocks_for(i) * BLOCK_SIZE) as u64 + BLOCK_SIZE as u64; // leave a gap
    }
    assert!(off <= 4 * MIB);
    offsets
}

#[test]
fn write_many_writes_everything() {
    let dir = scratch();
    let dev = create(&dir.path().join("dev"), 4 * MIB);
    // 150 requests: more than two ring batches; mixed sizes, aligned and not.
    let n = 150usize;
    let offsets = spaced_offsets(n);
    let data: Vec<Vec<u8>> = (0..n)
        .map(|i| pattern(2000 + i as u64, blocks_for(i) * BLOCK_SIZE))
        .collect();
    let mut aligned: Vec<AlignedBuf> = Vec::new();
    let mut plain: Vec<Vec<u8>> = Vec::new();
    for (i, d) in data.iter().enumerate() {
        if i % 2 == 0 {
            let mut b = AlignedBuf::new(d.len());
            b.copy_from_slice(d);
            aligned.push(b);
        } else {
            // Sliced from 1: never 4 KiB-aligned.
            let mut v = vec![0u8; d.len() + 1];
            v[1..].copy_from_slice(d);
            plain.push(v);
        }
    }
    let (mut ai, mut pi) = (aligned.iter(), plain.iter());
    let mut reqs: Vec<(u64, &[u8])> = (0..n)
        .map(|i| {
            let b: &[u8] = if i % 2 == 0 {
                &ai.next().expect("a")[..]
            } else {
                &pi.next().expect("p")[1..]
            };
            (offsets[i], b)
        })
        .collect();
    reqs.reverse();
    reqs.push((0, &[][..]));
    dev.write_many(&reqs).expect("write_many");
    for i in 0..n {
        let mut back = AlignedBuf::new(data[i].len());
        dev.read_at(offsets[i], &mut back).expect("read");
        assert_eq!(&back[..], &data[i][..], "req {i}");
        // The gap after it is untouched.
        let mut gap = AlignedBuf::new(BLOCK_SIZE);
        dev.read_at(offsets[i] + data[i].len() as u64, &mut gap)
            .expect("read gap");
        assert!(gap.iter().all(|&x| x == 0), "gap after req {i}");
    }
    dev.write_many(&[]).expect("empty write_many");
    // A range past the end: an error (every range is checked before any is written).
    let one = AlignedBuf::new(BLOCK_SIZE);
    assert!(dev
        .write_many(&[(0, &one[..]), (4 * MIB, &one[..])])
        .is_err());
}

#[test]
fn read_many_reads_everything() {
    reads_everything(None);
}

/// At most `depth` reads in flight, the next submitted as each completes (the cleaner's
/// victim reads): the same results, whatever the depth against the ring's size, and the
/// ring never holds more than the depth.
#[test]
fn read_many_depth_reads_everything() {
    for depth in [1, 3, 8, 1000] {
        super::uring::MOST_IN_FLIGHT.with(|m| m.set(0));
        reads_everything(Some(depth));
        let most = super::uring::MOST_IN_FLIGHT.with(|m| m.get());
        assert_eq!(most, depth.min(RING_ENTRIES as usize), "depth {depth}");
    }
}

fn reads_everything(depth: Option<usize>) {
    let dir = scratch();
    let dev = create(&dir.path().join("dev"), 4 * MIB);
    // 150 requests: more than two ring batches; mixed sizes and alignment.
    let n = 150usize;
    let offsets = spaced_offsets(n);
    for (i, &off) in offsets.iter().enumerate() {
        let len = blocks_for(i) * BLOCK_SIZE;
        let mut src = AlignedBuf::new(len);
        src.copy_from_slice(&pattern(1000 + i as u64, len));
        dev.write_at(off, &src).expect("write");
    }

    let mut aligned: Vec<AlignedBuf> = Vec::new();
    let mut plain: Vec<Vec<u8>> = Vec::new();
    for i in 0..n {
        let len = blocks_for(i) * BLOCK_SIZE;
        if i % 2 == 0 {
            aligned.push(AlignedBuf::new(len));
        } else {
            // Vec of len+1, sliced from 1: never 4 KiB-aligned.
            plain.push(vec![0u8; len + 1]);
        }
    }
    {
        let mut a_it = aligned.iter_mut();
        let mut p_it = plain.iter_mut();
        let mut reqs: Vec<(u64, &mut [u8])> = Vec::new();
        // Submit in reverse order to make sure results land by request, not position.
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        for i in 0..n {
            if i % 2 == 0 {
                bufs.push(&mut a_it.next().expect("a")[..]);
            } else {
                bufs.push(&mut p_it.next().expect("p")[1..]);
            }
        }
        for (i, b) in bufs.into_iter().enumerate().rev() {
            reqs.push((offsets[i], b));
        }
        reqs.push((0, &mut [][..]));
        match depth {
            None => dev.read_many(&mut reqs).expect("read_many"),
            Some(d) => dev.read_many_depth(&mut reqs, d).expect("read_many_depth"),
        }
    }
    let (mut ai, mut pi) = (0, 0);
    for i in 0..n {
        let want = pattern(1000 + i as u64, blocks_for(i) * BLOCK_SIZE);
        if i % 2 == 0 {
            assert_eq!(&aligned[ai][..], &want[..], "req {i}");
            ai += 1;
        } else {
            assert_eq!(&plain[pi][1..], &want[..], "req {i}");
            pi += 1;
        }
    }
    dev.read_many(&mut []).expect("empty read_many");
}

#[test]
fn create_size_makes_sparse_file() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, 2 << 30);
    assert_eq!(dev.size(), 2 << 30);
    let meta = std::fs::metadata(&path).expect("stat");
    assert_eq!(meta.len(), 2 << 30);
    assert!(meta.blocks() <= 64, "st_blocks {}", meta.blocks());
    assert_eq!(
        dev.describe(),
        format!("file {} (2147483648 bytes)", path.display())
    );
    // A never-written block reads as zeros.
    let mut buf = AlignedBuf::new(BLOCK_SIZE);
    buf.fill(0xAA);
    dev.read_at(1 << 30, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn read_past_eof_fills_zeros() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, 64 * 1024);
    let mut data = AlignedBuf::new(64 * 1024);
    data.fill(0x5A);
    dev.write_at(0, &data).expect("write");
    // Someone shrinks the file behind the device's back.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(16 * 1024))
        .expect("truncate");
    // Straddling EOF: first block real, second past the end.
    let mut buf = AlignedBuf::new(2 * BLOCK_SIZE);
    buf.fill(0xFF);
    dev.read_at(12 * 1024, &mut buf)
        .expect("read straddling EOF");
    assert!(buf[..BLOCK_SIZE].iter().all(|&b| b == 0x5A));
    assert!(buf[BLOCK_SIZE..].iter().all(|&b| b == 0));
    // Entirely past EOF, unaligned buffer and read_many too.
    let mut v = vec![0xFFu8; BLOCK_SIZE + 1];
    dev.read_at(32 * 1024, &mut v[1..]).expect("read past EOF");
    assert!(v[1..].iter().all(|&b| b == 0));
    let mut w = vec![0xFFu8; BLOCK_SIZE];
    dev.read_many(&mut [(48 * 1024, &mut w[..])])
        .expect("read_many past EOF");
    assert!(w.iter().all(|&b| b == 0));
}

#[test]
fn io_errors_name_operation_and_offset() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let dev = create(&path, MIB);
    // A real I/O error is hard to provoke on a healthy disk, so run an op against an
    // invalid descriptor through the same machinery.
    let mut buf = AlignedBuf::new(BLOCK_SIZE);
    let mut ops = [Op::new(Kind::Read, -1, buf.as_mut_ptr(), BLOCK_SIZE, 8192)];
    let err = dev.run(&mut ops).expect_err("bad fd");
    let msg = err.to_string();
    assert!(msg.contains("read"), "{msg}");
    assert!(msg.contains("8192"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    let inner = err
        .get_ref()
        .and_then(|e| e.source())
        .and_then(|s| s.downcast_ref::<io::Error>())
        .and_then(|e| e.raw_os_error());
    assert_eq!(inner, Some(libc::EBADF));
    // The ring is still usable afterwards.
    dev.read_at(0, &mut buf).expect("read after error");
}

#[test]
fn concurrent_threads_use_their_own_rings() {
    let dir = scratch();
    let dev = std::sync::Arc::new(create(&dir.path().join("dev"), 8 * MIB));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                for i in 0..64u64 {
                    let off = (t * 256 + i * 4) * BLOCK_SIZE as u64;
                    let data = pattern(t * 1000 + i, 4 * BLOCK_SIZE);
                    dev.write_at(off, &data).expect("write");
                    let mut out = vec![0u8; 4 * BLOCK_SIZE];
                    dev.read_at(off, &mut out).expect("read");
                    assert_eq!(out, data);
                }
                dev.sync().expect("sync");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn one_ring_serves_several_devices() {
    let dir = scratch();
    let a = create(&dir.path().join("a"), MIB);
    let b = create(&dir.path().join("b"), MIB);
    let (da, db) = (pattern(1, BLOCK_SIZE), pattern(2, BLOCK_SIZE));
    a.write_at(0, &da).expect("write a");
    b.write_at(0, &db).expect("write b");
    let mut out = vec![0u8; BLOCK_SIZE];
    a.read_at(0, &mut out).expect("read a");
    assert_eq!(out, da);
    b.read_at(0, &mut out).expect("read b");
    assert_eq!(out, db);
}

#[test]
fn rejects_directories() {
    let dir = scratch();
    let err = FileDevice::open(dir.path(), &OpenOptions::default()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn ioctl_numbers_match_linux_headers() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        assert_eq!(super::sys::BLKGETSIZE64, 0x8008_1272);
        assert_eq!(super::sys::BLKDISCARD, 0x1277);
    }
}

/// The free bytes of `dev`'s file system.
fn free_bytes(dev: &FileDevice) -> u64 {
    let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: fstatvfs fills the struct from an open fd; read only on success.
    let r = unsafe { libc::fstatvfs(dev.file.as_raw_fd(), vfs.as_mut_ptr()) };
    assert_eq!(r, 0, "fstatvfs");
    // SAFETY: it succeeded.
    let vfs = unsafe { vfs.assume_init() };
    vfs.f_bavail * vfs.f_frsize
}

/// A sparse file larger than its file system's free space is reported (its writes past
/// that would fail with ENOSPC); one written whole, or with room for its holes, is not.
#[test]
fn a_sparse_file_past_its_file_systems_free_space_is_reported() {
    assert_eq!(holes_past_free(100, 40, 50), Some((60, 50)));
    assert_eq!(holes_past_free(100, 40, 60), None);
    assert_eq!(holes_past_free(100, 100, 0), None, "written whole");
    assert_eq!(
        holes_past_free(100, 120, 0),
        None,
        "more allocated than its length"
    );
    let dir = scratch();
    let small = create(&dir.path().join("small"), 4 * MIB);
    assert_eq!(small.host_space_short(), None, "4 MiB of holes fit");
    // 1 GiB more holes than this file system has free.
    let len = (free_bytes(&small) + (1 << 30)) / MIB * MIB;
    let big = create(&dir.path().join("big"), len);
    let (holes, free) = big
        .host_space_short()
        .expect("holes past the free space reported");
    assert!(holes > free && holes <= len, "{holes} {free}");
}

#[test]
fn a_missing_path_under_dev_is_not_created() {
    let path = PathBuf::from(format!("/dev/ftlblk-missing-{}", std::process::id()));
    let Err(e) = FileDevice::open(
        &path,
        &OpenOptions {
            create_size: Some(64 * MIB),
            ..OpenOptions::default()
        },
    ) else {
        panic!("a file was created under /dev");
    };
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("devtmpfs"), "{e}");
    assert!(!path.exists(), "a file was created in /dev");
    // Through a link to /dev too; a scratch directory is no device's place.
    let dir = scratch();
    std::os::unix::fs::symlink("/dev", dir.path().join("devlink")).unwrap();
    assert!(names_a_device(&dir.path().join("devlink").join("x")));
    assert!(!names_a_device(&dir.path().join("x")));
    assert!(!names_a_device(Path::new("/var/tmp/devices.img")));
}

#[test]
fn a_new_backing_gets_its_directory() {
    let dir = scratch();
    let path = dir.path().join("a/b/dev.img");
    let dev = create(&path, 8 * MIB);
    assert_eq!(dev.size(), 8 * MIB);
    assert!(path.is_file());
}

/// A read-only open (`ftlblk check`) reads, cannot write, creates nothing, shares its
/// lock with other readers and is refused beside a read-write opener (a server).
#[test]
fn a_read_only_open_reads_and_never_writes() {
    let dir = scratch();
    let path = dir.path().join("dev");
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    assert!(
        FileDevice::open(&path, &ro).is_err(),
        "a read-only open created it"
    );
    assert!(!path.exists());
    {
        let rw = create(&path, MIB);
        let mut b = AlignedBuf::new(4096);
        b.fill(7);
        rw.write_at(4096, &b).expect("write");
        rw.sync().expect("sync");
        assert!(
            FileDevice::open(&path, &ro).is_err(),
            "read-only beside a server"
        );
    }
    let a = FileDevice::open(&path, &ro).expect("read-only open");
    let b = FileDevice::open(&path, &ro).expect("a second reader shares the lock");
    let mut buf = AlignedBuf::new(4096);
    a.read_at(4096, &mut buf).expect("read");
    assert!(buf.iter().all(|&x| x == 7));
    assert!(b.write_at(0, &buf).is_err(), "a read-only device wrote");
    let rw = OpenOptions::default();
    assert!(
        FileDevice::open(&path, &rw).is_err(),
        "a server opened beside a check"
    );
}
