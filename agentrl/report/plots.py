"""A report's plots as matplotlib Figures: one panel per unit, sharing the x axis.

Figures are made without pyplot and drawn by Agg whatever MPLBACKEND says: reports are written on
login and compute nodes that have no display, and no figure lingers in a global registry.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .data import Plot, Series

PANEL_HEIGHT_IN = 2.6


def draw(plot: Plot) -> Figure:
    if not plot.panels:
        raise ValueError(f"plot {plot.name!r} has nothing to draw ({plot.skipped})")
    fig = Figure(figsize=(8, 0.8 + PANEL_HEIGHT_IN * len(plot.panels)), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(plot.title)
    axes = fig.subplots(len(plot.panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, panel in zip(axes, plot.panels, strict=True):
        if panel.kind == "stacked_bars":
            _stacked_bars(ax, panel.series)
        else:
            _lines(ax, panel.series)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))    # rollouts and checkpoints are counts
    axes[-1].set_xlabel(plot.xlabel)
    return fig


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=100)


def _lines(ax: Axes, series: dict[str, Series]) -> None:
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=4, label=name)   # markers: a single rollout is still a point


def _stacked_bars(ax: Axes, series: dict[str, Series]) -> None:
    top: dict[int, float] = {}
    for name, (xs, ys) in series.items():
        ax.bar(xs, ys, bottom=[top.get(x, 0.0) for x in xs], width=0.8, label=name)
        for x, y in zip(xs, ys, strict=True):
            top[x] = top.get(x, 0.0) + y
    ax.set_ylim(bottom=0)       # counts: all-zero bars would otherwise sit mid-axis
