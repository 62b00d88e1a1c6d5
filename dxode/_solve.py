"""``solve``: the front door. It checks the request and sends it down one layer: a single
solve, an ensemble, or (when autograd differentiates it) the sensitivity package."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ._options import SolverOptions
from ._problem import ODEProblem
from ._single import solve_problem
from ._solution import ODESolution
from ._tracing import is_traced
from ._validation import check_flag
from .ensemble.problem import EnsembleProblem
from .ensemble.solution import EnsembleSolution
from .ensemble.solve import EnsemblePlan, plan_ensemble, run_ensemble
from .ensemble.tracing import differentiated
from .events.callbacks import as_callback_set, check_preset_times
from .sensitivity import SENSEALGS, solve_ensemble_traced, solve_single_traced

__all__ = ["solve"]

_OPTION_NAMES = tuple(
    name
    for name in inspect.signature(SolverOptions.from_user).parameters
    if name not in ("cls", "alg")
)


# Keywords of SciPy's solve_ivp and of DifferentialEquations.jl, and what dxode calls them.
_OTHER_NAMES = {
    "method": "the algorithm, solve's second argument: solve(prob, Tsit5())",
    "t_eval": "saveat=",
    "dense_output": "dense=",
    "events": "callback=",
    "first_step": "dt=",
    "max_step": "dtmax=",
    "min_step": "dtmin=",
    "args": "p, given to ODEProblem(f, u0, tspan, p)",
    "reltol": "rtol=",
    "abstol": "atol=",
    "d_discontinuities": "tstops=",
}


def solve(
    prob: ODEProblem | EnsembleProblem,
    alg: Any = None,
    ensemble_alg: Any = None,
    *,
    saveat: Any = None,
    dense: bool | None = None,
    tstops: Any = None,
    callback: Any = None,
    trajectories: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    sensealg: Any = None,
    kernel: bool = False,
    **options: Any,
) -> ODESolution | EnsembleSolution:
    """Solve an ODE problem, or an ensemble of them.

    Parameters
    ----------
    prob : ODEProblem or EnsembleProblem
        The problem. For an ``EnsembleProblem`` the result is an ``EnsembleSolution``, and
        ``trajectories`` is required unless per-trajectory arrays fix it.
    alg : algorithm, optional
        ``Tsit5()`` (the default), ``DP5()``, ``BS3()``, ``Vern7()``, ``RK4()``, ``Euler()``;
        for stiff problems ``Rodas5P()``, ``Rodas4()``, ``Rosenbrock23()``, ``TRBDF2()``;
        ``AutoSwitch()`` to switch each trajectory between ``Tsit5`` and ``Rodas5P`` by its
        own stiffness; a class or a name such as ``"tsit5"``.
    saveat : float or array_like, optional
        Save at these times (or every ``saveat`` time units, ends included, at most 10^7
        points). By default every accepted step is saved.
    dense : bool, optional
        Keep every step's interpolant so ``sol(t)`` works anywhere in the span. Defaults to
        true without ``saveat`` and false with it.
    tstops : array_like, optional
        Times the integrator must step to exactly (e.g. discontinuities of ``f``).
    callback : callback or CallbackSet, optional
        Events: ``ContinuousCallback``, ``DiscreteCallback``, ``PresetTimeCallback``, a
        ``CallbackSet`` or a list of them, applied per trajectory (see the events guide).
        The events that fired are in ``sol.events``. Differentiable (see the gradients
        guide).
    ensemble_alg : EnsembleArray, EnsembleSerial, EnsembleKernel, EnsembleDask, or Client, optional
        Ensembles only: how batches are computed (default ``EnsembleArray()``, in this
        process); ``EnsembleKernel()`` compiles each trajectory's integration (numba, see the
        kernels guide); ``EnsembleDask()`` runs them as Dask tasks, and a
        ``distributed.Client`` is shorthand for ``EnsembleDask(client)``.
    trajectories : int
        Ensembles only: how many trajectories. Defaults to the length of the
        ``EnsembleProblem``'s per-trajectory arrays when it has them (a smaller number
        solves the first ``trajectories`` of them).
    batch_size : int, optional
        Ensembles only: trajectories per batch (default 10,000 on NumPy, 10^6 on CuPy; with
        Dask, about four tasks per worker thread, at most those sizes).
    seed : int, optional
        Ensembles only: the master seed of the per-trajectory random streams (fresh entropy
        by default, recorded as ``sim.seed``).
    sensealg : optional
        How gradients are computed when ``u0`` or ``p`` are differentiated with autograd:
        ``DiscreteAdjoint()`` (the default for explicit methods; ``checkpoint_every=k`` bounds
        its memory), ``InterpolatingAdjoint()`` (the default for stiff methods),
        ``BacksolveAdjoint()`` or ``ForwardSensitivity()`` (see the gradients guide for which
        to use when). Ignored when nothing is differentiated. The compiled kernels
        (``kernel=True``, ``EnsembleKernel``) take ``None``, ``ForwardSensitivity()`` or
        ``DiscreteAdjoint()`` (see the kernels guide).
    kernel : bool
        Single problems: integrate with a compiled kernel (numba, ``dxode[kernel]``) instead
        of the array path: the same method and step control, much less overhead per step
        (see the kernels guide for what ``f`` may contain). Every step is saved without
        ``saveat``; no dense output. Ensembles use ``ensemble_alg=EnsembleKernel()``.
        Differentiable with autograd: forward sensitivities compiled with the kernel, or its
        discrete adjoint for many parameters, the derivatives of ``f`` by complex step (or
        its ``jac`` and ``paramjac``); through callbacks too (explicit methods).

    Other Parameters
    ----------------
    rtol : float
        Relative tolerance (default ``1e-3``).
    atol : float or array
        Absolute tolerance (default ``1e-6``), or an array with ``u0``'s shape.
    dt : float, optional
        The step of fixed-step methods; the first step of adaptive ones (else automatic).
    adaptive : bool, optional
        Adapt the step to the error estimate (default: whenever the method can).
    controller : PIDController, optional
        Step-size controller; ``PIController()`` by default.
    maxiters : int
        Maximum number of steps (accepted or rejected), default ``100_000``.
    dtmin : float, optional
        Smallest step size of adaptive solves: a trajectory fails (``DtLessThanMin``) when
        the controller proposes a smaller step, except for a step landing on the end or a
        tstop after an accepted step (taken at ``dtmin``, it lands). By default a trajectory
        fails when a rejected step proposes a step below ``16 * eps * |t|`` at its current
        time ``t``: too small to move ``t``.
    dtmax : float, optional
        Largest step size (one that needs more than ``maxiters`` steps to cover ``tspan``
        raises ``ValueError``, unless a callback may terminate the solve).

    Returns
    -------
    ODESolution or EnsembleSolution
        ``sol.t``, ``sol.u`` (``(len(t), *u0.shape)``), ``sol.retcode``, ``sol.stats`` and
        ``sol(t)``; for ensembles ``sim.u`` is ``(trajectories, len(t), *u0.shape)``.

    Notes
    -----
    For an ensemble without ``saveat``, each trajectory's start and end are saved. Dense
    output of ensembles (``dense=True``) keeps every step of every trajectory: use it for
    small ensembles only.
    """
    _check_keywords(options, sensealg)
    callbacks = as_callback_set(callback)
    check_flag("kernel", kernel)
    check_flag("dense", dense, allow_none=True)
    if kernel:
        if isinstance(prob, EnsembleProblem):
            raise TypeError(
                "kernel=True is for a single ODEProblem; solve an EnsembleProblem with "
                "ensemble_alg=EnsembleKernel()"
            )
        from .kernels.single import solve_kernel

        return solve_kernel(
            prob,
            alg,
            saveat=saveat,
            dense=dense,
            tstops=tstops,
            callback=callbacks,
            sensealg=sensealg,
            options=options,
        )
    if isinstance(prob, EnsembleProblem):
        plan = plan_ensemble(
            prob,
            alg,
            ensemble_alg,
            trajectories=trajectories,
            batch_size=batch_size,
            saveat=saveat,
            dense=dense,
            tstops=tstops,
            seed=seed,
            options=options,
            callback=callbacks,
        )
        traced, eprob = differentiated(plan.eprob, plan.seed, plan.first_batch())
        plan = dataclasses.replace(plan, eprob=eprob)
        return _solve_ensemble_traced(plan, sensealg) if traced else run_ensemble(plan)
    if not isinstance(prob, ODEProblem):
        raise TypeError(
            f"solve expects an ODEProblem or EnsembleProblem, got {type(prob).__name__}"
        )
    for name, value in (
        ("ensemble_alg", ensemble_alg),
        ("trajectories", trajectories),
        ("batch_size", batch_size),
        ("seed", seed),
    ):
        if value is not None:
            raise TypeError(f"{name} applies to an EnsembleProblem, not to a single ODEProblem")
    opts = SolverOptions.from_user(alg, **options)
    opts.check_state(prob.u0, prob.tspan)
    opts.check_step_budget(prob.tspan, callbacks)
    check_preset_times(callbacks, *sorted(prob.tspan))
    if is_traced(prob.u0, prob.p):
        if dense:
            raise NotImplementedError("dense output is not differentiable; use saveat")
        return solve_single_traced(
            prob,
            opts,
            saveat,
            tstops,
            sensealg,
            callbacks,
            lambda plain, cbs: (
                solve_problem(plain, opts, dense=False, tstops=tstops, callbacks=cbs).t
            ),
        )
    return solve_problem(prob, opts, saveat=saveat, dense=dense, tstops=tstops, callbacks=callbacks)


def _check_keywords(options: dict[str, Any], sensealg: Any) -> None:
    """Refuse unknown options (naming dxode's words for other libraries' keywords) and a
    sensealg that is not one."""
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        renamed = [f"{name}= is {_OTHER_NAMES[name]}" for name in unknown if name in _OTHER_NAMES]
        hint = f" (in dxode, {'; '.join(renamed)})" if renamed else ""
        raise TypeError(
            f"solve() got unknown option(s) {unknown}{hint}; valid options are saveat, dense, "
            f"tstops, {', '.join(_OPTION_NAMES)}"
        )
    if sensealg is not None and not isinstance(sensealg, SENSEALGS):
        raise TypeError(
            "sensealg must be DiscreteAdjoint(), InterpolatingAdjoint(), BacksolveAdjoint() or "
            f"ForwardSensitivity(), got {sensealg!r}"
        )


def _solve_ensemble_traced(plan: EnsemblePlan, sensealg: Any) -> EnsembleSolution:
    """An ensemble solve that autograd differentiates, by dxode.sensitivity."""
    ensemble_alg = plan.ensemble_alg
    if getattr(ensemble_alg, "lockstep", False):
        raise NotImplementedError(
            "lock-step ensembles are not differentiable: use EnsembleArray() (per-lane "
            "steps), or stack the trajectories into one ODEProblem with a (n, B) u0"
        )
    return solve_ensemble_traced(
        plan.eprob,
        plan.options,
        plan.trajectories,
        plan.batch_size,
        plan.saveat,
        plan.tstops,
        plan.seed,
        ensemble_alg.lanes_for_gradients(plan.batch_size),
        ensemble_alg,
        ensemble_alg.gradient_sensealg(sensealg),
        ensemble_alg.backend_name(),
        plan.callback,
    )
