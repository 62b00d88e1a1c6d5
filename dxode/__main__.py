"""The ``dxode`` command line (also ``python -m dxode``).

Subcommands:

``dxode demo [--output lorenz.png] [--trajectories N] [--workers W]
[--scheduler ADDRESS | --jobqueue SYSTEM] [--backend auto|numpy|cupy] [--fit-iterations K]``
    Solve the Lorenz system once and as an ensemble on a Dask cluster (an embedded local one
    by default), fit its parameters to noisy data with adjoint gradients, print summaries and
    write a plot.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from . import __version__
from .demo.run import SCHEDULER_TIMEOUT_S
from .ensemble.cluster import JOBQUEUE_SYSTEMS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dxode", description="dxode: ODE solvers on NumPy, CuPy and array-API libraries."
    )
    parser.add_argument("--version", action="version", version=f"dxode {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="solve Lorenz once and as a Dask ensemble, fit its parameters, plot",
        description="Solve the Lorenz system once (Tsit5, rtol = atol = 1e-8, t in [0, 100]) "
        "and print its summary and sol(5.0); then solve an ensemble of Lorenz trajectories "
        "with perturbed parameters on an embedded local Dask cluster (or --scheduler), with a "
        "progress bar on a terminal, print trajectories/s and steps, and write a PNG with the "
        "attractor and the ensemble mean with its 5-95 % quantile band; then fit (sigma, rho, "
        "beta) to noisy observations of 32 trajectories with Adam, the gradients coming from "
        'discrete adjoints computed on the workers (needs pip install "dxode[dask,plot]").',
    )
    demo.add_argument(
        "--output",
        "-o",
        type=pathlib.Path,
        default=pathlib.Path("lorenz.png"),
        help="where to write the PNG plot (default: lorenz.png)",
    )
    demo.add_argument(
        "--trajectories",
        "-n",
        type=_positive,
        default=100_000,
        help="ensemble size (default: 100000)",
    )
    demo.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="worker processes of the embedded local cluster (default: one per core), or "
        "batch jobs with --jobqueue (default: 1)",
    )
    demo.add_argument(
        "--scheduler",
        default=None,
        help="address of a running Dask scheduler to use instead (tcp://host:8786); it must "
        f"answer within {SCHEDULER_TIMEOUT_S} s",
    )
    demo.add_argument(
        "--jobqueue",
        choices=JOBQUEUE_SYSTEMS,
        default=None,
        help="start the workers as batch jobs of this system with dask-jobqueue, configured "
        "by Dask's jobqueue settings (e.g. ~/.config/dask/jobqueue.yaml; pip install "
        '"dxode[hpc]")',
    )
    demo.add_argument(
        "--backend",
        choices=("auto", "numpy", "cupy"),
        default="auto",
        help="array backend of the ensemble's workers: cupy (a CUDA cluster, one worker per "
        "GPU), numpy, or auto (the default: cupy when CuPy sees a GPU, else numpy)",
    )
    demo.add_argument(
        "--fit-iterations",
        type=_non_negative,
        default=60,
        help="Adam iterations of the parameter fit (default: 60; 0 skips the fit)",
    )
    return parser


def _positive(text: str) -> int:
    return _integer_at_least(1, "a positive integer", text)


def _non_negative(text: str) -> int:
    return _integer_at_least(0, "a non-negative integer", text)


def _integer_at_least(low: int, expected: str, text: str) -> int:
    """``int(text)`` if it is ``>= low``; else argparse's error, naming what was expected."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(None if argv is None else [str(a) for a in argv])
    if args.command == "demo":
        from .demo.run import run_demo

        return run_demo(
            args.output,
            args.trajectories,
            args.workers,
            args.scheduler,
            args.backend,
            args.fit_iterations,
            args.jobqueue,
        )
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
