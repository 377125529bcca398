//! Trace parsing. Every format becomes a list of [`TraceOp`] in 4 KiB blocks.

use crate::Error;
use std::collections::HashMap;

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
}

/// Trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    FioIolog,
    Msr,
    Blkparse,
    Csv,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fio-iolog" => Ok(Format::FioIolog),
            "msr" => Ok(Format::Msr),
            "blkparse" => Ok(Format::Blkparse),
            "csv" => Ok(Format::Csv),
            o => Err(format!(
                "unknown trace format {o:?} (fio-iolog, msr, blkparse, csv)"
            )),
        }
    }
}

const BS: u64 = 4096;

fn blocks_of(offset: u64, len: u64) -> Option<(u64, u32)> {
    if len == 0 {
        return None;
    }
    let first = offset / BS;
    let end = offset.checked_add(len)?.div_ceil(BS);
    Some((first, u32::try_from(end - first).ok()?))
}

fn num(s: &str, what: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("{what} {s:?} is not a number"))
}

/// Parses `text` (named `file` in errors).
pub fn parse(text: &str, format: Format, file: &str) -> Result<Vec<TraceOp>, Error> {
    let mut ops = Vec::new();
    let mut blk_q_seen = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |msg: String| Error::Parse {
            file: file.to_string(),
            line: i + 1,
            msg,
        };
        let op = match format {
            Format::FioIolog => parse_fio(line).map_err(err)?,
            Format::Msr => parse_msr(line, i == 0).map_err(err)?,
            Format::Csv => parse_csv(line, i == 0).map_err(err)?,
            Format::Blkparse => {
                let (op, action) = parse_blkparse(line).map_err(err)?;
                // Count each request once: its Q (queued) event.
                if action == "Q" {
                    blk_q_seen = true;
                }
                op.filter(|_| action == "Q")
            }
        };
        ops.extend(op);
    }
    if format == Format::Blkparse && !blk_q_seen && !text.trim().is_empty() {
        return Err(Error::Parse {
            file: file.into(),
            line: 0,
            msg: "no Q (queue) events found in the blkparse output".into(),
        });
    }
    Ok(ops)
}

fn mk(kind: &str, offset: u64, len: u64) -> Option<TraceOp> {
    let (lba, blocks) = blocks_of(offset, len)?;
    match kind {
        "w" => Some(TraceOp::Write { lba, blocks }),
        "t" => Some(TraceOp::Trim { lba, blocks }),
        _ => Some(TraceOp::Read { lba, blocks }),
    }
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
        [o, l, ..] => Ok(mk(kind, num(o, "offset")?, num(l, "length")?)),
        _ => Err(format!("{action} without offset and length")),
    }
}

fn is_action(s: &str) -> bool {
    matches!(
        s,
        "write" | "read" | "trim" | "add" | "open" | "close" | "sync" | "datasync" | "wait"
    )
}

fn parse_msr(line: &str, first: bool) -> Result<Option<TraceOp>, String> {
    let f: Vec<&str> = line.split(',').collect();
    if f.len() < 6 {
        return Err(format!(
            "expected Timestamp,Hostname,DiskNumber,Type,Offset,Size[,ResponseTime], got {} fields",
            f.len()
        ));
    }
    if first && f[4].trim().parse::<u64>().is_err() {
        return Ok(None); // header
    }
    let kind = match f[3].trim().to_ascii_lowercase().as_str() {
        "write" => "w",
        "read" => "r",
        other => return Err(format!("unknown MSR request type {other:?}")),
    };
    Ok(mk(kind, num(f[4], "offset")?, num(f[5], "size")?))
}

fn parse_csv(line: &str, first: bool) -> Result<Option<TraceOp>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 3 {
        return Err(format!("expected op,offset,length, got {} fields", f.len()));
    }
    if first && f[1].parse::<u64>().is_err() {
        return Ok(None); // header
    }
    let kind = match f[0].to_ascii_lowercase().as_str() {
        "w" | "write" => "w",
        "r" | "read" => "r",
        "t" | "trim" | "d" | "discard" => "t",
        other => return Err(format!("unknown op {other:?} (write, read, trim)")),
    };
    Ok(mk(kind, num(f[1], "offset")?, num(f[2], "length")?))
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
    Ok((mk(kind, sector * 512, n * 512), action))
}

/// Maps trace LBAs densely into `[0, capacity)` when the trace's address space is larger
/// than the device: 1 MiB extents in first-seen order (keeping sequential runs
/// sequential), wrapping if even the touched extents do not fit.
pub fn remap_dense(ops: &mut [TraceOp], capacity: u64) {
    let max_end = ops
        .iter()
        .map(|o| o.range().0 + o.range().1 as u64)
        .max()
        .unwrap_or(0);
    if max_end <= capacity {
        return;
    }
    const EXT: u64 = 256;
    let extents = (capacity / EXT).max(1);
    let mut map: HashMap<u64, u64> = HashMap::new();
    for op in ops.iter_mut() {
        let (lba, blocks) = op.range();
        let ext = lba / EXT;
        let next = map.len() as u64;
        let dense = *map.entry(ext).or_insert(next % extents);
        let new_lba = dense * EXT + lba % EXT;
        let blocks = (blocks as u64).min(capacity - new_lba) as u32;
        *op = match *op {
            TraceOp::Write { .. } => TraceOp::Write {
                lba: new_lba,
                blocks,
            },
            TraceOp::Trim { .. } => TraceOp::Trim {
                lba: new_lba,
                blocks,
            },
            TraceOp::Read { .. } => TraceOp::Read {
                lba: new_lba,
                blocks,
            },
        };
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
        // Absurd sizes never panic.
        assert!(
            parse(&format!("w,{},{}\n", u64::MAX, u64::MAX), Format::Csv, "c")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn remap_keeps_everything_in_range() {
        let mut ops = vec![
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
        remap_dense(&mut ops, 1024);
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
}
