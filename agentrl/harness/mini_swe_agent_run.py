"""Runs mini-swe-agent's `mini` command from the tools directory, then prints a summary line.

Installed as TOOLS/mini-swe-agent/agentrl_mini.py and run by the Python bundled beside it, isolated from
the task image's Python (agentrl/harness/mini_swe_agent.py builds both):

    LD_LIBRARY_PATH=TOOLS/mini-swe-agent/python/lib \\
    TOOLS/mini-swe-agent/python/bin/python3 -I -S TOOLS/mini-swe-agent/agentrl_mini.py [MINI OPTIONS] -- TASK
    ... --version    prints "mini-swe-agent VERSION" once everything imports

`-I -S`: no PYTHON* variables, no user or system site directories; the packages come from
TOOLS/mini-swe-agent/site only. The bundled libraries' directory is taken back out of LD_LIBRARY_PATH
before anything runs, so the agent's commands see the image's own libraries (the loader read it at start).

The last stdout line is {"final_text", "turns", "tool_calls", "exit_reason"}: the reasoning text of
the last model reply, the model calls, the commands run, and mini-swe-agent's exit status. Exit codes:
0 the agent submitted, 2 it stopped without submitting (format errors, limits), 1 an exception.
Stdlib only until the site directory is added.
"""

from __future__ import annotations

import json
import os
import site
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "python", "lib")
SITE = os.path.join(HERE, "site")


def restore_library_path() -> None:
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p.rstrip("/") != LIB]
    if parts:
        os.environ["LD_LIBRARY_PATH"] = ":".join(parts)
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


def text_of(content) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [text for p in content if isinstance(p, dict) and isinstance(text := p.get("text"), str)]
        return "".join(texts) if texts else None
    return None


def summary(agent) -> dict:
    messages = list(getattr(agent, "messages", []) or [])
    replies = [m for m in messages if m.get("role") == "assistant"]
    last = messages[-1] if messages else {}
    return {
        "final_text": text_of(replies[-1].get("content")) if replies else None,
        "turns": int(getattr(agent, "n_calls", len(replies))),
        "tool_calls": sum(len((m.get("extra") or {}).get("actions") or []) for m in replies),
        "exit_reason": (last.get("extra") or {}).get("exit_status") if last.get("role") == "exit" else None,
    }


def main(argv: list[str]) -> int:
    restore_library_path()
    site.addsitedir(SITE)
    if argv == ["--version"]:
        os.environ.update(MSWEA_SILENT_STARTUP="1")
        # From SITE, not agentrl's environment; the model classes: the model layer must import too.
        import agentrl_mini_model  # type: ignore[import-not-found]  # noqa: F401
        import minisweagent  # type: ignore[import-not-found]
        print(f"mini-swe-agent {minisweagent.__version__}")
        return 0
    if len(argv) < 2 or argv[-2] != "--":
        print("usage: agentrl_mini.py [MINI OPTIONS] -- TASK", file=sys.stderr)
        return 64
    options, task = argv[:-2], argv[-1]

    import minisweagent.run.mini as mini  # type: ignore[import-not-found]

    agents = []
    make_agent = mini.get_agent

    def get_agent(*args, **kwargs):
        agents.append(make_agent(*args, **kwargs))
        return agents[-1]
    mini.get_agent = get_agent
    code = 1
    try:
        mini.app(args=[*options, f"--task={task}"], prog_name="mini", standalone_mode=False)
        code = 0 if agents and summary(agents[-1])["exit_reason"] == "Submitted" else 2
    except SystemExit as e:   # click's own exits (a bad option) and the agent's
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - reported in the summary, then the exit code
        print(f"mini-swe-agent failed: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        result = summary(agents[-1]) if agents else {"final_text": None, "turns": 0, "tool_calls": 0,
                                                     "exit_reason": None}
        sys.stdout.flush()
        print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
