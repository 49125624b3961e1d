"""Run reports: a run directory's metrics and eval results as Markdown with PNG plots.

data.py shapes what the run holds into series, rows and plot descriptions (pure but for `read_run`);
plots.py draws them; render.py writes report.md (the command: agentrl/commands/report.py).
"""

from .render import write_report

__all__ = ["write_report"]
