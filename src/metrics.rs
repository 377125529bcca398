//! Operations metrics (issue 19): latency histograms of the requests the ublk edge
//! completes ([`Latencies`], one `hdrhistogram` per request kind), the WAF over the last
//! minute ([`WafWindow`]), and the OpenMetrics / Prometheus text exposition of a stats
//! document ([`render`], `prometheus-client`'s encoder).
//!
//! - Producers: the ublk queues record every request's latency ([`Latencies::record`]);
//!   the control plane samples the counters every second ([`WafWindow::sample`]) and puts
//!   both into the stats document it builds ([`crate::stats_doc`]).
//! - Consumers: the control plane serves [`render`] of a fresh document on
//!   `ftlblk add --metrics-listen ADDR` (one HTTP response per connection:
//!   [`http_response`]); `ftlblk stats --prometheus` renders the document it fetched from
//!   the stats socket, so both print the same exposition.

use crate::stats_doc::StatsDocument;
use hdrhistogram::Histogram;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The request kinds whose latency is kept, in [`LatencyFigures`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Discard];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        }
    }
}

/// Upper bounds (seconds) of the exposed histogram buckets; a last one is +Inf.
pub const BUCKETS_S: [f64; 17] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
    1.0, 2.5, 5.0, 10.0,
];

/// Largest latency kept exactly (a slower request counts as this): 100 s, in µs.
const MAX_US: u64 = 100_000_000;

/// Request latencies since the daemon started, one histogram (microseconds, 3
/// significant digits) per [`Op`]; shared by the queue threads.
#[derive(Debug)]
pub struct Latencies {
    h: [Mutex<Histogram<u64>>; 4],
}

impl Default for Latencies {
    fn default() -> Self {
        let new = || {
            Mutex::new(
                Histogram::new_with_bounds(1, MAX_US, 3)
                    .unwrap_or_else(|_| Histogram::new(3).expect("3 significant digits")),
            )
        };
        Latencies {
            h: [new(), new(), new(), new()],
        }
    }
}

impl Latencies {
    /// Counts one request of kind `op` that took `d`.
    pub fn record(&self, op: Op, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, MAX_US);
        let mut h = self.h[op as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        h.saturating_record(us);
    }

    /// The figures now.
    pub fn snapshot(&self) -> LatencyFigures {
        // A copy taken under the lock, the figures worked out after it: every queue
        // thread records into the same histogram before it completes a request, and a
        // scrape walking 18K counters under the lock held them all (found by review,
        // 2026-11-30).
        let one = |op: Op| {
            let h = self.h[op as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            OpLatency::of(&h)
        };
        LatencyFigures {
            read: one(Op::Read),
            write: one(Op::Write),
            flush: one(Op::Flush),
            discard: one(Op::Discard),
        }
    }
}

/// One request kind's latencies, as the stats document carries them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpLatency {
    pub count: u64,
    /// Sum of the latencies, microseconds.
    pub sum_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Requests per bucket of [`BUCKETS_S`] (not cumulative), then the ones above it.
    pub buckets: Vec<u64>,
}

impl OpLatency {
    fn of(h: &Histogram<u64>) -> Self {
        let mut buckets = vec![0u64; BUCKETS_S.len() + 1];
        let mut sum = 0u64;
        for v in h.iter_recorded() {
            let (us, n) = (v.value_iterated_to(), v.count_at_value());
            sum = sum.saturating_add(us.saturating_mul(n));
            let s = us as f64 / 1e6;
            let i = BUCKETS_S
                .iter()
                .position(|&b| s <= b)
                .unwrap_or(BUCKETS_S.len());
            buckets[i] += n;
        }
        OpLatency {
            count: h.len(),
            sum_us: sum,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            buckets,
        }
    }
}

/// Latencies of the four request kinds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencyFigures {
    pub read: OpLatency,
    pub write: OpLatency,
    pub flush: OpLatency,
    pub discard: OpLatency,
}

impl LatencyFigures {
    pub fn of(&self, op: Op) -> &OpLatency {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Discard => &self.discard,
        }
    }
}

/// What a running daemon measures beyond the FTL's own figures: shared by the ublk
/// queues (latencies) and the control plane (both, and the WAF window it samples).
#[derive(Debug, Default)]
pub struct Live {
    pub latencies: Latencies,
    pub waf: WafWindow,
    /// The FTL's lifetime counters when this daemon opened the device.
    pub at_open: Option<ftl::Counters>,
}

impl Live {
    /// The figures of a daemon that opened its FTL with these lifetime counters.
    pub fn opened_with(at_open: ftl::Counters) -> Self {
        Live {
            at_open: Some(at_open),
            ..Default::default()
        }
    }

    /// Adds these figures to a stats document.
    pub fn fill(&self, d: &mut StatsDocument) {
        d.latency = Some(self.latencies.snapshot());
        d.waf_last_minute = self.waf.last_minute();
        d.counters_at_open = self
            .at_open
            .as_ref()
            .and_then(|c| serde_json::from_value(serde_json::to_value(c).ok()?).ok());
    }
}

/// The counters' recent history, for the WAF over the last minute.
#[derive(Debug, Default)]
pub struct WafWindow {
    samples: Mutex<VecDeque<(Instant, u64, u64)>>,
}

/// The span [`WafWindow`] looks back over.
pub const WAF_WINDOW: Duration = Duration::from_secs(60);

impl WafWindow {
    /// Records user and backing blocks written so far, at `now`.
    pub fn sample(&self, now: Instant, user: u64, backing: u64) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        s.push_back((now, user, backing));
        while s.len() > 2
            && s.front()
                .is_some_and(|f| now.duration_since(f.0) > WAF_WINDOW)
        {
            s.pop_front();
        }
    }

    /// Backing blocks written per user block over the window (None: no user writes in
    /// it, or fewer than two samples).
    pub fn last_minute(&self) -> Option<f64> {
        let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let (a, z) = (s.front()?, s.back()?);
        let user = z.1.checked_sub(a.1)?;
        (user > 0).then(|| z.2.saturating_sub(a.2) as f64 / user as f64)
    }
}

/// A histogram family from the document's figures, labelled by request kind.
#[derive(Debug)]
struct LatencyFamily(Vec<(&'static str, OpLatency)>);

impl EncodeMetric for LatencyFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (op, l) in &self.0 {
            let labels = [("op", *op)];
            let mut buckets: Vec<(f64, u64)> = BUCKETS_S
                .iter()
                .zip(l.buckets.iter())
                .map(|(&b, &n)| (b, n))
                .collect();
            buckets.push((
                f64::MAX,
                l.buckets.get(BUCKETS_S.len()).copied().unwrap_or(0),
            ));
            encoder
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(l.sum_us as f64 / 1e6, l.count, &buckets, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A counter family from the document's figures, one label.
#[derive(Debug)]
struct CounterFamily(&'static str, Vec<(String, u64)>);

impl EncodeMetric for CounterFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (value, n) in &self.1 {
            let labels = [(self.0, value.as_str())];
            encoder
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(n, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The OpenMetrics text exposition of `d` (what Prometheus scrapes).
pub fn render(d: &StatsDocument) -> Result<String, std::fmt::Error> {
    let (s, c) = (&d.stats, &d.stats.counters);
    // The byte and request counters count from this daemon's open, as a Prometheus
    // counter must: the FTL's lifetime counters are restored from the last checkpoint
    // after a crash, below what was scraped, and a counter going down is read as a
    // reset (a rate() spike of the whole lifetime; found by review, 2026-11-27).
    let base = d.counters_at_open.clone().unwrap_or_default();
    let since = |v: u64, b: u64| v.saturating_sub(b);
    let bs = s.block_size.max(1);
    let cl = d.cleaner.as_ref().map(|c| &c.stats);
    let mut r = Registry::with_prefix("ftlblk");
    // (name, help, value); counters get `_total` from the encoder.
    let counters: Vec<(&str, &str, u64)> = [
        (
            "user_bytes",
            "Bytes users wrote since the daemon started",
            since(c.user_blocks_written, base.user_blocks_written) * bs,
        ),
        (
            "backing_bytes",
            "Bytes written to the backing (data, relocation, metadata, padding) since the daemon started",
            since(c.backing_blocks_written, base.backing_blocks_written) * bs,
        ),
        (
            "relocated_bytes",
            "Bytes the cleaner and defragmentation relocated since the daemon started",
            since(c.relocated_blocks, base.relocated_blocks) * bs,
        ),
        (
            "metadata_bytes",
            "Bytes of chunk summaries written to the backing since the daemon started",
            since(c.summary_blocks, base.summary_blocks) * bs,
        ),
        (
            "padding_bytes",
            "Bytes of padding FLUSH and FUA wrote to fill flash pages since the daemon started",
            since(c.padding_bytes, base.padding_bytes),
        ),
        (
            "discarded_bytes",
            "Bytes discarded (TRIMmed) on the backing since the daemon started",
            since(c.discarded_bytes, base.discarded_bytes),
        ),
        (
            "trimmed_blocks",
            "Blocks users trimmed since the daemon started",
            since(c.trimmed_blocks, base.trimmed_blocks),
        ),
        (
            "flushes",
            "FLUSH requests since the daemon started",
            since(c.flushes, base.flushes),
        ),
        (
            "checkpoints",
            "Checkpoints since the daemon started",
            s.checkpoints,
        ),
        (
            "free_records",
            "Free records (dead segments freed between checkpoints)",
            s.free_records,
        ),
        (
            "recoveries",
            "Times the device was recovered after its daemon died",
            d.device.as_ref().map_or(0, |r| u64::from(r.recoveries)),
        ),
        (
            "large_reads",
            "Reads of 64 KiB or more of device blocks",
            s.fragmentation.large_reads,
        ),
        (
            "defrag_moved_blocks",
            "Blocks read-driven defragmentation moved",
            s.fragmentation.defrag_moved_blocks,
        ),
        (
            "tombstone_carry_failures",
            "TRIM segments whose records could not be carried (they stay allocated)",
            s.tombstone_carry_failures,
        ),
    ]
    .into_iter()
    .chain(cl.into_iter().flat_map(|x| {
        [
            ("cleaner_slices", "Cleaning slices run", x.cleaner.slices),
            (
                "cleaner_preemptions",
                "Cleaning slices that yielded to foreground I/O",
                x.cleaner.preemptions,
            ),
            (
                "cleaner_segments_cleaned",
                "Segments the cleaner emptied",
                x.cleaner.segments_cleaned,
            ),
            (
                "cleaner_blocks_copied",
                "Blocks the cleaner copied",
                x.cleaner.blocks_copied,
            ),
            ("cleaner_errors", "Errors the cleaner thread hit", x.errors),
        ]
    }))
    .collect();
    for (name, help, v) in counters {
        r.register(name, help, ConstCounter::new(v));
    }
    let counts: Vec<(&str, &str, u64)> = [
        ("free_segments", "Free segments", s.free_segments),
        (
            "dead_segments",
            "Dead segments waiting for a free record or checkpoint",
            s.dead_segments,
        ),
        (
            "undiscarded_segments",
            "Free segments waiting for their discard on the backing",
            s.undiscarded_segments,
        ),
        ("segments", "Segments of the backing", s.segment_count),
        ("mapped_blocks", "Blocks that hold data", s.mapped_blocks),
        (
            "exported_bytes",
            "Capacity of the device",
            s.exported_blocks * bs,
        ),
    ]
    .into_iter()
    .chain(cl.into_iter().flat_map(|x| {
        [
            (
                "throttle_ns_per_block",
                "The writers' pace set by the cleaner (0: not throttled)",
                x.throttle_ns_per_block,
            ),
            (
                "headroom_segments",
                "Free segments the cleaner holds for writers above its floor",
                x.headroom_segments as u64,
            ),
        ]
    }))
    .collect();
    for (name, help, v) in counts {
        r.register(
            name,
            help,
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)),
        );
    }
    // Fractional: in whole seconds a light throttle read 0 for ever.
    r.register(
        "throttle_seconds",
        "Seconds writers spent in the cleaner's throttle, summed over writers",
        ConstCounter::new(s.throttled_ns as f64 / 1e9),
    );
    r.register(
        "waf",
        "Write amplification since the device was formatted",
        ConstGauge::new(s.waf),
    );
    if let Some(c) = &d.cleaner {
        r.register(
            "cleaner_up",
            "1 while the cleaner's thread runs, 0 once it ended (nothing cleans then)",
            ConstGauge::new(i64::from(!c.stopped)),
        );
    }
    if let Some(w) = d.waf_last_minute {
        r.register(
            "waf_last_minute",
            "Write amplification over the last minute",
            ConstGauge::new(w),
        );
    }
    let streams: Vec<(String, u64)> = s
        .stream_blocks_written
        .iter()
        .enumerate()
        .map(|(i, &n)| (i.to_string(), n))
        .collect();
    r.register(
        "stream_blocks_written",
        "Blocks appended per stream (user writes and relocations)",
        CounterFamily("stream", streams),
    );
    if let Some(l) = &d.latency {
        r.register(
            "request_latency_seconds",
            "Latency of requests completed at the ublk edge",
            LatencyFamily(
                Op::ALL
                    .iter()
                    .map(|&op| (op.name(), l.of(op).clone()))
                    .collect(),
            ),
        );
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)?;
    Ok(out)
}

/// The HTTP/1.1 response to one metrics request (`request`: its head), closing the
/// connection: `GET /metrics` (or `/`) gets `body`, anything else 404 / 405.
pub fn http_response(request: &str, body: impl FnOnce() -> Result<String, String>) -> String {
    let mut parts = request.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let reply = |status: &str, ctype: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    if method != "GET" {
        return reply("405 Method Not Allowed", "text/plain", "GET /metrics\n");
    }
    if path != "/metrics" && path != "/" {
        return reply("404 Not Found", "text/plain", "GET /metrics\n");
    }
    match body() {
        Ok(b) => reply(
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            &b,
        ),
        Err(e) => reply("500 Internal Server Error", "text/plain", &format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets_and_percentiles() {
        let l = Latencies::default();
        for _ in 0..990 {
            l.record(Op::Write, Duration::from_micros(80));
        }
        for _ in 0..10 {
            l.record(Op::Write, Duration::from_millis(30));
        }
        l.record(Op::Read, Duration::from_secs(500));
        let f = l.snapshot();
        let w = &f.write;
        assert_eq!(w.count, 1000);
        assert_eq!(w.buckets.len(), BUCKETS_S.len() + 1);
        assert_eq!(
            w.buckets[1], 990,
            "80 us is in the 100 us bucket: {:?}",
            w.buckets
        );
        assert_eq!(
            w.buckets[9], 10,
            "30 ms is in the 50 ms bucket: {:?}",
            w.buckets
        );
        assert!((79..=81).contains(&w.p50_us), "{}", w.p50_us);
        assert!(w.p999_us >= 29_000, "{}", w.p999_us);
        assert_eq!(f.read.buckets[BUCKETS_S.len()], 1, "above 10 s: +Inf");
        assert_eq!(f.flush.count, 0);
    }

    /// A cleaner whose thread ended shows as down (its figures alone stay frozen and
    /// look like an idle cleaner's).
    #[test]
    fn a_stopped_cleaner_is_down_in_the_exposition() {
        let mut d = StatsDocument::default();
        d.stats.block_size = 4096;
        assert!(
            !render(&d).unwrap().contains("cleaner_up"),
            "no cleaner, no gauge"
        );
        d.cleaner = Some(Default::default());
        assert!(render(&d).unwrap().contains("\nftlblk_cleaner_up 1\n"));
        d.cleaner.as_mut().unwrap().stopped = true;
        assert!(render(&d).unwrap().contains("\nftlblk_cleaner_up 0\n"));
    }

    #[test]
    fn the_waf_window_looks_back_a_minute() {
        let w = WafWindow::default();
        let t = Instant::now();
        assert_eq!(w.last_minute(), None);
        w.sample(t, 0, 0);
        w.sample(t + Duration::from_secs(30), 1000, 5000);
        assert_eq!(w.last_minute(), Some(5.0));
        // Two minutes later, at WAF 2 meanwhile: the old samples leave the window.
        for k in 1..=4 {
            w.sample(
                t + Duration::from_secs(30 + 30 * k),
                1000 + 1000 * k,
                5000 + 2000 * k,
            );
        }
        assert_eq!(w.last_minute(), Some(2.0));
    }

    #[test]
    fn the_exposition_has_every_figure_and_parses() {
        let mut d = StatsDocument::default();
        d.stats.block_size = 4096;
        d.stats.counters.user_blocks_written = 100;
        d.stats.counters.backing_blocks_written = 150;
        d.stats.counters.summary_blocks = 3;
        d.stats.waf = 1.5;
        d.stats.free_segments = 9;
        d.stats.stream_blocks_written = vec![0, 70, 30];
        d.stats.throttled_ns = 250_000_000;
        let live = Live::default();
        let at_open = ftl::Counters {
            flushes: 2,
            ..Default::default()
        };
        live.latencies.record(Op::Write, Duration::from_micros(80));
        live.latencies.record(Op::Write, Duration::from_millis(3));
        live.latencies.record(Op::Flush, Duration::from_millis(20));
        let t = Instant::now();
        live.waf.sample(t, 0, 0);
        live.waf.sample(t + Duration::from_secs(1), 10, 25);
        live.fill(&mut d);
        let text = render(&d).expect("render");
        // From a daemon that opened the device with 40 blocks and 2 FLUSHes written:
        // the counters count from there.
        d.stats.counters.flushes = 5;
        let mut opened = d.clone();
        Live::opened_with(ftl::Counters {
            user_blocks_written: 40,
            ..at_open
        })
        .fill(&mut opened);
        let since = render(&opened).expect("render");
        assert!(
            since.lines().any(|l| l == "ftlblk_user_bytes_total 245760"),
            "{since}"
        );
        assert!(
            since.lines().any(|l| l == "ftlblk_flushes_total 3"),
            "{since}"
        );
        for want in [
            "ftlblk_user_bytes_total 409600",
            "ftlblk_backing_bytes_total 614400",
            "ftlblk_metadata_bytes_total 12288",
            "ftlblk_waf 1.5",
            "ftlblk_waf_last_minute 2.5",
            "ftlblk_throttle_seconds_total 0.25",
            "ftlblk_free_segments 9",
            "ftlblk_stream_blocks_written_total{stream=\"1\"} 70",
            "ftlblk_request_latency_seconds_count{op=\"write\"} 2",
            "ftlblk_request_latency_seconds_bucket{le=\"0.0001\",op=\"write\"} 1",
            "ftlblk_request_latency_seconds_bucket{le=\"0.005\",op=\"write\"} 2",
            "ftlblk_request_latency_seconds_bucket{le=\"+Inf\",op=\"write\"} 2",
            "ftlblk_request_latency_seconds_count{op=\"flush\"} 1",
            "# TYPE ftlblk_request_latency_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == want),
                "no line {want:?} in\n{text}"
            );
        }
        assert_eq!(text.lines().last(), Some("# EOF"));
        // Every sample line is `name{labels} value` with a number for the value, and
        // each family is described once.
        let mut types = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(t) = l.strip_prefix("# TYPE ") {
                let name = t.split(' ').next().unwrap_or("");
                assert!(types.insert(name.to_string()), "{name} described twice");
            } else if !l.starts_with('#') {
                let v = l.rsplit(' ').next().unwrap_or("");
                assert!(v.parse::<f64>().is_ok() || v == "+Inf", "bad sample {l:?}");
            }
        }
    }

    #[test]
    fn http_serves_metrics_only() {
        let ok = http_response(
            "GET /metrics HTTP/1.1\r\nHost: x\r\n",
            || Ok("a 1\n".into()),
        );
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\na 1\n"),
            "{ok}"
        );
        assert!(ok.contains("Content-Length: 4\r\n"));
        assert!(http_response("GET /x HTTP/1.1", || Ok(String::new())).starts_with("HTTP/1.1 404"));
        assert!(
            http_response("POST /metrics HTTP/1.1", || Ok(String::new()))
                .starts_with("HTTP/1.1 405")
        );
        assert!(http_response("GET / HTTP/1.1", || Err("boom".into())).contains("500"));
    }
}
