#!/usr/bin/env python3
"""Writes data/numbers-sm.csv, data/numbers-md.csv and data/numbers-lg.csv: fixed number lists
for the data-parallel jobs (MAX, PRIME-COUNT).

Run from anywhere:  python3 scripts/gen-numbers.py

Standard library only. The generator is splitmix64, implemented here with a fixed seed per file,
so the output never depends on the Python version; running the script again rewrites
byte-identical files. Values mix small numbers, negatives, numbers up to 10^18 and primes (known
ones and random ones found with a deterministic Miller-Rabin test), so prime counts are
non-trivial.
"""

import os

MASK64 = (1 << 64) - 1

# The twelve bases that decide primality for every n < 3.18 * 10^23 (Sorenson and Webster).
BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)

KNOWN_PRIMES = (
    2, 3, 5, 7, 97, 7_919, 104_729, 1_299_709, 998_244_353, 1_000_000_007, 2_147_483_647,
    999_999_999_989, 1_000_000_000_000_000_003, 2_305_843_009_213_693_951,
)

# numbers-lg.csv must fit one 1 MiB protocol frame as a JSON array, with room to spare.
LARGE_BYTES_MAX = 900_000


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        """Uniform in [0, n), by rejection so there is no modulo bias."""
        limit = (1 << 64) - (1 << 64) % n
        while True:
            x = self.next()
            if x < limit:
                return x % n

    def between(self, low, high):
        """Uniform in [low, high]."""
        return low + self.below(high - low + 1)

    def choice(self, items):
        return items[self.below(len(items))]


def is_prime(n):
    if n < 2:
        return False
    for p in BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n):
    while not is_prime(n):
        n += 1
    return n


def value(rng):
    kind = rng.below(100)
    if kind < 25:
        return rng.between(0, 1_000)
    if kind < 35:
        return rng.between(-1_000, -1)
    if kind < 40:
        return rng.between(-10**18, -1_001)
    if kind < 55:
        return rng.between(1_001, 10**9)
    if kind < 70:
        return rng.between(10**9 + 1, 10**18)
    if kind < 80:
        return rng.choice(KNOWN_PRIMES)
    return next_prime(rng.between(2, 10 ** rng.choice((3, 6, 9, 12, 15, 18))))


def one_per_line(values):
    return "value\n" + "".join(f"{v}\n" for v in values)


def mixed_lines(rng, values):
    """Several numbers a line, with `,`, `;` and spaces mixed between them."""
    out, i = ["value\n"], 0
    while i < len(values):
        line = values[i:i + rng.between(1, 8)]
        i += len(line)
        text = str(line[0])
        for v in line[1:]:
            text += rng.choice((",", ";", " ", ", ", "; ", " ,")) + str(v)
        out.append(text + "\n")
    return "".join(out)


def main():
    assert all(is_prime(p) for p in KNOWN_PRIMES)
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
    os.makedirs(data, exist_ok=True)
    files = []
    for name, seed, count in (("sm", 1, 20), ("md", 2, 2_000), ("lg", 3, 40_000)):
        rng = SplitMix64(seed)
        values = [value(rng) for _ in range(count)]
        text = mixed_lines(rng, values) if name == "md" else one_per_line(values)
        if name == "lg":
            json_bytes = len("[" + ",".join(map(str, values)) + "]")
            assert max(len(text), json_bytes) < LARGE_BYTES_MAX, (len(text), json_bytes)
        path = os.path.join(data, f"numbers-{name}.csv")
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write(text)
        primes = sum(1 for v in values if is_prime(v))
        files.append(f"data/numbers-{name}.csv: {count} numbers, {primes} primes, "
                     f"max {max(values)}, {len(text)} bytes")
    print("\n".join(files))


if __name__ == "__main__":
    main()
