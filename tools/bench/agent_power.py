#!/usr/bin/env python3
"""agent_power.py [N ...]: the smallest pass-rate difference a paired comparison of N tasks
resolves — McNemar's test, two-sided alpha 0.05, power 0.80 — for several discordance rates
(the share of tasks on which the two arms disagree). Connor's (1987) sample-size formula
    n = (z_a * sqrt(psi) + z_b * sqrt(psi - d^2))^2 / d^2
solved for d. psi = d is the case where every disagreement goes one way (an arm that only
loses tasks); real comparisons disagree both ways, which needs a larger d."""
import math
import sys

Z_A, Z_B = 1.959964, 0.841621  # two-sided 0.05; power 0.80


def n_needed(d, psi):
    return (Z_A * math.sqrt(psi) + Z_B * math.sqrt(max(psi - d * d, 0.0))) ** 2 / (d * d)


def smallest_d(n, psi=None):
    """None when even d = psi (every disagreement one way) is not resolved."""
    if psi is not None and n_needed(psi, psi) > n:
        return None
    lo, hi = 1e-4, 1.0 if psi is None else psi
    for _ in range(100):
        mid = (lo + hi) / 2
        if n_needed(mid, mid if psi is None else psi) <= n:
            hi = mid
        else:
            lo = mid
    return hi


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [43, 363, 403]
    rates = [None, 0.10, 0.20, 0.30]
    print("tasks  " + "  ".join(f"{'one-way' if r is None else f'psi={r:.2f}':>10}" for r in rates))
    for n in sizes:
        cells = [smallest_d(n, r) for r in rates]
        print(f"{n:5d}  " + "  ".join(f"{'none':>10}" if d is None else f"{100 * d:8.1f}pt" for d in cells))


if __name__ == "__main__":
    main()
