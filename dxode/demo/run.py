"""The ``dxode demo`` command: a Lorenz solve, a Lorenz ensemble and a parameter fit on Dask."""

from __future__ import annotations

import contextlib
import pathlib
import sys
import time
from typing import Any

import numpy as np

from .. import EnsembleDask, EnsembleProblem, ODEProblem, Tsit5, solve
from ..ensemble.cluster import jobqueue_cluster, local_cluster
from .fit import INITIAL_GUESS, TRUE_PARAMETERS, fit_parameters
from .lorenz import lorenz

PLOT_EXTRA_HINT = 'plotting needs matplotlib: install it with  pip install "dxode[plot]"'
SCHEDULER_TIMEOUT_S = 5


def run_demo(
    output: pathlib.Path,
    trajectories: int = 100_000,
    workers: int | None = None,
    scheduler: str | None = None,
    backend: str = "auto",
    fit_iterations: int = 60,
    jobqueue: str | None = None,
) -> int:
    """Solve Lorenz once, as an ensemble of ``trajectories`` on Dask, then fit its parameters.

    The ensemble perturbs (sigma, rho, beta) by up to ±5 % per trajectory; the fit recovers
    them from noisy synthetic data with adjoint gradients computed on the workers and Adam
    (``fit_iterations`` steps; 0 skips it). The cluster is an embedded local one (``workers``
    processes; a CUDA cluster with ``backend="cupy"``, which "auto" picks when CuPy sees a
    GPU), the running scheduler at
    ``scheduler``, or ``workers`` dask-jobqueue jobs of the batch system ``jobqueue``
    configured in Dask's ``jobqueue`` settings. Returns the process exit status.
    """
    backend, problem = _checked_setup(backend)
    if problem:
        print(f"dxode demo: {problem}", file=sys.stderr)
        return 1
    try:
        cluster = _cluster(scheduler, jobqueue, workers, backend)
    except (ImportError, ValueError) as exc:
        print(f"dxode demo: {exc}", file=sys.stderr)
        return 1

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_single, ax_ensemble = fig.subplots(1, 2, width_ratios=(1, 1.6))
    with cluster as address_or_cluster:
        try:
            client = _client(address_or_cluster, scheduler)
        except (OSError, ValueError) as exc:  # unreachable, or not an address
            print(f"dxode demo: cannot connect to --scheduler {scheduler}: {exc}", file=sys.stderr)
            return 1
        with client:
            if not _single_solve(ax_single):
                return 1
            print()
            _wait_for_workers(client, jobqueue, workers, backend)
            sim, rate = _ensemble(client, trajectories, backend)
            fit = None
            if fit_iterations:
                print()
                fit = _fit(client, fit_iterations)
    sim.plot(component=0, ax=ax_ensemble, label="x")
    ax_ensemble.set_title(f"{trajectories:,} Lorenz trajectories, parameters ±5 %")
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    _print_summary(sim, rate, fit, output)
    return 0 if sim.success else 1


def _checked_setup(backend: str) -> tuple[str, str | None]:
    """The backend to use ("auto" resolved) and what is missing to run the demo, if anything."""
    try:
        import matplotlib.backends.backend_agg  # checked here, used by run_demo
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return backend, PLOT_EXTRA_HINT
    try:
        import distributed  # noqa: F401 (checked here, used by _client)
    except ImportError:
        return backend, 'the ensemble runs on Dask: pip install "dxode[dask,plot]"'
    from ..backends import cupy_available

    if backend == "auto":
        backend = "cupy" if cupy_available() else "numpy"
    if backend == "cupy" and not cupy_available():
        return backend, (
            "--backend cupy needs CuPy and an NVIDIA GPU; none was found "
            "(install dxode[gpu] on a GPU machine, or use --backend numpy)"
        )
    return backend, None


def _wait_for_workers(client: Any, jobqueue: str | None, workers: int | None, backend: str) -> None:
    """Wait for batch-system jobs to bring up workers, then say what the cluster is."""
    if jobqueue is not None:
        print(f"waiting for {workers or 1} {jobqueue} job(s) to start Dask workers ...")
        client.wait_for_workers(workers or 1, timeout=600)
    workers_now = len(client.scheduler_info()["workers"])
    print(f"Dask cluster: {workers_now} workers, {backend} backend")


def _print_summary(sim: Any, rate: float, fit: dict[str, Any] | None, output: pathlib.Path) -> None:
    print()
    print("summary")
    print(f"  ensemble   {rate:,.0f} trajectories/s, {sim.stats.total_steps:,} steps")
    if fit is not None:
        print(
            f"  fit        loss {fit['history'][0]:.3g} -> {fit['loss']:.3g} in {fit['wall']:.1f} s"
        )
    print(f"  plot       {output.resolve()}")


def _cluster(scheduler: str | None, jobqueue: str | None, workers: int | None, backend: str) -> Any:
    """A context manager giving what ``distributed.Client`` connects to."""
    if scheduler is not None and jobqueue is not None:
        raise ValueError("give either --scheduler or --jobqueue, not both")
    if scheduler is not None:
        return contextlib.nullcontext(scheduler)
    if jobqueue is not None:
        return jobqueue_cluster(jobqueue, workers or 1)

    return local_cluster(gpus=backend == "cupy", n_workers=workers)


def _client(address_or_cluster: Any, scheduler: str | None) -> Any:
    """A client of the cluster; the one at ``--scheduler`` must answer within a few seconds."""
    import distributed

    # Not this process's default client: Dask makes a client the default before it connects
    # and leaves it so when connecting fails, and every later dask.compute then hangs.
    if scheduler is None:
        return distributed.Client(address_or_cluster, set_as_default=False)
    return distributed.Client(scheduler, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False)


def _single_solve(ax: Any) -> bool:
    prob = ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 100.0), (10.0, 28.0, 8 / 3))
    start = time.perf_counter()
    sol = solve(prob, Tsit5(), rtol=1e-8, atol=1e-8)
    wall = time.perf_counter() - start
    stats = sol.stats
    u5 = np.asarray(sol(5.0))
    print("Lorenz system, sigma=10, rho=28, beta=8/3, u0=(1, 0, 0), t in [0, 100]")
    print("method Tsit5, rtol=1e-8, atol=1e-8")
    print(f"retcode      {sol.retcode.name} ({sol.retcode.message})")
    print(f"steps        {stats.naccept} accepted, {stats.nreject} rejected")
    print(f"RHS evals    {stats.nf}")
    print(f"wall time    {wall:.3f} s")
    print(f"sol(5.0)     [{u5[0]:.8f}, {u5[1]:.8f}, {u5[2]:.8f}]")
    # Plot from the dense output on a fine grid (every step's own interpolant).
    t = np.linspace(0.0, 100.0, 20_001)
    u = np.asarray(sol(t))
    ax.plot(u[:, 0], u[:, 2], lw=0.4)
    ax.set(xlabel="x", ylabel="z", title="Lorenz attractor (x–z projection)")
    return sol.success


def _perturbed_parameters(prob: Any, ctx: Any) -> dict[str, Any]:
    return {"p": np.array([10.0, 28.0, 8 / 3]) * (1 + 0.1 * (ctx.uniform(3) - 0.5))}


def _ensemble(client: Any, trajectories: int, backend: str) -> tuple[Any, float]:
    prob = ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), (10.0, 28.0, 8 / 3))
    eprob = EnsembleProblem(prob, batch_func=_perturbed_parameters)
    # The progress bar draws only where standard error is a terminal (EnsembleDask's default).
    alg = EnsembleDask(client, backend=backend if backend != "numpy" else None)
    start = time.perf_counter()
    sim = solve(
        eprob, Tsit5(), alg, trajectories=trajectories, saveat=0.5, rtol=1e-6, atol=1e-6, seed=0
    )
    wall = time.perf_counter() - start
    print(f"ensemble     {trajectories:,} trajectories, t in [0, 10], Tsit5, rtol=atol=1e-6")
    print(f"failures     {sim.failures() or 'none'}")
    print(
        f"steps        {sim.stats.total_steps:,} ({sim.stats.total_steps / trajectories:.0f} "
        f"per trajectory), RHS evals {sim.stats.total_nf:,}"
    )
    print(f"wall time    {wall:.2f} s ({trajectories / wall:,.0f} trajectories/s)")
    return sim, trajectories / wall


def _fit(client: Any, iterations: int) -> dict[str, Any]:
    print("fit: recover (sigma, rho, beta) from noisy observations of 32 trajectories, t in [0, 1]")
    print(
        f"     start {_triple(INITIAL_GUESS)}, truth {_triple(TRUE_PARAMETERS)}; Adam on "
        "log-parameters, gradients by the discrete adjoint on the workers"
    )
    fit = fit_parameters(EnsembleDask(client), iterations=iterations)
    sigma, rho, beta = fit["parameters"]
    print(f"fitted       sigma {sigma:.3f}, rho {rho:.3f}, beta {beta:.3f}")
    return fit


def _triple(values: np.ndarray) -> str:
    return "(" + ", ".join(f"{v:.3f}" for v in values) + ")"
