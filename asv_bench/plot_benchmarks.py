"""Draw the benchmarks page's figures from the comparison scripts' JSON results.

Each comparison runs dxode and its peers in one process and writes its measurements with
``--json``; this script only plots them, so a figure always shows numbers that were measured
together. The inputs live in ``docs/benchmarks/`` (committed with the page):

* ``ensemble.json`` from ``compare_ensemble.py --json``: total time against ensemble size,
  log-log, for dxode and every peer;
* ``dask_scaling.json`` from ``dask_scaling.py --scaling --json``: time against workers;
* ``gradient_cost.json`` from ``gradient_cost.py --json``: (forward + gradient) / forward.

A missing input is reported and its figure skipped. Usage::

    python asv_bench/plot_benchmarks.py [--data docs/benchmarks] [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENSEMBLE_CODES = {
    "dxode": "dxode EnsembleArray (Tsit5)",
    "loop": "SciPy solve_ivp loop (RK45)",
    "stacked": "SciPy solve_ivp stacked (RK45)",
    "diffrax": "Diffrax jit(vmap) (Tsit5)",
    "torchode": "torchode (Tsit5)",
}


def _figure(width: float = 6.4) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def plot_ensemble(data: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    """Total wall time against trajectories, one line per code (log-log)."""
    fig, ax = _figure()
    rows = sorted(data["rows"], key=lambda r: r["n"])
    for key, label in ENSEMBLE_CODES.items():
        points = [(r["n"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            n, seconds = zip(*points, strict=True)
            ax.loglog(n, seconds, marker="o", label=label)
    ax.set(xlabel="trajectories", ylabel="wall time (s), one core")
    ax.set_title("Lorenz ensemble, t in [0, 10], rtol = atol = 1e-6, float64", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "ensemble_time.png"
    fig.savefig(path, dpi=110)
    return path


def plot_dask_scaling(data: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    """Wall time of one ensemble in this process and on 1, 2, ... Dask workers."""
    fig, ax = _figure()
    scaling = data["scaling"]
    seconds = {int(k): v for k, v in scaling["seconds"].items()}
    labels = ["in process" if w == 0 else f"{w} worker{'s' * (w > 1)}" for w in sorted(seconds)]
    ax.bar(labels, [seconds[w] for w in sorted(seconds)], color="tab:blue")
    ax.set(ylabel="wall time (s)")
    ax.set_title(f"{scaling['n']:,} Lorenz trajectories on a Dask LocalCluster", fontsize=9)
    path = out / "dask_scaling.png"
    fig.savefig(path, dpi=110)
    return path


def plot_gradient_cost(data: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    """(forward + gradient) / forward for each code, with the ratio-2 target."""
    fig, ax = _figure(width=8.0)
    rows = [r for r in data["rows"] if r.get("ratio") is not None]
    ax.barh([r["code"] for r in rows], [r["ratio"] for r in rows], color="tab:green")
    ax.axvline(2.0, color="black", lw=0.8, ls="--", label="target 2")
    ax.set(xlabel="(forward + gradient) / forward")
    ax.set_title(data.get("title", "gradient cost"), fontsize=9)
    ax.legend(fontsize=8)
    path = out / "gradient_cost.png"
    fig.savefig(path, dpi=110)
    return path


PLOTS = {
    "ensemble.json": plot_ensemble,
    "dask_scaling.json": plot_dask_scaling,
    "gradient_cost.json": plot_gradient_cost,
}


def main(argv: list[str] | None = None) -> list[pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in PLOTS.items():
        source = args.data / name
        if not source.exists():
            print(f"skipped {name}: not measured yet ({source} is missing)")
            continue
        written.append(plot(json.loads(source.read_text(encoding="utf-8")), args.out))
        print(f"wrote {written[-1]}")
    return written


if __name__ == "__main__":
    main()
