//! Trace parsing. Every format becomes a list of [`TraceOp`] in 4 KiB blocks.
//!
//! Owns the line parsers of each [`Format`], the volume filter of multi-volume cloud traces
//! (Alibaba, Tencent CBS, MSR Cambridge), reading plain or gzip files ([`read_file`]), and
//! the two ways a trace's address space is fitted to a device: [`remap_dense`] (1 MiB
//! extents into a given capacity) and [`remap_working_set`] (block by block onto the
//! trace's working set, for `--capacity wss`). Called by the `ftlblk replay` command and
//! the replay tests.

use crate::Error;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// One request of a trace, in 4 KiB blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOp {
    Write { lba: u64, blocks: u32 },
    Trim { lba: u64, blocks: u32 },
    Read { lba: u64, blocks: u32 },
}

impl TraceOp {
    pub fn range(&self) -> (u64, u32) {
        match *self {
            TraceOp::Write { lba, blocks }
            | TraceOp::Trim { lba, blocks }
            | TraceOp::Read { lba, blocks } => (lba, blocks),
        }
    }

    /// The same kind of request over another range.
    pub fn with_range(&self, lba: u64, blocks: u32) -> TraceOp {
        match self {
            TraceOp::Write { .. } => TraceOp::Write { lba, blocks },
            TraceOp::Trim { .. } => TraceOp::Trim { lba, blocks },
            TraceOp::Read { .. } => TraceOp::Read { lba, blocks },
        }
    }
}

/// Trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    FioIolog,
    /// MSR Cambridge: `Timestamp,Hostname,DiskNumber,Type,Offset,Size[,ResponseTime]`,
    /// bytes; the volume is `Hostname_DiskNumber`.
    Msr,
    Blkparse,
    Csv,
    /// Alibaba cloud block traces: `device_id,opcode,offset,length,timestamp`, opcode `R`
    /// or `W`, offset and length in bytes; the volume is `device_id`.
    Alibaba,
    /// Tencent CBS: `timestamp,offset,size,io_type,volume_id`, offset and size in 512-byte
    /// sectors, io_type 0 read and 1 write; the volume is `volume_id`.
    Tencent,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fio-iolog" => Ok(Format::FioIolog),
            "msr" => Ok(Format::Msr),
            "blkparse" => Ok(Format::Blkparse),
            "csv" => Ok(Format::Csv),
            "alibaba" => Ok(Format::Alibaba),
            "tencent" => Ok(Format::Tencent),
            o => Err(format!(
                "unknown trace format {o:?} (fio-iolog, msr, blkparse, csv, alibaba, tencent)"
            )),
        }
    }
}

const BS: u64 = 4096;

/// The largest read or write a trace line may hold: 1 GiB (Linux splits them far below;
/// a discard can be larger, 4 GiB from mkfs or fstrim, and is not limited).
pub const MAX_REQUEST_BLOCKS: u32 = 1 << 18;

/// The blocks `[offset, offset + len)` touches: `Ok(None)` for an empty request, an error
/// for one whose end or block count does not fit (a damaged line: it was skipped as if
/// empty, past the size check meant to catch it; found by review, 2026-11-29).
fn blocks_of(offset: u64, len: u64) -> Result<Option<(u64, u32)>, String> {
    if len == 0 {
        return Ok(None);
    }
    let out_of_range = || format!("offset {offset} + length {len} is out of range");
    let first = offset / BS;
    let end = offset
        .checked_add(len)
        .ok_or_else(out_of_range)?
        .div_ceil(BS);
    let blocks = u32::try_from(end - first).map_err(|_| out_of_range())?;
    Ok(Some((first, blocks)))
}

/// `n` 512-byte sectors in bytes; an error naming `what` when that does not fit.
fn sectors_to_bytes(n: u64, what: &str) -> Result<u64, String> {
    n.checked_mul(512)
        .ok_or_else(|| format!("{what} {n} is out of range"))
}

fn num(s: &str, what: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("{what} {s:?} is not a number"))
}

/// Parses `text` (named `file` in errors), which must hold one volume.
pub fn parse(text: &str, format: Format, file: &str) -> Result<Vec<TraceOp>, Error> {
    parse_reader(text.as_bytes(), format, file, None)
}

/// Reads the trace at `path`, gzip-compressed if its name ends in `.gz`.
pub fn read_file(path: &Path, format: Format, volume: Option<&str>) -> Result<Vec<TraceOp>, Error> {
    let name = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| Error::Io(name.clone(), e))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let gz = flate2::read::MultiGzDecoder::new(f);
        parse_reader(std::io::BufReader::new(gz), format, &name, volume)
    } else {
        parse_reader(std::io::BufReader::new(f), format, &name, volume)
    }
}

/// Blocks written per volume, to name the busiest ones in an error.
#[derive(Default)]
struct Volumes {
    index: HashMap<String, usize>,
    written: Vec<(String, u64)>,
}

impl Volumes {
    fn note(&mut self, volume: &str, op: &TraceOp) {
        let i = match self.index.get(volume) {
            Some(&i) => i,
            None => {
                self.index.insert(volume.to_string(), self.written.len());
                self.written.push((volume.to_string(), 0));
                self.written.len() - 1
            }
        };
        if let TraceOp::Write { blocks, .. } = op {
            self.written[i].1 += *blocks as u64;
        }
    }

    /// The busiest volumes first, as `id (size written)`.
    fn busiest(&self) -> String {
        let mut v = self.written.clone();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let shown: Vec<String> = v
            .iter()
            .take(8)
            .map(|(id, b)| format!("{id} ({} MiB written)", (b * BS) >> 20))
            .collect();
        let more = if v.len() > 8 { ", ..." } else { "" };
        format!("{}{more}", shown.join(", "))
    }
}

/// Parses a trace line by line. `volume` keeps only that volume's requests (formats with
/// volumes); without it a trace holding several volumes is an error naming them, since
/// their addresses overlap.
pub fn parse_reader<R: BufRead>(
    reader: R,
    format: Format,
    file: &str,
    volume: Option<&str>,
) -> Result<Vec<TraceOp>, Error> {
    if volume.is_some() && !matches!(format, Format::Alibaba | Format::Tencent | Format::Msr) {
        return Err(Error::Trace {
            file: file.into(),
            msg: format!("--volume applies to alibaba, tencent and msr traces, not {format:?}"),
        });
    }
    let mut ops = Vec::new();
    let mut blk_q_seen = false;
    let mut volumes = Volumes::default();
    let mut any = false;
    for (i, raw) in reader.lines().enumerate() {
        let raw = raw.map_err(|e| Error::Io(format!("{file}:{}", i + 1), e))?;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // A header is recognised on the first line that is not blank or a comment, not
        // only on the file's first line (found by review, 2026-11-29): one whose op is no
        // op and whose offset is no number (a data line with one of them damaged is an
        // error, not a header skipped in silence).
        let first = !any;
        any = true;
        let err = |msg: String| Error::Parse {
            file: file.to_string(),
            line: i + 1,
            msg,
        };
        let (vol, op) = match format {
            Format::FioIolog => (None, parse_fio(line).map_err(err)?),
            Format::Msr => split_volume(parse_msr(line, first).map_err(err)?),
            Format::Csv => (None, parse_csv(line, first).map_err(err)?),
            Format::Alibaba => split_volume(parse_alibaba(line, first).map_err(err)?),
            Format::Tencent => split_volume(parse_tencent(line, first).map_err(err)?),
            Format::Blkparse => {
                let (op, action) = parse_blkparse(line).map_err(err)?;
                // Count each request once: its Q (queued) event.
                if action == "Q" {
                    blk_q_seen = true;
                }
                (None, op.filter(|_| action == "Q"))
            }
        };
        let Some(op) = op else { continue };
        if op.range().1 > MAX_REQUEST_BLOCKS && !matches!(op, TraceOp::Trim { .. }) {
            // One damaged line would have the working-set remap number billions of
            // blocks (found by review, 2026-11-27).
            return Err(err(format!(
                "a request of {} MiB: larger than any block request (at most {} MiB)",
                (op.range().1 as u64 * BS) >> 20,
                (MAX_REQUEST_BLOCKS as u64 * BS) >> 20
            )));
        }
        if let Some(v) = vol {
            volumes.note(&v, &op);
            if volume.is_some_and(|want| want != v) {
                continue;
            }
            // Without --volume, a second volume is an error at the end: only the counts
            // it names are kept from here (a cloud trace of many volumes was read whole
            // into memory first; found by review, 2026-11-27).
            if volume.is_none() && volumes.written.len() > 1 {
                continue;
            }
        }
        ops.push(op);
    }
    if format == Format::Blkparse && !blk_q_seen && any {
        return Err(Error::Parse {
            file: file.into(),
            line: 0,
            msg: "no Q (queue) events found in the blkparse output".into(),
        });
    }
    match volume {
        Some(want) if !volumes.index.contains_key(want) => Err(Error::Trace {
            file: file.into(),
            msg: format!(
                "no volume {want:?} in the trace; it holds {}",
                volumes.busiest()
            ),
        }),
        None if volumes.written.len() > 1 => Err(Error::Trace {
            file: file.into(),
            msg: format!(
                "the trace holds {} volumes, whose addresses overlap: choose one with --volume \
                 (busiest first: {})",
                volumes.written.len(),
                volumes.busiest()
            ),
        }),
        _ => Ok(ops),
    }
}

fn split_volume(p: Option<(Cow<'_, str>, TraceOp)>) -> (Option<Cow<'_, str>>, Option<TraceOp>) {
    match p {
        Some((v, op)) => (Some(v), Some(op)),
        None => (None, None),
    }
}

fn mk(kind: &str, offset: u64, len: u64) -> Result<Option<TraceOp>, String> {
    let Some((mut lba, mut blocks)) = blocks_of(offset, len)? else {
        return Ok(None);
    };
    if kind == "t" {
        // A discard frees only the blocks it covers whole: rounded inwards (outwards it
        // unmapped data a partial discard never touched, and the replay counted fewer
        // live blocks; found by review, 2026-11-29). Nothing whole: nothing freed.
        let first = offset.div_ceil(BS);
        let end = (offset + len) / BS; // fits: blocks_of checked the sum
        if end <= first {
            return Ok(None);
        }
        (lba, blocks) = (first, (end - first) as u32);
    }
    Ok(Some(match kind {
        "w" => TraceOp::Write { lba, blocks },
        "t" => TraceOp::Trim { lba, blocks },
        _ => TraceOp::Read { lba, blocks },
    }))
}

fn parse_fio(line: &str) -> Result<Option<TraceOp>, String> {
    if line.starts_with("fio version") {
        return Ok(None);
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    // v2: file action [offset len]; v3: time file action [offset len].
    let (action, rest) = if f.len() >= 3 && f[0].parse::<u64>().is_ok() && is_action(f[2]) {
        (f[2], &f[3..])
    } else if f.len() >= 2 {
        (f[1], &f[2..])
    } else {
        return Err(format!(
            "expected 'file action [offset length]', got {line:?}"
        ));
    };
    let kind = match action {
        "write" => "w",
        "read" => "r",
        "trim" => "t",
        "add" | "open" | "close" | "sync" | "datasync" | "wait" => return Ok(None),
        other => return Err(format!("unknown fio iolog action {other:?}")),
    };
    match rest {
        [o, l, ..] => mk(kind, num(o, "offset")?, num(l, "length")?),
        _ => Err(format!("{action} without offset and length")),
    }
}

fn is_action(s: &str) -> bool {
    matches!(
        s,
        "write" | "read" | "trim" | "add" | "open" | "close" | "sync" | "datasync" | "wait"
    )
}

fn parse_msr(line: &str, first: bool) -> Result<Option<(Cow<'_, str>, TraceOp)>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 6 {
        return Err(format!(
            "expected Timestamp,Hostname,DiskNumber,Type,Offset,Size[,ResponseTime], got {} fields",
            f.len()
        ));
    }
    let kind = match f[3].to_ascii_lowercase().as_str() {
        "write" => "w",
        "read" => "r",
        _ if first && f[4].parse::<u64>().is_err() => return Ok(None), // header
        other => return Err(format!("unknown MSR request type {other:?}")),
    };
    // The volume is host and disk: "hm" and "0" become "hm_0", as the trace files are named.
    let volume = Cow::Owned(format!("{}_{}", f[1], f[2]));
    Ok(mk(kind, num(f[4], "offset")?, num(f[5], "size")?)?.map(|op| (volume, op)))
}

fn parse_alibaba(line: &str, first: bool) -> Result<Option<(Cow<'_, str>, TraceOp)>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 5 {
        return Err(format!(
            "expected device_id,opcode,offset,length,timestamp, got {} fields",
            f.len()
        ));
    }
    let kind = match f[1] {
        "W" | "w" => "w",
        "R" | "r" => "r",
        _ if first && f[2].parse::<u64>().is_err() => return Ok(None), // header
        other => return Err(format!("unknown Alibaba opcode {other:?} (R, W)")),
    };
    Ok(mk(kind, num(f[2], "offset")?, num(f[3], "length")?)?.map(|op| (Cow::Borrowed(f[0]), op)))
}

fn parse_tencent(line: &str, first: bool) -> Result<Option<(Cow<'_, str>, TraceOp)>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 5 {
        return Err(format!(
            "expected timestamp,offset,size,io_type,volume_id, got {} fields",
            f.len()
        ));
    }
    let kind = match f[3] {
        "1" => "w",
        "0" => "r",
        _ if first && f[1].parse::<u64>().is_err() => return Ok(None), // header
        other => {
            return Err(format!(
                "unknown Tencent io_type {other:?} (0 read, 1 write)"
            ))
        }
    };
    let sectors = |s: &str, what: &str| sectors_to_bytes(num(s, what)?, what);
    Ok(mk(kind, sectors(f[1], "offset")?, sectors(f[2], "size")?)?
        .map(|op| (Cow::Borrowed(f[4]), op)))
}

fn parse_csv(line: &str, first: bool) -> Result<Option<TraceOp>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 3 {
        return Err(format!("expected op,offset,length, got {} fields", f.len()));
    }
    let kind = match f[0].to_ascii_lowercase().as_str() {
        "w" | "write" => "w",
        "r" | "read" => "r",
        "t" | "trim" | "d" | "discard" => "t",
        _ if first && f[1].parse::<u64>().is_err() => return Ok(None), // header
        other => return Err(format!("unknown op {other:?} (write, read, trim)")),
    };
    mk(kind, num(f[1], "offset")?, num(f[2], "length")?)
}

fn parse_blkparse(line: &str) -> Result<(Option<TraceOp>, String), String> {
    // "8,0 3 1 0.000000000 697 Q WS 3417048 + 8 [kworker]"
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 7 || !f[0].contains(',') {
        // Summary lines at the end of blkparse output.
        return Ok((None, String::new()));
    }
    let action = f[5].to_string();
    let rwbs = f[6];
    if f.len() < 10 || f[8] != "+" {
        return Ok((None, action));
    }
    let sector = num(f[7], "sector")?;
    let n = num(f[9], "sector count")?;
    let kind = if rwbs.contains('D') {
        "t"
    } else if rwbs.contains('W') {
        "w"
    } else if rwbs.contains('R') {
        "r"
    } else {
        return Ok((None, action));
    };
    let op = mk(
        kind,
        sectors_to_bytes(sector, "sector")?,
        sectors_to_bytes(n, "sector count")?,
    )?;
    Ok((op, action))
}

/// Maps trace LBAs densely into `[0, capacity)` when the trace's address space is larger
/// than the device: 1 MiB extents in the order of their first write (keeping sequential
/// runs sequential), wrapping if even the written extents do not fit. Only written
/// extents take a place: reads and trims of extents never written are dropped, since they
/// neither place nor free anything (a read or an mkfs discard numbered first took a place
/// of its own and had two written extents share one; found by review, 2026-11-29). A
/// request is split at extent boundaries and each piece mapped by its own extent (pieces
/// landing next to each other stay one request): mapped by its first block only, a
/// request crossing a boundary spilled into another trace extent's place (found by
/// review, 2026-11-27). Returns the requests and how many written extents were folded
/// onto others (distinct data then shares blocks: the caller warns).
pub fn remap_dense(ops: Vec<TraceOp>, capacity: u64) -> (Vec<TraceOp>, u64) {
    let max_end = ops
        .iter()
        .map(|o| o.range().0 + o.range().1 as u64)
        .max()
        .unwrap_or(0);
    if max_end <= capacity || capacity == 0 {
        return (ops, 0);
    }
    let ext_blocks = 256u64.min(capacity);
    let extents = capacity / ext_blocks;
    let mut map: HashMap<u64, u64> = HashMap::new();
    for op in &ops {
        if let TraceOp::Write { lba, blocks } = *op {
            if blocks == 0 {
                continue;
            }
            for ext in lba / ext_blocks..=(lba + blocks as u64 - 1) / ext_blocks {
                let next = map.len() as u64;
                map.entry(ext).or_insert(next % extents);
            }
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        let (lba, blocks) = op.range();
        let end = lba + blocks as u64;
        let mut at = lba;
        let mut run: Option<(u64, u32)> = None;
        while at < end {
            let ext = at / ext_blocks;
            let piece_end = end.min((ext + 1) * ext_blocks);
            let n = (piece_end - at) as u32;
            let Some(&dense) = map.get(&ext) else {
                // Never written: nothing to read or free there.
                if let Some((l, b)) = run.take() {
                    out.push(op.with_range(l, b));
                }
                at = piece_end;
                continue;
            };
            let new_lba = dense * ext_blocks + at % ext_blocks;
            run = match run {
                Some((l, b)) if l + b as u64 == new_lba => Some((l, b + n)),
                Some((l, b)) => {
                    out.push(op.with_range(l, b));
                    Some((new_lba, n))
                }
                None => Some((new_lba, n)),
            };
            at = piece_end;
        }
        if let Some((l, b)) = run {
            out.push(op.with_range(l, b));
        }
    }
    let folded = (map.len() as u64).saturating_sub(extents);
    (out, folded)
}

/// A trace mapped onto its working set: see [`remap_working_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkingSet {
    /// The requests, over blocks `0 .. blocks`.
    pub ops: Vec<TraceOp>,
    /// Distinct blocks the trace writes.
    pub blocks: u64,
}

/// Maps every block the trace writes to a dense number, in the order of first writes, so
/// the trace fits a device sized from its working set (the distinct blocks written, as
/// the SepBIT and MiDAS evaluations size theirs). A request whose blocks were first
/// written together stays one request. Reads and trims of blocks never written are
/// dropped, since they neither place nor free anything; a request whose blocks map apart
/// becomes one request per contiguous run.
pub fn remap_working_set(ops: &[TraceOp]) -> WorkingSet {
    let mut map: HashMap<u64, u64> = HashMap::new();
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        let (lba, blocks) = op.range();
        let mut run: Option<(u64, u32)> = None;
        for b in lba..lba + blocks as u64 {
            let dense = match op {
                TraceOp::Write { .. } => {
                    let next = map.len() as u64;
                    Some(*map.entry(b).or_insert(next))
                }
                _ => map.get(&b).copied(),
            };
            run = match (run, dense) {
                (Some((start, n)), Some(d)) if start + n as u64 == d => Some((start, n + 1)),
                (prev, d) => {
                    if let Some((start, n)) = prev {
                        out.push(op.with_range(start, n));
                    }
                    d.map(|d| (d, 1))
                }
            };
        }
        if let Some((start, n)) = run {
            out.push(op.with_range(start, n));
        }
    }
    WorkingSet {
        ops: out,
        blocks: map.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_iolog_v2_and_v3() {
        let t = "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 8192 4096\n/dev/x read 0 8192\n/dev/x trim 4096 4096\n/dev/x close\n";
        let ops = parse(t, Format::FioIolog, "t").unwrap();
        assert_eq!(
            ops,
            vec![
                TraceOp::Write { lba: 2, blocks: 1 },
                TraceOp::Read { lba: 0, blocks: 2 },
                TraceOp::Trim { lba: 1, blocks: 1 }
            ]
        );
        let v3 = "fio version 3 iolog\n0 /dev/x add\n10 /dev/x write 4096 8192\n";
        assert_eq!(
            parse(v3, Format::FioIolog, "t").unwrap(),
            vec![TraceOp::Write { lba: 1, blocks: 2 }]
        );
    }

    #[test]
    fn msr_csv_blkparse() {
        let msr = "128166372003061629,hm,0,Write,3216998400,4096,1331\n128166372003061630,hm,0,Read,0,512,1\n";
        assert_eq!(
            parse(msr, Format::Msr, "m").unwrap()[0],
            TraceOp::Write {
                lba: 785400,
                blocks: 1
            }
        );
        let csv = "op,offset,length\nw,0,16384\nt,4096,4096\n";
        assert_eq!(parse(csv, Format::Csv, "c").unwrap().len(), 2);
        let blk = "  8,0    3        1     0.000000000  697  Q  WS 16 + 8 [kworker]\n  8,0    3        2     0.000001000  697  C  WS 16 + 8 [0]\n  8,0 1 3 0.1 1 Q D 64 + 16 [x]\n";
        assert_eq!(
            parse(blk, Format::Blkparse, "b").unwrap(),
            vec![
                TraceOp::Write { lba: 2, blocks: 1 },
                TraceOp::Trim { lba: 8, blocks: 2 }
            ]
        );
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = parse("w,0,4096\nw,zero,4096\n", Format::Csv, "bad.csv").unwrap_err();
        assert!(e.to_string().starts_with("bad.csv:2:"), "{e}");
        let e = parse("1,h,0,Erase,0,4096,1\n", Format::Msr, "m").unwrap_err();
        assert!(e.to_string().contains(":1:"), "{e}");
        assert!(parse("/dev/x write 12\n", Format::FioIolog, "f").is_err());
        assert!(parse("x,1,2,3\n", Format::Csv, "c").is_err());
        // Absurd sizes never panic, and are errors, not skipped as empty: an end past
        // 2^64 bytes, a block count past 2^32 (16 TiB; it was dropped silently), sectors
        // past 2^64 bytes (blkparse multiplied unchecked: offset 0 in a release build).
        let e = parse(&format!("w,{},{}\n", u64::MAX, u64::MAX), Format::Csv, "c").unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        assert!(parse("w,0,17592186044416\n", Format::Csv, "c").is_err());
        let big = "8,0 0 1 0.0 1 Q W 36028797018963968 + 8 [x]\n";
        let e = parse(big, Format::Blkparse, "b").unwrap_err();
        assert!(e.to_string().contains("sector"), "{e}");
        let big = "8,0 0 1 0.0 1 Q W 8 + 36028797018963968 [x]\n";
        assert!(parse(big, Format::Blkparse, "b").is_err());
        // An empty request is still skipped.
        assert!(parse("w,4096,0\n", Format::Csv, "c").unwrap().is_empty());
    }

    #[test]
    fn remap_keeps_everything_in_range() {
        let ops = vec![
            TraceOp::Write {
                lba: 1 << 40,
                blocks: 8,
            },
            TraceOp::Write { lba: 5, blocks: 1 },
            TraceOp::Write {
                lba: (1 << 40) + 1,
                blocks: 1,
            },
        ];
        let (ops, folded) = remap_dense(ops, 1024);
        assert_eq!(folded, 0);
        assert_eq!(ops[0], TraceOp::Write { lba: 0, blocks: 8 });
        assert_eq!(
            ops[1],
            TraceOp::Write {
                lba: 256 + 5,
                blocks: 1
            }
        );
        assert_eq!(ops[2], TraceOp::Write { lba: 1, blocks: 1 });
    }

    /// A request crossing a 1 MiB extent boundary: each piece goes where its own extent
    /// does, so block 256 of the trace has one place whichever request writes it.
    #[test]
    fn a_request_across_an_extent_boundary_is_mapped_piece_by_piece() {
        let w = |lba, blocks| TraceOp::Write { lba, blocks };
        let (ops, folded) = remap_dense(vec![w(255, 2), w(1 << 30, 1), w(256, 1)], 1024);
        assert_eq!(folded, 0);
        // Extents 0 and 1 are seen first (device 0 and 1), 1<<30's third: block 256 is
        // at 256 both times, and the first request stays whole.
        assert_eq!(ops, vec![w(255, 2), w(512, 1), w(256, 1)]);
        // Extent 1 seen first: the request's pieces land apart, and each is its own.
        let (ops, _) = remap_dense(vec![w(256, 1), w(1 << 30, 1), w(255, 2)], 1024);
        assert_eq!(ops, vec![w(0, 1), w(256, 1), w(767, 1), w(0, 1)]);
        // More extents than the device holds: folded, and said so.
        let many: Vec<TraceOp> = (0..6u64).map(|e| w(e << 30, 1)).collect();
        assert_eq!(remap_dense(many, 1024).1, 2);
        // A device smaller than one extent.
        let (small, _) = remap_dense(vec![w(1 << 20, 4)], 100);
        assert!(small
            .iter()
            .all(|o| o.range().0 + o.range().1 as u64 <= 100));
    }

    /// Only written extents take a place: a read (or an mkfs discard) numbered first had
    /// two written extents share one place, and the replay counted an overwrite that the
    /// trace never made.
    #[test]
    fn reads_and_trims_of_unwritten_extents_take_no_place() {
        let w = |lba, blocks| TraceOp::Write { lba, blocks };
        let r = |lba, blocks| TraceOp::Read { lba, blocks };
        let (ops, folded) = remap_dense(vec![w(0, 1), r(256, 1), w(512, 1)], 512);
        assert_eq!(folded, 0);
        assert_eq!(ops, vec![w(0, 1), w(256, 1)]);
        // A discard of the whole space first, then two writes: both keep a place, and the
        // discard keeps only the written extents' pieces.
        let (ops, folded) = remap_dense(
            vec![
                TraceOp::Trim {
                    lba: 0,
                    blocks: 4096,
                },
                w(3000, 1),
                r(1 << 20, 8),
                w(256, 2),
                r(3000, 1),
            ],
            512,
        );
        assert_eq!(folded, 0);
        assert_eq!(
            ops,
            vec![
                TraceOp::Trim {
                    lba: 256,
                    blocks: 256
                },
                TraceOp::Trim {
                    lba: 0,
                    blocks: 256
                },
                w(3000 % 256, 1),
                w(256, 2),
                r(3000 % 256, 1),
            ]
        );
    }

    /// A header after comment lines (or a blank first line) is still a header.
    #[test]
    fn a_header_after_comments_is_a_header() {
        let ops = parse(
            "\n# recorded 2026\nop,offset,length\nw,0,4096\n",
            Format::Csv,
            "c",
        )
        .unwrap();
        assert_eq!(ops, vec![TraceOp::Write { lba: 0, blocks: 1 }]);
        // The second line of data is never a header.
        assert!(parse("w,0,4096\nop,offset,length\n", Format::Csv, "c").is_err());
    }

    /// A first line with a damaged number and a valid op is data with an error, not a
    /// header skipped in silence (found by review, 2026-11-29); a header names its
    /// columns in the op's place.
    #[test]
    fn a_damaged_first_line_is_an_error_not_a_header() {
        let cases = [
            (Format::Csv, "w,-4096,4096\nw,0,4096\n"),
            (Format::Alibaba, "3,W,-1,4096,1\n3,W,0,4096,2\n"),
            (Format::Tencent, "1,x,8,1,7\n2,0,8,1,7\n"),
            (
                Format::Msr,
                "1,hm,0,Write,-5,4096,1\n2,hm,0,Write,0,4096,1\n",
            ),
        ];
        for (format, text) in cases {
            match parse(text, format, "c") {
                Err(e) => assert!(e.to_string().contains("c:1:"), "{format:?}: {e}"),
                Ok(ops) => panic!("{format:?}: parsed {ops:?}"),
            }
        }
        let headers = [
            (Format::Alibaba, "device_id,opcode,offset,length,timestamp\n3,W,0,4096,1\n"),
            (Format::Tencent, "timestamp,offset,size,io_type,volume_id\n1,0,8,1,7\n"),
            (
                Format::Msr,
                "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n1,hm,0,Write,0,4096,1\n",
            ),
        ];
        for (format, text) in headers {
            assert_eq!(parse(text, format, "c").unwrap().len(), 1, "{format:?}");
        }
    }

    /// A discard covers only the blocks it holds whole (it was rounded outwards, and
    /// unmapped data no discard touched).
    #[test]
    fn a_partial_block_discard_frees_only_whole_blocks() {
        assert_eq!(parse("t,512,512\n", Format::Csv, "c").unwrap(), vec![]);
        assert_eq!(
            parse("t,2048,12288\n", Format::Csv, "c").unwrap(),
            vec![TraceOp::Trim { lba: 1, blocks: 2 }]
        );
        // Writes still round outwards: they touch every block they reach.
        assert_eq!(
            parse("w,2048,4096\n", Format::Csv, "c").unwrap(),
            vec![TraceOp::Write { lba: 0, blocks: 2 }]
        );
    }

    #[test]
    fn a_large_discard_is_a_trim_not_an_error() {
        let ops = parse(
            "8,0 0 1 0.0 1 Q D 0 + 8388608 [mkfs]\n",
            Format::Blkparse,
            "b",
        )
        .unwrap();
        assert_eq!(
            ops,
            vec![TraceOp::Trim {
                lba: 0,
                blocks: 1 << 20
            }]
        );
    }

    #[test]
    fn a_line_with_a_request_past_any_block_size_is_an_error() {
        let ali = "device_id,opcode,offset,length,timestamp\n\
                   3,W,0,17592186040320,1577808000000056\n";
        let e = parse_reader(ali.as_bytes(), Format::Alibaba, "a", None).unwrap_err();
        assert!(
            e.to_string().contains("larger than any block request"),
            "{e}"
        );
    }

    /// Without --volume, a trace of several volumes fails, naming them (that the second
    /// volume's requests are no longer kept on the way is not visible from here).
    #[test]
    fn a_trace_of_two_volumes_without_volume_is_an_error() {
        let mut t = String::from("device_id,opcode,offset,length,timestamp\n");
        t.push_str("1,W,0,4096,1\n");
        for i in 0..1000 {
            t.push_str(&format!("2,W,{},4096,{}\n", i * 4096, i + 2));
        }
        let e = parse_reader(t.as_bytes(), Format::Alibaba, "a", None).unwrap_err();
        assert!(e.to_string().contains("holds 2 volumes"), "{e}");
    }

    #[test]
    fn alibaba_and_tencent_keep_the_chosen_volume() {
        let ali = "device_id,opcode,offset,length,timestamp\n\
                   3,W,8192,8192,1577808000000056\n\
                   7,W,0,4096,1577808000000060\n\
                   3,R,0,512,1577808000000070\n";
        let ops = parse_reader(ali.as_bytes(), Format::Alibaba, "a", Some("3")).unwrap();
        assert_eq!(
            ops,
            vec![
                TraceOp::Write { lba: 2, blocks: 2 },
                TraceOp::Read { lba: 0, blocks: 1 }
            ]
        );
        // Two volumes and no choice: an error that names them, busiest first.
        let e = parse(ali, Format::Alibaba, "a").unwrap_err().to_string();
        assert!(e.contains("2 volumes") && e.contains("--volume"), "{e}");
        assert!(e.find("3 (").unwrap() < e.find("7 (").unwrap(), "{e}");
        // A volume the trace lacks.
        let e = parse_reader(ali.as_bytes(), Format::Alibaba, "a", Some("9")).unwrap_err();
        assert!(e.to_string().contains("no volume \"9\""), "{e}");
        assert!(parse("1,D,0,4096,1\n", Format::Alibaba, "a").is_err());

        // Tencent: sectors, io_type 1 = write, the volume last.
        let ten = "1538323200,16,8,1,1283\n1538323200,0,16,0,1283\n1538323201,0,8,1,900\n";
        let ops = parse_reader(ten.as_bytes(), Format::Tencent, "t", Some("1283")).unwrap();
        assert_eq!(
            ops,
            vec![
                TraceOp::Write { lba: 2, blocks: 1 },
                TraceOp::Read { lba: 0, blocks: 2 }
            ]
        );
        assert!(parse("1,0,8,2,5\n", Format::Tencent, "t").is_err());
        // MSR volumes are host_disk; one-volume files need no --volume.
        let msr = "1,hm,0,Write,0,4096,1\n2,hm,1,Write,0,4096,1\n";
        assert_eq!(
            parse_reader(msr.as_bytes(), Format::Msr, "m", Some("hm_1"))
                .unwrap()
                .len(),
            1
        );
        assert!(parse(msr, Format::Msr, "m").is_err());
        // --volume on a format without volumes is refused, not ignored.
        assert!(parse_reader("w,0,4096\n".as_bytes(), Format::Csv, "c", Some("1")).is_err());
    }

    #[test]
    fn gzip_files_are_read() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv.gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::default(),
        );
        gz.write_all(b"0,W,0,65536,1\n0,W,4096,4096,2\n").unwrap();
        gz.finish().unwrap();
        let ops = read_file(&path, Format::Alibaba, None).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0], TraceOp::Write { lba: 0, blocks: 16 });
        let e = read_file(&dir.path().join("missing"), Format::Alibaba, None).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn working_set_is_dense_and_keeps_first_writes_together() {
        let ops = vec![
            TraceOp::Write {
                lba: 1 << 30,
                blocks: 4,
            },
            TraceOp::Read { lba: 0, blocks: 8 }, // never written: dropped
            TraceOp::Write { lba: 7, blocks: 2 },
            // Straddles known and new blocks: the known ones keep their numbers.
            TraceOp::Write {
                lba: (1 << 30) + 2,
                blocks: 4,
            },
            TraceOp::Trim {
                lba: (1 << 30) + 3,
                blocks: 100,
            },
        ];
        let ws = remap_working_set(&ops);
        assert_eq!(ws.blocks, 8);
        assert_eq!(
            ws.ops,
            vec![
                TraceOp::Write { lba: 0, blocks: 4 },
                TraceOp::Write { lba: 4, blocks: 2 },
                TraceOp::Write { lba: 2, blocks: 2 },
                TraceOp::Write { lba: 6, blocks: 2 },
                TraceOp::Trim { lba: 3, blocks: 1 },
                TraceOp::Trim { lba: 6, blocks: 2 },
            ]
        );
        assert!(ws
            .ops
            .iter()
            .all(|o| o.range().0 + o.range().1 as u64 <= ws.blocks));
    }
}
