//! The ublk data path: device parameters and the per-queue request loop.
//!
//! Contract:
//! - The device exports the FTL's capacity with 4 KiB logical and physical blocks,
//!   advertises a volatile write cache and FUA, DISCARD and WRITE_ZEROES (both unmap: the
//!   range reads back as zeros).
//! - Each queue thread sets `PR_SET_IO_FLUSHER` itself (as does the daemon before it
//!   starts the FTL's threads, which inherit it), then runs one async task per tag
//!   on libublk's per-queue `smol` executor; every task owns a 4 KiB-aligned io buffer.
//! - READ locates every block in the FTL's map; map pages the cache misses (a map larger
//!   than `map_cache_bytes`) are first read from the index on an I/O worker
//!   ([`Ftl::prefetch_map`]; one evicted again before the READ locates its blocks is
//!   read on the queue thread). Buffered blocks are copied, unmapped ones
//!   zero-filled, device-resident ones read with the queue's io_uring straight into the
//!   io buffer (physically contiguous blocks in one read, at most [`spans_in_flight`]
//!   of a request's reads pending at once; the backing's fd is the ring's fixed file 1),
//!   then checked with [`Ftl::verify_block`]: `Ok(false)` (the block moved
//!   meanwhile) re-locates and re-reads it, an error fails the request with -EIO.
//! - WRITE calls [`Ftl::write`] (FUA honoured) with each block in the stream the online
//!   classifier ([`ftl::classify`]) picks by the block's expected lifetime (classes a
//!   factor 4 apart; the cleaner places relocations in the same classes), FLUSH
//!   [`Ftl::flush`], DISCARD and WRITE_ZEROES [`Ftl::trim`], each on an I/O worker
//!   ([`crate::offload`]): the queue thread only awaits the completion through its ring,
//!   never blocks on the FTL.
//! - Every request completes: success with the byte count (READ/WRITE) or 0, failure with
//!   a negative errno ([`ftl::Error::errno`] at this edge; -EINVAL for requests outside
//!   the device or not block aligned, -EOPNOTSUPP for unknown operations). A panic while
//!   handling a request is caught and completes the request with -EIO.
//!
//! Called by [`crate::daemon`]; uses [`crate::offload`].
//!
//! [`Ftl::verify_block`]: ftl::Ftl::verify_block
//! [`Ftl::prefetch_map`]: ftl::Ftl::prefetch_map
//! [`Ftl::write`]: ftl::Ftl::write
//! [`Ftl::flush`]: ftl::Ftl::flush
//! [`Ftl::trim`]: ftl::Ftl::trim

use crate::metrics::Live;
use crate::offload::{Lane, Offload, TagEvent};
use crate::output::{errln, RateLimited};
use ftl::backing::FileFtl;
use ftl::classify::Classifier;
use ftl::device::{ScratchBuf, BLOCK_SIZE};
use ftl::request::{decode, Request, SECTORS_PER_BLOCK, SECTOR_SHIFT};
use ftl::MapEntry;
use io_uring::{opcode, squeue, types};
use libublk::helpers::IoBuf;
use libublk::io::{BufDesc, UblkDev, UblkQueue};
use libublk::{sys, UblkError};
use smol::future::FutureExt;
use std::os::fd::RawFd;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;

/// Fixed-file index of the backing in every queue ring (0 is `/dev/ublkcN`).
const BACKING_FIXED_FILE: u32 = 1;

/// How often a backing read answered with EAGAIN/EINTR or a short count is resubmitted.
const IO_RETRIES: usize = 64;

/// Largest DISCARD / WRITE_ZEROES request (bytes): 1 GiB.
const MAX_DISCARD_BYTES: u64 = 1 << 30;

/// Control-device flags of every ftlblk device: a crashed daemon leaves the disk in place
/// (queued I/O waits) until `recover` re-attaches a new one, which re-issues what was in
/// flight (harmless for the FTL: a re-executed write rewrites the same data).
pub const CTRL_FLAGS: u64 = (sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64;

/// Device parameters for an FTL of `capacity_blocks` and io buffers of `io_buf_bytes`.
pub fn device_params(capacity_blocks: u64, io_buf_bytes: u32) -> sys::ublk_params {
    let dev_sectors = capacity_blocks * SECTORS_PER_BLOCK;
    let max_discard =
        (MAX_DISCARD_BYTES >> SECTOR_SHIFT).min(dev_sectors.max(SECTORS_PER_BLOCK)) as u32;
    let max_discard = max_discard / SECTORS_PER_BLOCK as u32 * SECTORS_PER_BLOCK as u32;
    sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs: sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA,
            logical_bs_shift: BLOCK_SIZE.trailing_zeros() as u8,
            physical_bs_shift: BLOCK_SIZE.trailing_zeros() as u8,
            io_opt_shift: BLOCK_SIZE.trailing_zeros() as u8,
            io_min_shift: BLOCK_SIZE.trailing_zeros() as u8,
            max_sectors: io_buf_bytes >> SECTOR_SHIFT,
            dev_sectors,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: BLOCK_SIZE as u32,
            max_discard_sectors: max_discard,
            max_write_zeroes_sectors: max_discard,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// libublk's target init: size, parameters, the backing as fixed file 1, ring depths.
pub fn init_target(dev: &mut UblkDev, ftl: &FileFtl, backing_fd: RawFd) -> Result<(), UblkError> {
    let capacity = ftl.capacity_blocks();
    let io_buf_bytes = dev.dev_info.max_io_buf_bytes;
    let depth = dev.dev_info.queue_depth;
    let tgt = &mut dev.tgt;
    tgt.dev_size = capacity * BLOCK_SIZE as u64;
    tgt.params = device_params(capacity, io_buf_bytes);
    let n = tgt.nr_fds as usize;
    if n != BACKING_FIXED_FILE as usize || n >= tgt.fds.len() {
        return Err(UblkError::OtherError(-libc::EINVAL));
    }
    tgt.fds[n] = backing_fd;
    tgt.nr_fds += 1;
    // One uring_cmd per tag plus its backing reads (a fragmented READ issues several).
    tgt.sq_depth = depth.saturating_mul(2);
    tgt.cq_depth = cq_depth(depth);
    Ok(())
}

/// Body of one queue thread (the `q_fn` of `run_target`): serves until the queue is down.
pub fn run_queue(
    qid: u16,
    dev: &UblkDev,
    ftl: Arc<FileFtl>,
    classifier: Arc<Classifier>,
    writers: Arc<ftl::ChunkWriters>,
    offload: Arc<Offload>,
    live: Arc<Live>,
) {
    set_io_flusher();
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            errln!("ftlblk: queue {qid}: cannot set up: {e:?}");
            return;
        }
    };
    let exe = Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let q = q.clone();
        let ctx = TagContext {
            ftl: ftl.clone(),
            classifier: classifier.clone(),
            writers: writers.clone(),
            offload: offload.clone(),
            live: live.clone(),
        };
        tasks.push(exe.spawn(async move {
            match serve_tag(&q, tag, &ctx).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => errln!("ftlblk: queue {qid} tag {tag}: {e:?}"),
            }
        }));
    }
    let ticker = exe.clone();
    let qq = q.clone();
    smol::block_on(exe.run(async move {
        let run_ops = || while ticker.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&qq, Some(20), run_ops, done).await {
            if !matches!(e, UblkError::QueueIsDown) {
                errln!("ftlblk: queue {qid}: event loop: {e:?}");
            }
        }
    }));
}

/// `prctl(PR_SET_IO_FLUSHER, 1)`: this thread serves block I/O, so memory reclaim must not
/// wait on it (libublk <= 0.4.7 cleared the flag instead of setting it). Threads this one
/// starts afterwards inherit the state: the daemon sets it before it opens the FTL, so
/// the chunk writers, I/O workers, cleaner and index threads, which do the backing I/O
/// the queues wait for, have it too (before, only the queue threads had it).
pub fn set_io_flusher() {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if r != 0 {
        errln!(
            "ftlblk: PR_SET_IO_FLUSHER failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// One tag's loop: fetch a request, handle it, commit the result and fetch the next.
/// What every tag task of a queue shares.
struct TagContext {
    ftl: Arc<FileFtl>,
    classifier: Arc<Classifier>,
    writers: Arc<ftl::ChunkWriters>,
    offload: Arc<Offload>,
    /// Where each request's latency is recorded.
    live: Arc<Live>,
}

async fn serve_tag(q: &UblkQueue<'_>, tag: u16, ctx: &TagContext) -> Result<(), UblkError> {
    let wake = TagEvent::new().map_err(UblkError::IOError)?;
    let mut buf = IoBuf::<u8>::new(q.dev.dev_info.max_io_buf_bytes as usize);
    fetched(
        q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
            .await?,
    )?;
    loop {
        let iod = *q.get_iod(tag);
        let started = std::time::Instant::now();
        let res = AssertUnwindSafe(handle(q, &iod, buf.as_mut_slice(), ctx, &wake))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                errln!("ftlblk: panic while handling {iod:?}; completing with -EIO");
                -libc::EIO
            });
        if let Some(op) = latency_op(iod.op_flags) {
            ctx.live.latencies.record(op, started.elapsed());
        }
        fetched(
            q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
                .await?,
        )?;
    }
}

/// The result of a FETCH or COMMIT_AND_FETCH command: libublk turns an abort into
/// `QueueIsDown` and passes every other result on. A negative one means the kernel
/// refused the command, and no request was fetched: the tag's loop went on with the
/// previous request's descriptor, committed it again, was refused again, and spun at
/// full CPU (found by review, 2026-11-27). The tag stops with the error instead.
fn fetched(res: i32) -> Result<(), UblkError> {
    if res < 0 {
        Err(UblkError::UringIOError(res))
    } else {
        Ok(())
    }
}

/// Handles one request; returns the ublk result (bytes or 0, or a negative errno).
async fn handle(
    q: &UblkQueue<'_>,
    iod: &sys::ublksrv_io_desc,
    buf: &mut [u8],
    ctx: &TagContext,
    wake: &TagEvent,
) -> i32 {
    let (ftl, offload) = (&ctx.ftl, &ctx.offload);
    let req = match decode(
        iod.op_flags,
        iod.start_sector,
        iod.nr_sectors,
        ftl.capacity_blocks(),
        buf.len(),
    ) {
        Ok(r) => r,
        Err(e) => return e.errno(),
    };
    let bytes = req.payload_bytes();
    match req {
        Request::Read { lba, blocks } => {
            // A map cache miss reads the index: on a worker, not on this thread, where it
            // held every other request of the queue (module doc). A page evicted again
            // before `plan_read` (other tags' misses in between, a small cache) is still
            // read there.
            if ftl.map_misses(lba, blocks) {
                let f = ftl.clone();
                let r = offload
                    .run(q, wake, Lane::Map, move || {
                        f.prefetch_map(lba, blocks)
                            .map_or_else(|e| read_failed(lba, e), |()| 0)
                    })
                    .await;
                if r < 0 {
                    return r;
                }
            }
            match read_blocks(q, ftl, lba, &mut buf[..bytes]).await {
                Ok(()) => bytes as i32,
                Err(e) => e,
            }
        }
        Request::Write { lba, fua, .. } => {
            let data = buf[..bytes].to_vec();
            let (f, c, w) = (ftl.clone(), ctx.classifier.clone(), ctx.writers.clone());
            offload
                .run(
                    q,
                    wake,
                    Lane::Data,
                    move || match ftl::classify::write_classified(&f, &c, Some(&w), lba, &data, fua)
                    {
                        Ok(()) => bytes as i32,
                        Err(e) => e.errno(),
                    },
                )
                .await
        }
        Request::Flush => {
            let f = ftl.clone();
            offload
                .run(q, wake, Lane::Flush, move || {
                    f.flush().map_or_else(|e| e.errno(), |()| 0)
                })
                .await
        }
        Request::Trim { lba, blocks, fua } => {
            let (f, c) = (ftl.clone(), ctx.classifier.clone());
            offload
                .run(q, wake, Lane::Data, move || trim(&f, &c, lba, blocks, fua))
                .await
        }
    }
}

/// A DISCARD or WRITE_ZEROES: the range unmapped (told to the classifier first); with
/// `fua`, durable before it completes. 0 or the negative errno.
fn trim(f: &FileFtl, c: &Classifier, lba: u64, blocks: u64, fua: bool) -> i32 {
    c.on_trim(lba, blocks);
    let done = f
        .trim(lba, blocks)
        .and_then(|()| if fua { f.flush() } else { Ok(()) });
    done.map_or_else(|e| e.errno(), |()| 0)
}

/// The latency histogram a request's opcode counts in (none for unknown opcodes).
fn latency_op(op_flags: u32) -> Option<crate::metrics::Op> {
    use crate::metrics::Op;
    match op_flags & 0xff {
        sys::UBLK_IO_OP_READ => Some(Op::Read),
        sys::UBLK_IO_OP_WRITE => Some(Op::Write),
        sys::UBLK_IO_OP_FLUSH => Some(Op::Flush),
        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => Some(Op::Discard),
        _ => None,
    }
}

fn read_sqe(buf: *mut u8, len: usize, offset: u64) -> squeue::Entry {
    opcode::Read::new(types::Fixed(BACKING_FIXED_FILE), buf, len as u32)
        .offset(offset)
        .build()
        .flags(squeue::Flags::FIXED_FILE)
}

/// Operations one queue thread may have pending at once: libublk 0.4 stamps each
/// pending future's slab key into bits 16..32 of its `user_data` as a `u32` shifted by
/// 16 (`uring_async.rs`), so key 65536 is stamped as key 0 and its completion wakes
/// another operation: a tag's COMMIT_AND_FETCH taken for a new request, or another
/// read's span taken as read before its data arrived, while the aliased one never
/// completes and its request hangs. Margin kept for the queue's own futures.
const QUEUE_KEYS: usize = (1 << 16) - 1024;
const _: () = assert!(QUEUE_KEYS < 1 << 16);
/// Futures a tag holds besides its READ's spans: its COMMIT_AND_FETCH and one wait for
/// an I/O worker (map prefetch before a READ; never both a wait and spans, counted anyway).
const TAG_OTHER_FUTURES: usize = 2;

/// Backing reads of one READ submitted at once on a queue of `depth` tags: every tag
/// reading at once keeps within [`QUEUE_KEYS`]. Found by review (2026-11-29): a READ
/// submitted every span at once, and a queue of 512 tags with 512 KiB buffers reading
/// a range scattered by random writes (up to 128 spans each) passed 65,536.
/// 502 at the default depth of 128 (a READ of the default 512 KiB buffer, 128 spans at
/// most, is never split), 13 at the largest (4096).
pub(crate) fn spans_in_flight(depth: u16) -> usize {
    (QUEUE_KEYS / (depth.max(1) as usize))
        .saturating_sub(TAG_OTHER_FUTURES)
        .max(1)
}

/// Completion entries of a queue's ring of `depth` tags: one for every future its tags
/// may have pending at once ([`spans_in_flight`] spans and [`TAG_OTHER_FUTURES`] each).
/// It was 4 x depth: past that the kernel keeps completions in an overflow list, one
/// atomic allocation each, and one that fails is dropped: the ring's next wait fails
/// (EBADR), the queue's loop ends and its requests hang, under the memory pressure a
/// block device serving writeback meets (found by review, 2026-11-29). About 64K entries
/// of 16 bytes: 1 MiB a queue.
pub(crate) fn cq_depth(depth: u16) -> u16 {
    let need = depth as usize * (spans_in_flight(depth) + TAG_OTHER_FUTURES);
    need.max(depth as usize * 4).min(u16::MAX as usize) as u16
}

/// Runs `submit` for each of `items`, at most `window` of its futures pending at once
/// (each window's futures created together, then awaited, before the next window's);
/// their results in the order of `items`.
async fn windowed<T, F: std::future::Future<Output = i32>>(
    items: &[T],
    window: usize,
    mut submit: impl FnMut(&T) -> F,
) -> Vec<i32> {
    let mut results = Vec::with_capacity(items.len());
    for part in items.chunks(window.max(1)) {
        let futures: Vec<F> = part.iter().map(&mut submit).collect();
        for f in futures {
            results.push(f.await);
        }
    }
    results
}

/// Reads `buf.len()` blocks at `lba` into `buf`.
async fn read_blocks(
    q: &UblkQueue<'_>,
    ftl: &FileFtl,
    lba: u64,
    buf: &mut [u8],
) -> Result<(), i32> {
    // Locating can fail too (a buffered block whose copy matched no entry, or one that
    // kept moving): logged like a failed device read.
    let dev_blocks = ftl.plan_read(lba, buf).map_err(|e| read_failed(lba, e))?;
    if dev_blocks.is_empty() {
        return Ok(());
    }
    // Submit the spans (at most `spans_in_flight` at once: every future pending on this
    // queue thread needs its own libublk key, and keys past 16 bits alias, above), then
    // wait for all of them before touching the buffer. A span holding other data
    // between its blocks (stale copies, a chunk's summary, a FLUSH's padding) is read
    // into a scratch buffer and its blocks copied out.
    let spans = ftl::ReadSpans::new(&dev_blocks, ftl::READ_SPAN_GAP_BLOCKS);
    let base = buf.as_mut_ptr();
    let mut scratch: Vec<(usize, ScratchBuf)> = Vec::new();
    let mut jobs: Vec<(ftl::ReadSpan<'_>, *mut u8)> = Vec::with_capacity(spans.len());
    for (k, s) in spans.iter().enumerate() {
        let target = match s.direct() {
            // SAFETY: idx + blocks <= n, so a direct span lies inside `buf`.
            Some(idx) => unsafe { base.add(idx * BLOCK_SIZE) },
            None => {
                // The allocation stays put when the buffer moves into `scratch`.
                let mut sc = ScratchBuf::take(s.len);
                let ptr = sc.as_mut_ptr();
                scratch.push((k, sc));
                ptr
            }
        };
        jobs.push((s, target));
    }
    let window = spans_in_flight(q.dev.dev_info.queue_depth);
    let results = windowed(&jobs, window, |(s, ptr)| {
        q.ublk_submit_sqe(read_sqe(*ptr, s.len, s.offset))
    })
    .await;
    for ((s, ptr), res) in jobs.iter().zip(results) {
        let done = match res {
            r if r >= 0 && r as usize >= s.len => continue,
            r if r > 0 => r as usize,
            r if r == -libc::EAGAIN || r == -libc::EINTR => 0,
            r => return Err(backing_error(r, s.offset, s.len)),
        };
        // SAFETY: `ptr` is the span's target (inside `buf` or its scratch buffer, both
        // alive and not otherwise borrowed here), `s.len` bytes long.
        let rest = unsafe { std::slice::from_raw_parts_mut(ptr.add(done), s.len - done) };
        read_exact(q, rest, s.offset + done as u64).await?;
    }
    for (k, sc) in &scratch {
        if let Some(s) = spans.get(*k) {
            s.copy_out(sc, buf);
        }
    }
    for b in &dev_blocks {
        let l = lba + b.idx as u64;
        let blk = &mut buf[b.idx * BLOCK_SIZE..(b.idx + 1) * BLOCK_SIZE];
        if !verify(ftl, l, b.entry, blk)? {
            reread_block(ftl, l, blk)?;
        }
    }
    ftl.note_read(lba, &dev_blocks, buf);
    Ok(())
}

/// [`ftl::Ftl::verify_block`] at the ublk edge: `Ok(false)` when the block moved meanwhile
/// (locate it again), a logged -EIO when its checksum is wrong.
fn verify(ftl: &FileFtl, lba: u64, entry: MapEntry, blk: &[u8]) -> Result<bool, i32> {
    ftl.verify_block(lba, entry, blk)
        .map_err(|e| read_failed(lba, e))
}

/// The log lines of failed reads: one per request at most, a failing backing fails every
/// request.
static READ_FAILURES: RateLimited = RateLimited::new();

/// Logs a failed read of block `lba` and gives its errno.
fn read_failed(lba: u64, e: ftl::Error) -> i32 {
    READ_FAILURES.log(|| format!("ftlblk: read of block {lba}: {e}"));
    e.errno()
}

/// Reads one block whose map entry moved during the read: the FTL's one retry path
/// ([`ftl::Ftl::reread_block`], up to [`ftl::READ_RETRIES`] attempts), a synchronous read
/// on this queue's thread (rare: only a block relocated or overwritten mid-read).
fn reread_block(ftl: &FileFtl, lba: u64, blk: &mut [u8]) -> Result<(), i32> {
    ftl.reread_block(lba, blk).map_err(|e| read_failed(lba, e))
}

/// Reads exactly `buf.len()` bytes at `offset` through the queue ring.
async fn read_exact(q: &UblkQueue<'_>, buf: &mut [u8], offset: u64) -> Result<(), i32> {
    let mut done = 0usize;
    let mut tries = 0;
    while done < buf.len() {
        tries += 1;
        if tries > IO_RETRIES {
            return Err(backing_error(-libc::EAGAIN, offset, buf.len()));
        }
        let rest = &mut buf[done..];
        let r = q
            .ublk_submit_sqe(read_sqe(
                rest.as_mut_ptr(),
                rest.len(),
                offset + done as u64,
            ))
            .await;
        match r {
            r if r > 0 => done += r as usize,
            r if r == -libc::EAGAIN || r == -libc::EINTR => {}
            0 => return Err(backing_error(0, offset + done as u64, rest.len())),
            r => return Err(backing_error(r, offset + done as u64, rest.len())),
        }
    }
    Ok(())
}

/// Logs a failed backing read and gives the errno the request completes with (-EIO).
fn backing_error(res: i32, offset: u64, len: usize) -> i32 {
    let what = if res == 0 {
        "end of file".to_string()
    } else {
        std::io::Error::from_raw_os_error(-res).to_string()
    };
    READ_FAILURES.log(|| format!("ftlblk: backing read of {len} bytes at {offset} failed: {what}"));
    -libc::EIO
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason for [`QUEUE_KEYS`]: libublk's future keys alias past 16 bits. If a
    /// libublk upgrade widens them this fails, and the limit can go.
    #[test]
    fn libublk_future_keys_alias_past_sixteen_bits() {
        let key = |f: &libublk::uring_async::UblkUringOpFuture| (f.user_data >> 16) & 0xffff_ffff;
        // Fresh thread: its slab of pending futures starts empty.
        std::thread::spawn(move || {
            let futures: Vec<_> = (0..=(1u32 << 16))
                .map(|_| libublk::uring_async::UblkUringOpFuture::new(0))
                .collect();
            assert_eq!(key(&futures[1]), 1);
            assert_eq!(
                key(&futures[1 << 16]),
                key(&futures[0]),
                "the 65,537th pending future takes the first one's key"
            );
        })
        .join()
        .expect("key thread");
    }

    #[test]
    fn every_tag_reading_at_once_keeps_within_the_queue_keys() {
        for depth in 1..=sys::UBLK_MAX_QUEUE_DEPTH as u16 {
            let w = spans_in_flight(depth);
            assert!(w >= 1, "depth {depth}");
            assert!(
                depth as usize * (w + TAG_OTHER_FUTURES) <= QUEUE_KEYS,
                "depth {depth}: {w} spans per tag"
            );
        }
        // Their completions fit the ring: none goes to the kernel's overflow list.
        for depth in 1..=sys::UBLK_MAX_QUEUE_DEPTH as u16 {
            let pending = depth as usize * (spans_in_flight(depth) + TAG_OTHER_FUTURES);
            assert!(pending <= cq_depth(depth) as usize, "depth {depth}");
        }
        // The defaults (depth 128, 512 KiB buffers): a READ is never split.
        assert!(spans_in_flight(128) >= (512 << 10) / BLOCK_SIZE);
        assert_eq!(spans_in_flight(4096), 13);
        // Before the limit, 512 tags of 128 spans each passed the keys.
        assert!(spans_in_flight(512) < 128);
    }

    /// A future pending once, counted in `pending` from its creation to its completion.
    struct Counted {
        pending: std::rc::Rc<std::cell::Cell<usize>>,
        polled: bool,
        value: i32,
    }

    impl std::future::Future for Counted {
        type Output = i32;
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<i32> {
            if !self.polled {
                self.polled = true;
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            self.pending.set(self.pending.get() - 1);
            std::task::Poll::Ready(self.value)
        }
    }

    #[test]
    fn windowed_keeps_at_most_a_window_pending_and_results_in_order() {
        let pending = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let most = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let items: Vec<i32> = (0..1000).collect();
        for window in [1, 13, 502, 5000] {
            most.set(0);
            let results = smol::block_on(windowed(&items, window, |&v| {
                pending.set(pending.get() + 1);
                most.set(most.get().max(pending.get()));
                Counted {
                    pending: pending.clone(),
                    polled: false,
                    value: v * 2,
                }
            }));
            assert_eq!(results, items.iter().map(|v| v * 2).collect::<Vec<_>>());
            assert_eq!(most.get(), window.min(items.len()), "window {window}");
            assert_eq!(pending.get(), 0);
        }
    }

    #[test]
    fn a_refused_fetch_stops_the_tag() {
        assert!(fetched(0).is_ok(), "a request fetched");
        assert!(matches!(
            fetched(-libc::EINVAL),
            Err(UblkError::UringIOError(e)) if e == -libc::EINVAL
        ));
        assert!(fetched(-libc::EBUSY).is_err());
    }

    const CAP: u64 = 1000;
    const BUF: usize = 512 << 10;

    #[test]
    fn request_codes_match_the_kernel_bindings() {
        use ftl::request as r;
        assert_eq!(r::OP_READ, sys::UBLK_IO_OP_READ);
        assert_eq!(r::OP_WRITE, sys::UBLK_IO_OP_WRITE);
        assert_eq!(r::OP_FLUSH, sys::UBLK_IO_OP_FLUSH);
        assert_eq!(r::OP_DISCARD, sys::UBLK_IO_OP_DISCARD);
        assert_eq!(r::OP_WRITE_ZEROES, sys::UBLK_IO_OP_WRITE_ZEROES);
        assert_eq!(r::F_FUA, sys::UBLK_IO_F_FUA);
        assert_eq!(
            decode(sys::UBLK_IO_OP_ZONE_OPEN, 0, 8, CAP, BUF).map_err(|e| e.errno()),
            Err(-libc::EOPNOTSUPP)
        );
    }

    /// A DISCARD / WRITE_ZEROES with FUA is durable when it completes: its record's
    /// chunk sealed and written (found by review, 2026-11-29: the flag was dropped, the
    /// record stayed in the open chunk until the next FLUSH).
    #[test]
    fn a_trim_with_fua_is_written_before_it_completes() {
        use ftl::backing::{format_backing, open_backing_in};
        let dir = tempfile::tempdir().unwrap();
        let (img, idx) = (dir.path().join("b.img"), dir.path().join("b.idx"));
        let opts = ftl::FormatOptions::default();
        format_backing(&img, &idx, Some(64 << 20), &opts, false).unwrap();
        let (f, _) =
            open_backing_in(&img, &idx, ftl::Config::default(), &dir.path().join("s")).unwrap();
        let c = Classifier::new(f.capacity_blocks());
        f.write(0, &vec![1u8; 16 * BLOCK_SIZE], false, ftl::StreamId(1))
            .unwrap();
        f.flush().unwrap();
        let sealed = || f.stats().counters.summary_blocks;
        let before = sealed();
        assert_eq!(trim(&f, &c, 0, 4, false), 0);
        assert_eq!(
            sealed(),
            before,
            "a trim without FUA waits in its open chunk"
        );
        assert_eq!(trim(&f, &c, 4, 4, true), 0);
        assert!(sealed() > before, "the trim's chunk was not sealed");
        assert_eq!(trim(&f, &c, 1 << 40, 1, true), -libc::EINVAL);
        f.close().unwrap();
    }

    #[test]
    fn params_advertise_4k_fua_discard() {
        let p = device_params(CAP, BUF as u32);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_eq!(p.basic.physical_bs_shift, 12);
        assert_eq!(p.basic.dev_sectors, CAP * 8);
        assert_eq!(p.basic.max_sectors, (BUF >> 9) as u32);
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_FUA, 0);
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_ne!(p.types & sys::UBLK_PARAM_TYPE_DISCARD, 0);
        assert_eq!(p.discard.discard_granularity, 4096);
        assert_eq!(p.discard.max_discard_segments, 1);
        assert_eq!(p.discard.max_discard_sectors, (CAP * 8) as u32);
        assert_eq!(p.discard.max_discard_sectors % 8, 0);
        let big = device_params(1 << 30, BUF as u32);
        assert_eq!(big.discard.max_discard_sectors, (1u32 << 30) >> 9);
    }
}
