"""Record the outputs of a fixed set of solves, or compare them with a recording, bitwise.

A refactor that must not change a single output bit records before the first move and
compares after the last one::

    python tests/recorded_outputs.py record /tmp/before.npz
    python tests/recorded_outputs.py compare /tmp/before.npz

The set covers single solves (every method, saved grids, dense output), stiff methods,
events, ensembles (Serial, Array, Dask with worker processes, output and reduction
functions) and each sensitivity algorithm's gradient, single and ensemble, local and on
Dask. Bits depend on the CPU's SIMD kernels (see docs/design.md), so compare recordings
made on the same machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

Recorder = Callable[[], Iterator[tuple[str, Any]]]


def lorenz(u: Any, p: Any, t: Any) -> list[Any]:
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def decay(u: Any, p: Any, t: Any) -> Any:
    return -p * u + anp.sin(t)


def van_der_pol(u: Any, p: Any, t: Any) -> list[Any]:
    x, y = u
    return [y, p * (1.0 - x * x) * y - x]


def robertson(u: Any, p: Any, t: Any) -> list[Any]:
    y1, y2, y3 = u
    return [
        -0.04 * y1 + 1e4 * y2 * y3,
        0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2 * y2,
        3e7 * y2 * y2,
    ]


def fall(u: Any, p: Any, t: Any) -> list[Any]:
    return [u[1], -9.81 + 0.0 * u[0]]


def height(u: Any, p: Any, t: Any) -> Any:
    return u[0]


def bounce(u: Any, p: Any, t: Any, fired: Any) -> list[Any]:
    return [u[0], -p * u[1]]


LORENZ = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 3.0), (10.0, 28.0, 8 / 3))
EXPLICIT = ("Euler", "RK4", "BS3", "DP5", "Tsit5", "Vern7")
STIFF = ("Rosenbrock23", "Rodas4", "Rodas5P", "TRBDF2")


def solution_items(name: str, sol: Any) -> Iterator[tuple[str, Any]]:
    yield f"{name}/t", np.asarray(sol.t)
    yield f"{name}/u", np.asarray(sol.u)
    yield f"{name}/retcode", str(sol.retcode)
    stats = sol.stats
    for field in ("nf", "naccept", "nreject"):
        yield f"{name}/{field}", np.asarray(getattr(stats, field))


def single_solves() -> Iterator[tuple[str, Any]]:
    for method in EXPLICIT:
        alg = getattr(dxode, method)()
        dt = {"dt": 1e-3} if method in ("Euler", "RK4") else {}
        sol = dxode.solve(LORENZ, alg, rtol=1e-7, atol=1e-9, **dt)
        yield from solution_items(f"single/{method}", sol)
        yield f"single/{method}/dense", np.asarray(sol(np.linspace(0.0, 2.9, 17)))
        saved = dxode.solve(LORENZ, alg, saveat=0.25, rtol=1e-6, atol=1e-8, **dt)
        yield from solution_items(f"single/{method}/saveat", saved)
    stopped = dxode.solve(LORENZ, dxode.Tsit5(), tstops=[0.3, 1.7], saveat=[0.1, 1.7, 2.9])
    yield from solution_items("single/tstops", stopped)
    f32 = dxode.ODEProblem(
        lorenz, np.array([1.0, 0.0, 0.0], np.float32), (0.0, 1.0), (10.0, 28.0, 8 / 3)
    )
    yield from solution_items("single/float32", dxode.solve(f32, dxode.Tsit5(), rtol=1e-4))


def stiff_solves() -> Iterator[tuple[str, Any]]:
    vdp = dxode.ODEProblem(van_der_pol, np.array([2.0, 0.0]), (0.0, 6.0), 50.0)
    rober = dxode.ODEProblem(robertson, np.array([1.0, 0.0, 0.0]), (0.0, 1e4))
    for method in STIFF:
        alg = getattr(dxode, method)()
        yield from solution_items(f"stiff/{method}/vdp", dxode.solve(vdp, alg, rtol=1e-6))
        sol = dxode.solve(rober, alg, rtol=1e-6, atol=1e-10, saveat=[1.0, 100.0, 1e4])
        yield from solution_items(f"stiff/{method}/robertson", sol)


def event_solves() -> Iterator[tuple[str, Any]]:
    ball = dxode.ODEProblem(fall, np.array([10.0, 0.0]), (0.0, 8.0), 0.8)
    continuous = dxode.ContinuousCallback(height, bounce, direction="down")
    sol = dxode.solve(ball, dxode.Tsit5(), callback=continuous, rtol=1e-8)
    yield from solution_items("events/continuous", sol)
    yield "events/continuous/times", np.asarray(sol.events.t)
    kick = dxode.DiscreteCallback(
        lambda u, p, t: u[0] < 2.0, lambda u, p, t, fired: [u[0] + 0.5, u[1]]
    )
    preset = dxode.PresetTimeCallback([1.0, 2.5], lambda u, p, t, fired: [u[0], 0.5 * u[1]])
    sol = dxode.solve(ball, dxode.DP5(), callback=[kick, preset], rtol=1e-7)
    yield from solution_items("events/discrete_preset", sol)
    drops = dxode.EnsembleProblem(
        ball,
        u0=np.stack([np.array([h, 0.0]) for h in (4.0, 9.0, 15.0)]),
        p=np.array([0.5, 0.7, 0.9]),
    )
    sim = dxode.solve(drops, dxode.Tsit5(), callback=continuous, saveat=0.5, rtol=1e-7)
    yield "events/ensemble/u", np.asarray(sim.u)
    yield "events/ensemble/retcodes", np.asarray([str(r) for r in sim.retcodes])


def lorenz_ensemble(**kwargs: Any) -> dxode.EnsembleProblem:
    rho = np.linspace(20.0, 30.0, 24)
    p = (np.full(24, 10.0), rho, np.full(24, 8 / 3))
    return dxode.EnsembleProblem(LORENZ, p=p, **kwargs)


def draw(prob: Any, ctx: Any) -> Any:
    return prob.remake(u0=prob.u0 + ctx.rng.normal(size=3))


def ensemble_solves(client: Any) -> Iterator[tuple[str, Any]]:
    algorithms = {
        "serial": dxode.EnsembleSerial(),
        "array": dxode.EnsembleArray(),
        "dask": dxode.EnsembleDask(client),
    }
    for name, ensemble_alg in algorithms.items():
        sim = dxode.solve(
            lorenz_ensemble(), dxode.Tsit5(), ensemble_alg, saveat=0.5, batch_size=7, rtol=1e-7
        )
        yield f"ensemble/{name}/u", np.asarray(sim.u)
        yield f"ensemble/{name}/nf", np.asarray(sim.stats.nf)
        drawn = dxode.EnsembleProblem(LORENZ, prob_func=draw)
        sim = dxode.solve(
            drawn, dxode.Tsit5(), ensemble_alg, trajectories=10, seed=5, saveat=1.0, batch_size=4
        )
        yield f"ensemble/{name}/prob_func", np.asarray(sim.u)
        reduced = lorenz_ensemble(
            output_func=lambda sol, i: (sol.u[-1][0], False),
            reduction=lambda acc, values, idx: (acc + sum(values), False),
            u_init=0.0,
        )
        sim = dxode.solve(reduced, dxode.Tsit5(), ensemble_alg, batch_size=5)
        yield f"ensemble/{name}/reduction", np.asarray(sim.u)


SENSEALGS = {
    "discrete": dxode.DiscreteAdjoint(),
    "discrete_checkpoint": dxode.DiscreteAdjoint(checkpoint_every=3),
    "interpolating": dxode.InterpolatingAdjoint(),
    "backsolve": dxode.BacksolveAdjoint(),
    "forward": dxode.ForwardSensitivity(),
}


def gradient_items(client: Any) -> Iterator[tuple[str, Any]]:
    base = dxode.ODEProblem(decay, np.array([1.0, 2.0]), (0.0, 2.0), np.array([0.5, 1.5]))

    def single_loss(theta: Any, sensealg: Any, alg: Any) -> Any:
        prob = base.remake(u0=theta[:2], p=theta[2:])
        sol = dxode.solve(prob, alg, saveat=[0.5, 1.0, 2.0], sensealg=sensealg, rtol=1e-8)
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 2.0, 0.5, 1.5])
    for name, sensealg in SENSEALGS.items():
        grad = autograd.grad(single_loss)(theta, sensealg, dxode.Tsit5())
        yield f"gradient/single/{name}", grad
    stiff_grad = autograd.grad(single_loss)(theta, dxode.InterpolatingAdjoint(), dxode.Rodas5P())
    yield "gradient/single/rodas5p", stiff_grad

    def ensemble_loss(p: Any, sensealg: Any, ensemble_alg: Any) -> Any:
        k = anp.linspace(0.5, 1.5, 6)
        eprob = dxode.EnsembleProblem(base, p=anp.stack([k * p[0], k * p[1]], axis=1))
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            ensemble_alg,
            saveat=[1.0, 2.0],
            sensealg=sensealg,
            batch_size=4,
            rtol=1e-7,
        )
        return anp.sum(sim.u**2)

    p = np.array([0.5, 1.5])
    for ensemble_name, ensemble_alg in (
        ("array", dxode.EnsembleArray()),
        ("dask", dxode.EnsembleDask(client)),
    ):
        for name, sensealg in SENSEALGS.items():
            grad = autograd.grad(ensemble_loss)(p, sensealg, ensemble_alg)
            yield f"gradient/ensemble/{ensemble_name}/{name}", grad


def record() -> dict[str, Any]:
    from distributed import Client, LocalCluster

    items: dict[str, Any] = {}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        sources = (
            single_solves(),
            stiff_solves(),
            event_solves(),
            ensemble_solves(client),
            gradient_items(client),
        )
        for source in sources:
            for key, value in source:
                if key in items:
                    raise RuntimeError(f"duplicate key {key}")
                items[key] = np.asarray(value)
    return items


def compare(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    problems = [f"missing now: {key}" for key in recorded if key not in now]
    problems += [f"new now: {key}" for key in now if key not in recorded]
    for key in recorded.keys() & now.keys():
        a, b = recorded[key], now[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{key}: {a.dtype}{a.shape} recorded, {b.dtype}{b.shape} now")
        elif a.tobytes() != b.tobytes():
            diff = np.max(np.abs(a - b)) if a.dtype.kind == "f" else "values"
            problems.append(f"{key}: bits differ (max |diff| {diff})")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("record", "compare"):
        print(__doc__)
        return 2
    items = record()
    if argv[1] == "record":
        np.savez(argv[2], **{k.replace("/", "|"): v for k, v in items.items()})
        print(f"recorded {len(items)} outputs to {argv[2]}")
        return 0
    with np.load(argv[2]) as data:
        recorded = {k.replace("|", "/"): data[k] for k in data.files}
    problems = compare(recorded, items)
    for line in problems:
        print(line)
    print(f"{len(recorded)} recorded, {len(items)} now, {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
