"""Where the compiled optimizer step pays, by tensor size (docs/pmd_lamb.md, "The compiled step").

1. PMD-LAMB's step on 40 float32 tensors of one size, compiled (``fused=True``) against the
   eager multi-tensor step (``fused=False``): the ratio behind ``COMPILED_MIN_NUMEL``.
2. On one tensor, the one-graph update (:func:`largedet.optim._compiled.pmd_lamb_tensor`)
   against the two-graph one (moments, then apply): the ratio behind
   ``SINGLE_GRAPH_MAX_NUMEL``.

Medians of interleaved repetitions in this process, after two untimed steps (the first
compiles).

    python benchmarks/compiled_step_sizes.py [--rounds 7]
"""

import argparse
import statistics
import time

import torch

from largedet.optim import PMDLAMB
from largedet.optim import _compiled


def median_times(calls, rounds):
    for call in calls.values():
        call(), call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("1. PMD-LAMB step on 40 tensors: compiled / eager multi-tensor")
    for size in (8192, 32768, 131072, 524288):
        calls = {}
        for fused in (True, False):
            params = [torch.nn.Parameter(torch.randn(size)) for _ in range(40)]
            for p in params:
                p.grad = torch.randn(size)
            calls[fused] = PMDLAMB(params, lr=1e-6, weight_decay=1e-4, fused=fused).step
        t = median_times(calls, args.rounds)
        print(f"   40 x {size:9,d}: compiled {t[True] * 1e3:7.2f} ms, eager {t[False] * 1e3:7.2f} ms,"
              f" ratio {t[True] / t[False]:.2f}")
    print("2. one tensor: one graph / two graphs")
    one, first, second = (_compiled._compiled(n) for n in ("pmd_lamb", "pmd_lamb_moments", "pmd_lamb_apply"))
    s = torch.tensor([0.1, 0.9, 0.01, 1e-6, 1e-6, 1e-4, 10.0, 1.0])
    for size in (65536, 589824, 2359296, 12845056):
        w, g, m, v = (_compiled.as_matrix(torch.randn(size).abs()) for _ in range(4))
        calls = {"one": lambda: one(w, g, m, v, s),
                 "two": lambda: second(w, m, v, s, first(w, g, m, v, s))}  # fmt: skip
        t = median_times(calls, args.rounds * 2)
        print(f"   {size:11,d} elements: one graph {t['one'] * 1e3:7.2f} ms, two graphs "
              f"{t['two'] * 1e3:7.2f} ms, ratio {t['one'] / t['two']:.2f}")


if __name__ == "__main__":
    main()
