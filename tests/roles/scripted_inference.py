"""A role program: the run's inference server with scripted token choices (tests/scripted_upstream.py).

    python tests/roles/scripted_inference.py MODEL_DIR        (under agentrl launch: AGENTRL_RUN_DIR, ...)

Every agent session it serves does one shell call, then answers. Sessions alternate between a call
that fixes the bundled task roman-subtractive and one that only lists files, so a group's attempts
get different rewards. Every sampled output is appended to RUN/logs/sampled.jsonl, so a test can
compare the trained tokens with what was sampled. It registers as inference-<i>, heartbeats, and
stops at SIGTERM; it honours SGLang's reload protocol enough for the trainer's publishing.
"""

import itertools
import json
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # tests/
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))       # the repository

from scripted_upstream import ScriptedUpstream  # noqa: E402

from hpc.environment import RoleEnv  # noqa: E402
from hpc.registry import Registry  # noqa: E402

FIX = ("python3 -c \"import pathlib; p = pathlib.Path('roman/convert.py'); "
       "p.write_text(p.read_text().replace('(10, \\\"X\\\"), (5, \\\"V\\\"), (1, \\\"I\\\"),', "
       "'(10, \\\"X\\\"), (9, \\\"IX\\\"), (5, \\\"V\\\"), (4, \\\"IV\\\"), (1, \\\"I\\\"),'))\"")
LOOK = "ls -la"
DONE = {"role": "assistant", "content": "Done.", "reasoning_content": "That should do it."}


def call(tool: str, command: str) -> dict:
    return {"role": "assistant", "content": "", "reasoning_content": "A shell call.",
            "tool_calls": [{"id": "x", "type": "function",
                            "function": {"name": tool, "arguments": {"command": command}}}]}


def main() -> int:
    model, tool = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "Bash"
    env = RoleEnv.from_environ()
    run = Path(env.run_dir)
    sampled = run / "logs" / "sampled.jsonl"
    sessions = itertools.count()
    lock = threading.Lock()

    with ScriptedUpstream(model) as upstream:
        def choose(request: dict) -> dict:
            text = upstream.tokenizer.decode(request["input_ids"])
            with lock:
                step = DONE if "<tool_response>" in text else call(tool, FIX if next(sessions) % 2 == 0 else LOOK)
                with open(sampled, "a") as f:
                    f.write(json.dumps(upstream.output_ids(step)) + "\n")
            return step
        upstream.push(*[choose] * 100_000)
        port = int(upstream.url.rsplit(":", 1)[1])
        registry = Registry(run / "services")
        record = registry.register("inference", env.task_index, host="127.0.0.1", port=port)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        print(f"scripted inference on {upstream.url}", flush=True)
        while not stop.wait(2):
            record = registry.heartbeat(record)
        registry.deregister(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
