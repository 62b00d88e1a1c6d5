"""The ``dxode`` command line (also ``python -m dxode``).

Subcommands:

``dxode demo [--output lorenz.png]``
    Solve the Lorenz system, print a summary and write a plot.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from . import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dxode", description="dxode: ODE solvers on NumPy, CuPy and array-API libraries."
    )
    parser.add_argument("--version", action="version", version=f"dxode {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="solve the Lorenz system, print a summary and plot it",
        description="Solve the Lorenz system on t in [0, 100] with Tsit5 (rtol = atol = 1e-8), "
        "print retcode, step counts, RHS evaluations, wall time and sol(5.0), and write a PNG "
        'plot (needs matplotlib: pip install "dxode[plot]").',
    )
    demo.add_argument(
        "--output",
        "-o",
        type=pathlib.Path,
        default=pathlib.Path("lorenz.png"),
        help="where to write the PNG plot (default: lorenz.png)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(None if argv is None else [str(a) for a in argv])
    if args.command == "demo":
        from ._demo import run_demo

        return run_demo(args.output)
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
