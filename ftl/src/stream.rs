//! Write streams: the identifiers every layer uses to separate data by lifetime.
//!
//! Owns nothing but names: [`StreamId`], the number of stream slots and the two streams
//! with a fixed role (TRIM records, the cleaner's default output). Anyone may use it.

/// Number of stream slots (user streams plus cleaner streams).
pub const STREAMS: usize = 8;

/// Identifies a write stream (0 .. [`STREAMS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamId(pub u8);

/// Stream that TRIM records are logged in.
pub const TRIM_STREAM: StreamId = StreamId(0);

/// Stream the cleaner relocates into by default (GC output is cold); relocations into
/// other streams fall back to it when only one free segment is left.
pub const GC_STREAM: StreamId = StreamId(7);
