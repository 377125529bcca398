#!/usr/bin/env python3
"""What placement by write frequency can reach: the FIFO group model behind docs/waf.md.

Usage: scripts/group-model.py [--blocks N] [--theta S] [--spare F] [--groups 1,4,7,14,28,60]
                              [--fio] [--detail K] [--ftlblk-classes]
Needs numpy (apt-get install python3-numpy).

Every block i is overwritten as a Poisson process of rate p_i per user write (a Zipf law of
exponent theta; with --fio, ranks are placed on blocks with fio's hash, so colliding ranks
add up and undrawn blocks never die). Blocks are put in K groups by rate (log-spaced, the
frequencies known exactly), each group a log of its own cleaned first-in-first-out:
a group whose log turns over in T user writes rewrites block i 1 / (1 - exp(-p_i T)) times
per user write of it, and occupies sum_i p_i T / (1 - exp(-p_i T)) blocks of space. The
space is split between the groups optimally (equal marginal cost, by bisection on the
Lagrange multiplier), and WAF is total log writes per user write. With --ftlblk-classes the
groups are ftlblk's seven lifetime classes instead (1/rate cut at S/32, S/8, S/2, 2S, 8S and
32S, S the number of blocks; ftl::classify), each group reported.

This is not a lower bound for every cleaner (greedy and cost-benefit victims within a group
of mixed rates beat FIFO; one group here is far worse than one stream in `ftlblk replay`),
but with many narrow groups every group is nearly uniform and FIFO is nearly greedy: the
figure for many groups is what perfect frequency separation with the best spare split gets.
"""
import argparse
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("group-model.py needs numpy: apt-get install python3-numpy (or pip install numpy)")

FIO_GOLDEN = 0x61C8864680B583EB


def rates(n, theta, fio):
    """Write probability per block, hottest first (zeros for blocks never drawn)."""
    r = np.arange(1, n + 1, dtype=np.float64) ** -theta
    p = r / r.sum()
    if fio:
        ranks = np.arange(n, dtype=np.uint64)
        blocks = ((ranks * np.uint64(FIO_GOLDEN)) % np.uint64(n)).astype(np.int64)
        q = np.zeros(n)
        np.add.at(q, blocks, p)
        p = q
    return np.sort(p)[::-1]


def compress(lam, bins=4000):
    """(mean rate, count) over log-spaced bins: the sums below stay exact to 0.1%."""
    logs = np.log(lam)
    edges = np.linspace(logs.min(), logs.max() + 1e-9, bins + 1)
    i = np.digitize(logs, edges) - 1
    count = np.bincount(i, minlength=bins)
    total = np.bincount(i, weights=lam, minlength=bins)
    keep = count > 0
    return total[keep] / count[keep], count[keep].astype(float)


def space_and_writes(group, turnover):
    """Blocks of space a group occupies and its log writes per user write."""
    lam, count = group
    x = lam * turnover
    survive = np.maximum(-np.expm1(-x), 1e-300)
    space = (count * np.where(x > 1e-12, x / survive, 1.0)).sum()
    writes = (count * lam / survive).sum()
    return space, writes


def turnover_for(group, mu):
    """The turnover at which one more block of space saves mu log writes per user write."""
    lo, hi = 1e-3, 1e12
    for _ in range(100):
        mid = np.sqrt(lo * hi)
        s1, w1 = space_and_writes(group, mid)
        s2, w2 = space_and_writes(group, mid * 1.0001)
        if -(w2 - w1) / (s2 - s1) > mu:
            lo = mid
        else:
            hi = mid
    return mid


FTLBLK_CLASS_EDGES = [1 / 32, 1 / 8, 1 / 2, 2, 8, 32]  # lifetimes, in scales


def solve(p, k, spare, lifetime_edges=None):
    """Optimal split of the space over k rate groups (or the groups cut at
    lifetime_edges x n): (WAF, per-group rows, share of blocks never rewritten)."""
    n = len(p)
    physical = n / (1 - spare)
    live = p[p > 0]
    static = n - len(live)  # never rewritten: one block of space each, no writes
    if lifetime_edges is None:
        logs = np.log(live)
        edges = np.linspace(logs.min(), logs.max() + 1e-9, k + 1)
        gid = np.clip(np.digitize(logs, edges) - 1, 0, k - 1)
    else:
        k = len(lifetime_edges) + 1
        gid = np.digitize(1 / live, np.array(lifetime_edges) * n)
    raw = [live[gid == g] for g in range(k) if (gid == g).any()]
    groups = [compress(x) for x in raw]
    lo, hi = 1e-15, 1e3
    for _ in range(80):
        mu = np.sqrt(lo * hi)
        used = static + sum(space_and_writes(g, turnover_for(g, mu))[0] for g in groups)
        if used > physical:
            lo = mu
        else:
            hi = mu
    rows, waf = [], 0.0
    for x, g in zip(raw, groups):
        space, writes = space_and_writes(g, turnover_for(g, mu))
        waf += writes
        rows.append((len(x), x.sum(), space, writes))
    return waf, rows, static / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=1_953_125, help="logical blocks (MiDAS: 8e9 / 4096)")
    ap.add_argument("--theta", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--spare", type=float, default=0.069, help="spare share of the physical space")
    ap.add_argument("--groups", default="1,4,7,14,28,60", help="group counts to report")
    ap.add_argument("--fio", action="store_true", help="place ranks with fio's hash")
    ap.add_argument("--detail", type=int, help="print each group of this many groups")
    ap.add_argument("--ftlblk-classes", action="store_true",
                    help="ftlblk's seven lifetime classes as the groups, each reported")
    a = ap.parse_args()
    p = rates(a.blocks, a.theta, a.fio)
    if a.ftlblk_classes:
        waf, rows, static = solve(p, 0, a.spare, FTLBLK_CLASS_EDGES)
        print(f"ftlblk classes: WAF {waf:.3f}  (never rewritten: {static:.1%} of the blocks)")
        print("hottest first: blocks, share of writes, space/blocks, relocations per user write")
        for blocks, share, space, writes in rows:
            print(f"  {blocks:9d} {share:6.3f} {space / blocks:7.3f} {writes - share:6.3f}")
        return
    for k in [int(x) for x in a.groups.split(",")]:
        waf, rows, static = solve(p, k, a.spare)
        print(f"groups {k:3d}: WAF {waf:.3f}  (never rewritten: {static:.1%} of the blocks)")
    if a.detail:
        waf, rows, _ = solve(p, a.detail, a.spare)
        print(f"\n{a.detail} groups, coldest first: blocks, share of writes, space/blocks, group WAF")
        for blocks, share, space, writes in rows:
            print(f"  {blocks:9d} {share:6.3f} {space / blocks:7.3f} {writes / share:6.2f}")


if __name__ == "__main__":
    main()
