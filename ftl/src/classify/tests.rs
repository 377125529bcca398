use super::*;

fn params(period: u64) -> Params {
    Params {
        period,
        activate_permille: 50,
        deactivate_permille: 20,
        ..Params::for_capacity(1 << 20)
    }
}

#[test]
fn stat_round_trips_and_averages() {
    let s = Stat::new(3, 1000.0);
    assert_eq!(s.count(), 3);
    assert!((s.mean() / 1000.0 - 1.0).abs() < 0.006, "{}", s.mean());
    assert_eq!(Stat::new(200, 1.0).count(), Stat::MAX_COUNT);
    // Means saturate at 2^32 (the clock's range).
    assert_eq!(
        Stat::new(1, f64::INFINITY).mean(),
        Stat::new(1, 1e30).mean()
    );
    assert!(Stat::new(1, f64::INFINITY).mean() >= 4e9);
    assert_eq!(Stat::new(1, f64::NAN).count(), 1);
    // A running mean over the first max_samples intervals.
    let mut s = Stat::default();
    for d in [100, 300, 200] {
        s = s.observe(d, 15);
    }
    assert_eq!(s.count(), 3);
    assert!((s.mean() / 200.0 - 1.0).abs() < 0.01, "{}", s.mean());
    // Past the cap, a moving average: it follows a change of rate.
    let mut s = Stat::default();
    for _ in 0..15 {
        s = s.observe(100, 4);
    }
    assert_eq!(s.count(), 4);
    for _ in 0..30 {
        s = s.observe(10_000, 4);
    }
    assert!(s.mean() > 9_000.0, "{}", s.mean());
}

#[test]
fn lifetimes() {
    assert_eq!(write_lifetime(Stat::default(), 5000), 5000.0);
    let s = Stat::new(2, 100.0);
    assert!((write_lifetime(s, 5000) - 100.0).abs() < 1.0);
    assert_eq!(relocation_lifetime(Stat::default(), 700), 700.0);
    // Two intervals of 100 and 400 writes survived since: (200 + 400) / 2.
    assert!((relocation_lifetime(s, 400) - 300.0).abs() < 2.0);
}

#[test]
fn old_never_rewritten_blocks_go_to_the_coldest_active_class() {
    let p = params(1000);
    let s = 1u64 << 16;
    let active = (1 << 1) | (1 << 3) | (1 << 5);
    let never = Stat::default();
    // Younger than two scales: by age alone ([S/2, 2S) is class 3).
    assert_eq!(relocation_class(never, s, s, active, &p), 3);
    assert_eq!(relocation_class(never, 2 * s - 1, s, active, &p), 3);
    // Two scales or older: the coldest active class (5), not the age's class (4).
    assert_eq!(relocation_class(never, 2 * s, s, active, &p), 5);
    assert_eq!(relocation_class(never, 3 * s, s, active, &p), 5);
    // Never warmer than its age says: with class 3 the coldest active, class 4 stays.
    assert_eq!(relocation_class(never, 2 * s, s, 1 << 3, &p), 4);
    // A block with an interval seen keeps its estimate, however old.
    let seen = Stat::new(1, s as f64);
    assert_eq!(
        relocation_class(seen, 3 * s, s, active, &p),
        class_of(relocation_lifetime(seen, 3 * s), s, &p)
    );
    // Off.
    let off = Params {
        static_age: f64::INFINITY,
        ..p
    };
    assert_eq!(relocation_class(never, 3 * s, s, active, &off), 4);
}

#[test]
fn classes_are_log_spaced_around_the_scale() {
    let p = params(1000);
    assert_eq!(p.middle(), 3);
    let s = 1 << 16;
    let at = |f: f64| class_of(f * s as f64, s, &p);
    assert_eq!(at(1.0), 3);
    assert_eq!(at(0.6), 3);
    assert_eq!(at(1.9), 3);
    assert_eq!(at(0.45), 2);
    assert_eq!(at(2.1), 4);
    assert_eq!(at(1.0 / 16.0), 1);
    assert_eq!(at(1e-9), 0);
    assert_eq!(at(10.0), 5);
    assert_eq!(at(1e9), 6);
    assert_eq!(class_of(f64::NAN, s, &p), 0);
    let three = Params { classes: 3, ..p };
    assert_eq!(class_of(1e9, s, &three), 2);
    assert_eq!(class_of(1.0, s, &three), 0);
}

fn plan_(counts: &[u64; CLASSES], active: u8, p: &Params) -> (u8, [u8; CLASSES]) {
    plan(counts, &[None; CLASSES], active, p)
}

#[test]
fn plan_keeps_busy_classes_with_hysteresis() {
    let p = params(1000);
    // 3% in class 1: not enough to open a stream (5%) ...
    let (a, map) = plan_(&[0, 30, 0, 700, 270, 0, 0], 0b1000, &p);
    assert_eq!(a, 0b1_1000);
    assert_eq!(map, [3, 3, 3, 3, 4, 4, 4]);
    // ... but enough to keep one (2%).
    let (a, _) = plan_(&[0, 30, 0, 700, 270, 0, 0], 0b1_1010, &p);
    assert_eq!(a, 0b1_1010);
    // Ties go to the longer-lived class: class 2 sits between 1 and 3.
    let (a, map) = plan_(&[0, 500, 0, 500, 0, 0, 0], 0, &p);
    assert_eq!(a, 0b1010);
    assert_eq!(map[2], 3);
    assert_eq!(map[0], 1);
    // Nothing placed: the active set stays.
    assert_eq!(plan_(&[0; CLASSES], 0b100, &p).0, 0b100);
    // Thinly spread placements: the busiest class still gets a stream.
    let (a, map) = plan_(
        &[1, 1, 1, 2, 1, 1, 1],
        0,
        &Params {
            activate_permille: 500,
            ..p
        },
    );
    assert_eq!(a, 0b1000);
    assert!(map.iter().all(|&m| m == 3));
}

#[test]
fn plan_merges_classes_whose_blocks_live_alike() {
    let p = params(1000);
    let counts = [0, 0, 100, 600, 300, 0, 0];
    let none = [None; CLASSES];
    assert_eq!(plan(&counts, &none, 0, &p).0, 0b1_1100);
    // Classes 2 and 3 measured within a factor 2 of each other: 2 (fewer) drops out.
    let mut lived = [None, None, Some(10.0), Some(10.8), Some(14.0), None, None];
    let (a, map) = plan(&counts, &lived, 0, &p);
    assert_eq!(a, 0b1_1000);
    assert_eq!(map[2], 3);
    // All alike (a uniform workload): one stream, the busiest class's.
    lived[4] = Some(10.5);
    assert_eq!(plan(&counts, &lived, 0, &p).0, 0b1000);
    // An unmeasured class is never merged away.
    lived[4] = None;
    assert_eq!(plan(&counts, &lived, 0, &p).0, 0b1_1000);
    // Lifetimes out of order (the longer-predicted class dies sooner) merge too.
    let lived = [None, None, Some(12.0), Some(10.0), Some(14.0), None, None];
    assert_eq!(plan(&counts, &lived, 0, &p).0, 0b1_1000);
}

#[test]
fn class_lifetimes_and_implied_lifetimes() {
    let p = params(1000);
    assert_eq!(class_lifetime(3, 1000, &p), 1000.0);
    assert_eq!(class_lifetime(4, 1000, &p), 4000.0);
    assert_eq!(class_lifetime(1, 1000, &p), 62.5);
    for c in 0..CLASSES as u8 {
        assert_eq!(class_of(class_lifetime(c, 1000, &p), 1000, &p), c);
    }
    // Exponential lifetimes of mean m: a fraction 1 - e^(-h/m) dies within h.
    let m = 5000.0f64;
    let died = ((1.0 - (-1000.0 / m).exp()) * 1e6) as u64;
    let l = implied_lifetime_log2(died, 1_000_000, 1000.0).unwrap();
    assert!((l - m.log2()).abs() < 0.01, "{l}");
    assert_eq!(implied_lifetime_log2(0, 100, 1000.0), None);
    assert_eq!(implied_lifetime_log2(5, 0, 1000.0), None);
    assert!(implied_lifetime_log2(100, 100, 1000.0).unwrap() < 1000f64.log2());
}

#[test]
fn new_state_goes_to_the_middle_until_the_first_plan() {
    let c = Classifier::with_params(100, params(1000));
    for lba in 0..100 {
        assert_eq!(c.on_write(lba), stream_of(3));
    }
    assert_eq!(c.scale(), 100);
    c.on_trim(10, 20);
    assert_eq!(c.scale(), 80);
    c.on_trim(10, 20);
    assert_eq!(c.scale(), 80, "trimming twice counts once");
    // Out-of-range LBAs are classified without history and not recorded.
    c.on_write(1 << 40);
    c.on_trim(1 << 40, 4);
    assert_eq!(c.scale(), 80);
    assert_eq!(Classifier::BYTES_PER_BLOCK, 6);
}

/// Uniform random overwrites: every block lives alike, whatever its history says, so the
/// plan ends with one stream.
#[test]
fn uniform_overwrites_end_in_one_stream() {
    let cap = 4096u64;
    let c = Classifier::with_params(cap, params(2048));
    let mut x = 777u64;
    for lba in 0..cap {
        c.on_write(lba);
    }
    for _ in 0..20 * cap {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.on_write(x % cap);
        if x.is_multiple_of(3) {
            c.on_relocate(x / 3 % cap);
        }
    }
    assert_eq!(
        c.active_classes().count_ones(),
        1,
        "{:#b}",
        c.active_classes()
    );
    assert_eq!(c.idle_streams().len(), CLASSES - 1);
}

/// 90% of the writes go to 64 hot blocks, the rest to 4032 cold ones: once the plan has
/// run, hot blocks land in a stream that holds short-lived blocks, cold ones in another,
/// and relocating a cold block that has long survived keeps it with the cold ones.
#[test]
fn separates_hot_from_cold_blocks() {
    separates_hot_from_cold(4096);
}

/// The same with an eighth of the blocks tracked (slots shared, as on a device larger
/// than [`Params::tracked_blocks`]): the hot blocks keep their slots and the separation
/// holds, with a bounded state.
#[test]
fn separates_hot_from_cold_blocks_with_shared_slots() {
    let c = separates_hot_from_cold(512);
    assert_eq!(c.tracked_blocks(), 512);
    assert_eq!(c.ram_bytes(), 512 * 10);
    // The scale counts slots in use, scaled to the capacity.
    assert!(c.scale() > 3500 && c.scale() <= 4096, "{}", c.scale());
}

/// A classifier of `cap` blocks, `tracked` of them with a slot, every block written once;
/// and a xorshift generator seeded with `seed`.
fn filled(cap: u64, tracked: u64, seed: u64) -> (Classifier, impl FnMut() -> u64) {
    let c = Classifier::with_params(
        cap,
        Params {
            tracked_blocks: tracked,
            ..params(2048)
        },
    );
    for lba in 0..cap {
        c.on_write(lba);
    }
    let mut x = seed;
    let rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (c, rnd)
}

fn separates_hot_from_cold(tracked: u64) -> Classifier {
    let cap = 4096u64;
    let (c, mut rnd) = filled(cap, tracked, 12345);
    let (mut hot, mut cold) = (vec![0u64; 8], vec![0u64; 8]);
    for i in 0..20 * cap {
        let r = rnd();
        let lba = if r % 10 < 9 {
            r / 16 % 64
        } else {
            64 + r / 16 % (cap - 64)
        };
        let s = c.on_write(lba);
        if i > 10 * cap {
            if lba < 64 {
                hot[s.0 as usize] += 1;
            } else {
                cold[s.0 as usize] += 1;
            }
        }
    }
    let hot_stream = (0..8).max_by_key(|&s| hot[s]).unwrap();
    let cold_stream = (0..8).max_by_key(|&s| cold[s]).unwrap();
    assert!(hot_stream < cold_stream, "hot {hot:?} cold {cold:?}");
    let hot_total: u64 = hot.iter().sum();
    let cold_total: u64 = cold.iter().sum();
    assert!(hot[hot_stream] * 10 >= hot_total * 9, "hot {hot:?}");
    assert!(cold[hot_stream] * 20 <= cold_total, "cold {cold:?}");
    assert!(c.active_classes().count_ones() >= 2);
    assert!(c.plans() >= 10);
    let idle = c.idle_streams();
    assert!(!idle.contains(&StreamId(hot_stream as u8)));
    assert!(!idle.contains(&StreamId(cold_stream as u8)));
    assert_eq!(
        idle.len() + c.active_classes().count_ones() as usize,
        CLASSES
    );
    // A cold block relocated now (not rewritten for a long time) stays cold; a hot one
    // relocated right after its write goes with the hot ones.
    let cold_lba = (64..cap).find(|&l| c.on_relocate(l).0 as usize >= cold_stream);
    assert!(cold_lba.is_some());
    c.on_write(5);
    assert_eq!(c.on_relocate(5).0 as usize, hot_stream);
    c
}

/// With shared slots, a relocated block whose LBA holds no slot is most likely cold (a
/// holder rewritten within the scale keeps its slot): it goes one class colder than a
/// first write, not back into the first writes' class, where every victim would copy it
/// again. Hot/cold writes with relocations of cold blocks among them, as a cleaner makes,
/// an eighth of the blocks tracked.
#[test]
fn a_slotless_relocated_block_goes_colder_than_a_first_write() {
    let cap = 4096u64;
    let (c, mut rnd) = filled(cap, 512, 4242);
    for _ in 0..20 * cap {
        let r = rnd();
        c.on_write(if r % 10 < 9 {
            r / 16 % 64
        } else {
            64 + r / 16 % (cap - 64)
        });
        if r % 4 == 0 {
            c.on_relocate(64 + r / 64 % (cap - 64));
        }
    }
    let scale = c.scale();
    let first = c.place(Some(scale as f64));
    // Most cold LBAs hold no slot (512 slots, 64 of them the hot blocks'): they go to a
    // colder stream than the first writes' (the scale's class; streams are numbered
    // hottest first).
    let (mut colder, mut cold) = (0, 0);
    for lba in 64..cap {
        cold += 1;
        if c.on_relocate(lba).0 > first.0 {
            colder += 1;
        }
    }
    assert!(
        colder * 10 >= cold * 7,
        "{colder} of {cold} cold blocks relocated colder than the first writes' stream {:?} \
         (active {:#b})",
        first,
        c.active_classes()
    );
}

/// Shared slots spread over every set, whatever the set count: writing as many
/// consecutive LBAs as there are slots, once each, fills about 95% of them (the hash
/// spreads consecutive LBAs almost evenly; random ones, Poisson(4) a set, would fill 80%).
/// The set used to be the hash's bits 32..64 modulo the set count, which with a power of
/// two (16,384 sets here, 65,536 on an 8 GiB device with a quarter million slots) reached
/// under half of the sets: 46% of the slots at most here, a third on that device.
#[test]
fn shared_slots_spread_over_every_set() {
    let (cap, tracked) = (1u64 << 17, 1u64 << 16);
    let c = Classifier::with_params(
        cap,
        Params {
            tracked_blocks: tracked,
            ..params(1 << 20)
        },
    );
    for lba in 0..tracked {
        c.on_write(lba);
    }
    // The scale counts the slots in use, scaled to the capacity.
    let used = c.scale() as f64 / cap as f64;
    assert!(used > 0.85, "{:.1}% of the slots in use", used * 100.0);
}
