"""Where the hand-VJP gradient's floor is: the discrete adjoint's recursion with nothing else.

On ``gradient_cost.py``'s 1,000-trajectory Lorenz loss (Tsit5, ``DiscreteAdjoint``, the
hand-written ``lorenz_vjp``) this times, in process CPU time, best of ``ROUNDS`` (7):

* the plain forward pass and ``autograd.value_and_grad`` (as ``hand_vjp_gradient_probe.py``);
* 2,256 calls (6 per step, the sweep's count) of ``f`` and of the user's VJP on one stage
  input of 1,000 lanes, hot in the cache;
* a minimal sweep over the gradient's own recorded stage inputs: for every iteration, last
  to first, the Tsit5 stage recursion of ``dxode.sensitivity.discrete_adjoint._step_vjp``
  written out with NumPy (stage times, ``k̄ = h (b ū + Σ a ȳ)``, the user's VJP, its rows
  stacked, the parameter cotangents added, ``ū`` summed), for all lanes as if all accepted,
  with no save points, no checks and no bookkeeping; once with the user's VJP and once with
  a VJP that costs nothing.

``(forward + minimal sweep) / forward`` is what a gradient would cost if dxode's sweep did no
more than these array operations (before the stability probes, the sweep's setup and
autograd's own work)::

    PYTHONPATH=$PWD python asv_bench/hand_vjp_floor.py [ROUNDS]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys
import time
from collections.abc import Callable
from typing import Any

import autograd
import numpy as np
from gradient_cost import SCALE, THETA, lorenz, lorenz_vjp, make_loss

import dxode
from dxode.backends._base import ordered_sum
from dxode.sensitivity import discrete_adjoint


def best(fn: Callable[[], object], rounds: int) -> float:
    """Milliseconds of CPU time of ``fn()``, best of ``rounds``."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1e3 * min(times)


def recorded_trials() -> tuple[list[Any], Any]:
    """One gradient's recorded iterations and its stepper (caught on the way to the sweep)."""
    caught: dict[str, Any] = {}
    sweep = discrete_adjoint.backward

    def catching(backend: Any, stepper: Any, rhs: Any, trials: list, *args: Any, **kw: Any) -> Any:
        caught["trials"], caught["stepper"] = trials, stepper
        return sweep(backend, stepper, rhs, trials, *args, **kw)

    discrete_adjoint.backward = catching
    try:
        autograd.grad(make_loss(dxode.DiscreteAdjoint(), lorenz_vjp))(THETA)
    finally:
        discrete_adjoint.backward = sweep
    return caught["trials"], caught["stepper"]


def minimal_sweep(trials: list[Any], stepper: Any, vjp: Callable[..., Any]) -> None:
    """The Tsit5 stage recursion over ``trials``, last to first, and nothing else."""
    tab = stepper.tableau
    a, b = np.asarray(tab.a, dtype=float), np.asarray(tab.b, dtype=float)
    stages = len(trials[0].inputs) - 1  # the FSAL stage is not pulled back
    c = np.asarray(tab.c, dtype=float)[:stages, None]
    below = [a[i, :i].reshape(-1, 1, 1) for i in range(stages)]
    b_col = b[:stages].reshape(-1, 1, 1)
    params = (THETA[None, :] * SCALE).T.copy()
    width = 0
    for trial in reversed(trials):
        if trial.h.shape[0] != width:
            width = trial.h.shape[0]
            u_bar, p_bar = np.ones((3, width)), np.zeros((3, width))
            bars = np.empty((stages + 1, 3, width))
        p, h = params[:, :width], trial.h
        stage_times = trial.t + c * h
        bars[stages] = u_bar
        k_bars = b_col * u_bar
        for i in range(stages - 1, -1, -1):
            rows, stage_p_bar = vjp(trial.inputs[i], p, stage_times[i], k_bars[i] * h)
            for r, row in enumerate(rows):
                bars[i, r] = row
            if i:
                k_bars[:i] += below[i] * bars[i]
            p_bar = p_bar + stage_p_bar
        u_bar = ordered_sum(np, bars)


def free_vjp(u: Any, p: Any, t: Any, v: Any) -> tuple[Any, Any]:
    """A VJP that costs nothing (its values are not the derivative)."""
    return (v[0], v[1], v[2]), v


def main(rounds: int) -> None:
    plain = make_loss()
    both = autograd.value_and_grad(make_loss(dxode.DiscreteAdjoint(), lorenz_vjp))
    plain(THETA), both(THETA)
    forward, total = [], []
    for _ in range(rounds):  # alternating, as the other probes
        forward.append(best(lambda: plain(THETA), 1))
        total.append(best(lambda: both(THETA), 1))
    fwd, tot = min(forward), min(total)
    trials, stepper = recorded_trials()
    calls = 6 * len(trials)
    y, t = trials[len(trials) // 2].inputs[0], trials[len(trials) // 2].t
    p, v = (THETA[None, :] * SCALE).T[:, : y.shape[-1]].copy(), np.ones_like(y)

    def f_calls() -> None:
        for _ in range(calls):
            lorenz(y, p, t)

    def vjp_calls() -> None:
        for _ in range(calls):
            lorenz_vjp(y, p, t, v)

    f_ms, vjp_ms = best(f_calls, rounds), best(vjp_calls, rounds)
    sweep_ms = best(lambda: minimal_sweep(trials, stepper, lorenz_vjp), rounds)
    free_ms = best(lambda: minimal_sweep(trials, stepper, free_vjp), rounds)
    print(f"{len(trials)} iterations; forward {fwd:.1f} ms, forward + gradient {tot:.1f} ms")
    print(f"(forward + gradient) / forward = {tot / fwd:.3f}")
    print(f"{calls} calls: f {f_ms:.1f} ms, the hand VJP {vjp_ms:.1f} ms ({vjp_ms / f_ms:.2f} x)")
    print(f"minimal sweep: with the hand VJP {sweep_ms:.1f} ms, with a free VJP {free_ms:.1f} ms")
    print(f"(forward + minimal sweep) / forward = {(fwd + sweep_ms) / fwd:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
