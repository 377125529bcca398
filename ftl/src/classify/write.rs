//! Classified writes: a write split by the classifier's stream for each block, the way
//! the ublk server and the benchmarks write; a large write (from
//! [`crate::frag::whole_write_blocks`] at the fragmentation level large reads show) stays
//! whole in the stream most of its blocks are classified into, so a file written in one
//! piece is read back in one piece. Called by the ublk server and the benchmarks; it only
//! combines [`Classifier::on_write`] with [`Ftl::write`] / [`Ftl::write_via`].

use super::Classifier;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::engine::Ftl;
use crate::error::Result;
use crate::index::IndexStore;
use crate::stream::StreamId;
use crate::writers::ChunkWriters;

/// Writes `data` at `lba`, each block into the stream the classifier picks for it (runs
/// of blocks with the same stream go in one call); FUA rides on the last call, whose
/// flush covers the earlier ones. With `writers`, chunks the write fills are written by
/// that pool ([`Ftl::write_via`]) instead of before this returns.
pub fn write_classified<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    classifier: &Classifier,
    writers: Option<&ChunkWriters>,
    lba: u64,
    data: &[u8],
    fua: bool,
) -> Result<()> {
    let n = data.len() / BLOCK_SIZE;
    if n == 0 {
        return Ok(());
    }
    classifier.observe_live(ftl.mapped_blocks());
    let write = |at: u64, d: &[u8], fua: bool, s: StreamId| match writers {
        Some(w) => ftl.write_via(at, d, fua, s, w),
        None => ftl.write(at, d, fua, s),
    };
    if n >= crate::frag::whole_write_blocks(ftl.frag_level()) {
        let mut votes = [0usize; crate::stream::STREAMS];
        for i in 0..n {
            let s = classifier.on_write(lba + i as u64);
            votes[s.0 as usize % votes.len()] += 1;
        }
        // The most common stream (ties: the lower one).
        let (best, _) = votes.iter().enumerate().fold(
            (0, 0),
            |(b, v), (s, &c)| if c > v { (s, c) } else { (b, v) },
        );
        return write(lba, data, fua, StreamId(best as u8));
    }
    let mut start = 0;
    let mut stream = classifier.on_write(lba);
    for i in 1..n {
        let s = classifier.on_write(lba + i as u64);
        if s != stream {
            write(
                lba + start as u64,
                &data[start * BLOCK_SIZE..i * BLOCK_SIZE],
                false,
                stream,
            )?;
            start = i;
            stream = s;
        }
    }
    write(lba + start as u64, &data[start * BLOCK_SIZE..], fua, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem::MemDevice;
    use crate::index::mem::MemIndex;
    use crate::{Config, FormatOptions};

    #[test]
    fn classified_writes_split_into_runs_and_read_back() {
        let (dev, idx) = (MemDevice::new(64 << 20), MemIndex::new());
        crate::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
        let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
        let c = Classifier::new(f.capacity_blocks());
        let block = |lba: u64, round: u8| vec![lba as u8 ^ round; BLOCK_SIZE];
        // Blocks 0..4 rewritten often (short lifetimes), 4..16 written once. (Classes
        // get streams of their own only after a plan, every half capacity of writes:
        // here every block still shares one stream.)
        let rounds = 4u8;
        for round in 0..rounds {
            let data: Vec<u8> = (0..4).flat_map(|l| block(l, round)).collect();
            write_classified(&f, &c, None, 0, &data, false).unwrap();
        }
        let data: Vec<u8> = (0..16).flat_map(|l| block(l, 9)).collect();
        write_classified(&f, &c, None, 0, &data, true).unwrap();
        let mut back = vec![0u8; 16 * BLOCK_SIZE];
        f.read(0, &mut back).unwrap();
        assert!(
            back == data,
            "a classified multi-stream write reads back wrong"
        );
        assert_eq!(
            f.stats().counters.user_blocks_written,
            4 * rounds as u64 + 16
        );
        write_classified(&f, &c, None, 3, &[], false).unwrap();
    }

    #[test]
    fn a_large_write_stays_in_one_stream_when_its_blocks_classify_apart() {
        let (dev, idx) = (MemDevice::new(64 << 20), MemIndex::new());
        crate::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
        let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
        let cap = f.capacity_blocks();
        let p = crate::classify::Params {
            period: 2048,
            activate_permille: 50,
            deactivate_permille: 20,
            ..crate::classify::Params::for_capacity(1 << 20)
        };
        let c = Classifier::with_params(cap, p);
        // 90% of the writes to the even blocks of 0..64, the rest spread over the cold
        // ones (odd blocks of 0..64 among them): once the plan has run, neighbours
        // classify into different streams.
        for lba in 0..cap {
            c.on_write(lba);
        }
        let mut x = 12345u64;
        for _ in 0..20 * cap {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lba = if x % 10 < 9 {
                x / 16 % 32 * 2
            } else {
                64 + x / 16 % (cap - 64)
            };
            c.on_write(lba);
        }
        assert!(
            c.plans() > 0 && c.active_classes() > 1,
            "no plan split the classes"
        );
        assert_ne!(c.on_write(0), c.on_write(1), "neighbours classify apart");
        let n = 32usize;
        let data: Vec<u8> = (0..n).flat_map(|i| vec![i as u8; BLOCK_SIZE]).collect();
        write_classified(&f, &c, None, 0, &data, false).unwrap();
        f.flush().unwrap();
        let frag = f.fragmentation(0, n as u64, n as u64).unwrap();
        assert!(
            frag.reads <= 2,
            "a 128 KiB write was split: {} backing reads to read it",
            frag.reads
        );
        let mut back = vec![0u8; n * BLOCK_SIZE];
        f.read(0, &mut back).unwrap();
        assert!(back == data);
    }

    #[test]
    fn the_scale_after_a_start_is_the_devices_mapped_blocks() {
        let (dev, idx) = (MemDevice::new(64 << 20), MemIndex::new());
        crate::format(&dev, &idx, &FormatOptions::default(), false).unwrap();
        let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
        // 300 blocks written before this server started (by another classifier).
        let before = vec![7u8; 300 * BLOCK_SIZE];
        f.write(0, &before, false, StreamId(3)).unwrap();
        // A new server's classifier: its first write sees the device as it is, not as
        // the one block it has seen written.
        let c = Classifier::new(f.capacity_blocks());
        write_classified(&f, &c, None, 1000, &[1u8; BLOCK_SIZE], false).unwrap();
        assert_eq!(c.scale(), 300);
        write_classified(&f, &c, None, 1001, &[1u8; BLOCK_SIZE], false).unwrap();
        assert_eq!(c.scale(), 301);
        f.trim(0, 100).unwrap();
        write_classified(&f, &c, None, 1002, &[1u8; BLOCK_SIZE], false).unwrap();
        assert_eq!(c.scale(), 202);
    }
}
