"""The hand-VJP gradient's cost in CPU time: ``gradient_cost.py``'s loss, two timings only.

Times the plain forward (no sensitivities) and ``autograd.value_and_grad`` of the
1,000-trajectory Lorenz loss with ``DiscreteAdjoint`` and the hand-written ``lorenz_vjp``,
alternately, in process CPU time (steadier than wall time on a shared machine), and prints the
best of each, the gradient's part and (forward + gradient) / forward. For A/B comparisons run
two versions of dxode alternately::

    PYTHONPATH=$PWD python asv_bench/hand_vjp_gradient_probe.py [ROUNDS]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys
import time

import autograd
from gradient_cost import THETA, lorenz_vjp, make_loss

import dxode


def main(rounds: int) -> None:
    plain = make_loss()
    both = autograd.value_and_grad(make_loss(dxode.DiscreteAdjoint(), lorenz_vjp))
    plain(THETA), both(THETA)  # first calls: imports and caches
    forward, total = [], []
    for _ in range(rounds):
        start = time.process_time()
        plain(THETA)
        forward.append(time.process_time() - start)
        start = time.process_time()
        both(THETA)
        total.append(time.process_time() - start)
    f, t = min(forward), min(total)
    print(f"forward {f:.4f} s, forward + gradient {t:.4f} s, gradient {t - f:.4f} s")
    print(f"(forward + gradient) / forward = {t / f:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
