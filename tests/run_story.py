"""What a failed run's assertion message shows: enough to find the cause in a CI log, where the run
directory is gone."""

from pathlib import Path


def what_happened(run_dir: Path, *outputs: bytes | str) -> str:
    """A run's story: launch's own output, how the run ended, and the end of every role's log and of
    each submitit job's driver log."""
    parts = [(o.decode(errors="replace") if isinstance(o, bytes) else o)[-3000:] for o in outputs]
    for name in ("run.json", "end.json"):
        record = run_dir / "launch" / name
        parts.append(f"== {name}\n{record.read_text() if record.exists() else '(none)'}")
    logs = [*sorted((run_dir / "logs").glob("*.log")), *sorted((run_dir / "launch/submitit").glob("*/*_log.err"))]
    parts += [f"== {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs]
    return "\n".join(parts)
