#!/usr/bin/env python3
"""A model of the fill test (docs/RELIABILITY.md, scenario 13), to tell
placement's share of the raw use at the first refusal from the product's.

3 OSDs of 64 objects (256 MiB of 4 MiB objects), 2 copies, PGs spread
evenly over the three OSD pairs, objects hashed to PGs at random, written
until an OSD would pass 95%. Without data moves the raw use at that point
is the same whatever the PG count: the unevenness is in the objects.

    python3 bench/fill-model.py
"""
import random
import statistics


def fill(pgs: int, seed: int, capacity: float = 64 * 0.95) -> float:
    rng = random.Random(seed)
    pairs = [(0, 1), (0, 2), (1, 2)]
    placement = [pairs[i % 3] for i in range(pgs)]
    rng.shuffle(placement)
    used = [0, 0, 0]
    while True:
        a, b = placement[rng.randrange(pgs)]
        if used[a] + 1 > capacity or used[b] + 1 > capacity:
            return sum(used) / (3 * 64)
        used[a] += 1
        used[b] += 1


for pgs in (32, 128, 1024):
    runs = sorted(fill(pgs, seed) for seed in range(2000))
    print(f"{pgs:5} PGs: mean raw use at the refusal {statistics.mean(runs):.1%}, "
          f"worst {runs[0]:.1%}, 10th percentile {runs[len(runs) // 10]:.1%}")
