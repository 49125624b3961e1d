#!/usr/bin/env python3
"""agentrl's built-in agent: one `bash` tool over the OpenAI chat-completions API.

Standard library only and Python 3.9+, so it runs from the read-only tools directory in any image that
has a python3, Node or not:

    OPENAI_API_KEY=KEY python3 builtin_agent.py --base-url URL/v1 --model M --max-tokens N
        [--max-turns K] [--command-timeout S] [--retry-for S] -- PROMPT

It asks the model, runs every bash call in its working directory, answers each call, and stops at the
first reply without a tool call. No turn cap unless --max-turns. The last stdout line is
{"final_text", "turns", "tool_calls", "exit_reason"}; progress goes to stderr.

Exit status: 0 the model answered without a tool call; 2 that answer was cut by the token limit;
3 the API refused a request (4xx other than 429) or answered with something that is not a chat
completion; 4 the API kept failing (5xx, 429, no connection) for --retry-for seconds; 5 --max-turns
was reached.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

SYSTEM_PROMPT = (
    "You are a software engineering agent working in the repository at {cwd}. You act through the bash "
    "tool: each call runs one command with `bash -lc` in that directory and returns its output and exit "
    "code. Inspect the code, make the changes the task needs, and check them. When the task is done, reply "
    "with a short summary and no tool call: a reply without a tool call ends the session."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the repository and return its combined stdout and stderr "
                       "and its exit code.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
MAX_TOOL_OUTPUT = 20_000      # characters of a command's output the model sees (head and tail kept)
MAX_RETRY_DELAY_S = 30.0
EXIT_DONE, EXIT_LENGTH, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_MAX_TURNS = 0, 2, 3, 4, 5


class Refused(Exception):
    """The API answered 4xx: resending the same request cannot help."""


class Unreachable(Exception):
    """The API kept failing for the whole retry budget."""


def log(message: str) -> None:
    print(f"builtin_agent: {message}", file=sys.stderr, flush=True)


def post_json(url: str, body: dict, api_key: str, timeout_s: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def complete(url: str, body: dict, api_key: str, *, retry_for_s: float, timeout_s: float,
             sleep=time.sleep, clock=time.monotonic) -> dict:
    """One completion, retried with backoff while the server is restarting or overloaded (5xx, 429,
    connection errors, garbled replies); a 4xx is final."""
    deadline = clock() + retry_for_s
    delay = 1.0
    while True:
        try:
            return post_json(url, body, api_key, timeout_s)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if 400 <= e.code < 500 and e.code != 429:
                raise Refused(f"HTTP {e.code}: {detail}") from None
            error = f"HTTP {e.code}: {detail}"
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            error = repr(e)
        if clock() + delay > deadline:
            raise Unreachable(error)
        log(f"retrying in {delay:.0f} s after {error}")
        sleep(delay)
        delay = min(2 * delay, MAX_RETRY_DELAY_S)


def clip(text: str, limit: int = MAX_TOOL_OUTPUT) -> str:
    if len(text) <= limit:
        return text
    head = limit // 5   # the end of an output (the error, the summary line) is usually what matters
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head):]}"


def read_clipped(f, limit: int = MAX_TOOL_OUTPUT) -> str:
    """A command's output file as text, its middle cut when it is long, without reading all of a huge one."""
    size = f.seek(0, os.SEEK_END)
    span = 4 * limit   # bytes: enough for `limit` characters of any UTF-8 text
    f.seek(0)
    if size <= 2 * span:
        return clip(f.read().decode("utf-8", errors="replace"), limit)
    head = f.read(span).decode("utf-8", errors="replace")
    f.seek(size - span)
    tail = f.read(span).decode("utf-8", errors="replace")
    return clip(f"{head}\n[... {size - 2 * span} bytes cut ...]\n{tail}", limit)


class Shell:
    """Runs one command at a time in a process group of its own, so a timeout or a SIGTERM to the agent
    stops the command and everything it started."""

    def __init__(self, cwd: str, timeout_s: float):
        self.cwd, self.timeout_s = cwd, timeout_s
        self.current: subprocess.Popen | None = None

    def stop_current(self) -> None:
        if self.current is not None and self.current.poll() is None:
            try:
                os.killpg(self.current.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run(self, command: str) -> str:
        # Output goes to a file, not a pipe: a background job that keeps a pipe open would hang us.
        with tempfile.TemporaryFile() as out:
            self.current = subprocess.Popen(["bash", "-lc", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = self.current.wait(self.timeout_s)
                status = f"[exit code {code}]"
            except subprocess.TimeoutExpired:
                status = f"[timed out after {self.timeout_s:g} s; the command was killed]"
            # Whatever the command left running in its group goes with it.
            try:
                os.killpg(self.current.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.current.wait()
            text = read_clipped(out)
        if text and not text.endswith("\n"):
            text += "\n"
        return text + status


def tool_result(call: dict, shell: Shell) -> str:
    fn = call.get("function")
    if not isinstance(fn, dict):
        fn = {}
    if fn.get("name") != "bash":
        return f"error: unknown tool {fn.get('name')!r}; the only tool is bash"
    try:
        args = json.loads(fn.get("arguments") or "{}") if isinstance(fn.get("arguments"), str) else fn.get("arguments")
    except ValueError:
        args = None
    if not isinstance(args, dict) or not isinstance(args.get("command"), str):
        return 'error: bash takes JSON arguments {"command": "<a bash command line>"}'
    return shell.run(args["command"])


def run_agent(args: argparse.Namespace, api_key: str, shell: Shell) -> tuple[int, dict]:
    url = args.base_url.rstrip("/") + "/chat/completions"
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT.format(cwd=os.getcwd())},
                            {"role": "user", "content": args.prompt}]
    summary: dict[str, Any] = {"final_text": None, "turns": 0, "tool_calls": 0, "exit_reason": None}
    while args.max_turns is None or summary["turns"] < args.max_turns:
        body = {"model": args.model, "messages": messages, "tools": [BASH_TOOL], "max_tokens": args.max_tokens}
        try:
            reply = complete(url, body, api_key, retry_for_s=args.retry_for, timeout_s=args.request_timeout)
            choice = reply["choices"][0]
            message, finish = choice["message"], choice.get("finish_reason")
            if not isinstance(message, dict):
                raise TypeError("choices[0].message is not an object")
        except Refused as e:
            log(f"the API refused the request: {e}")
            return EXIT_REFUSED, {**summary, "exit_reason": "refused"}
        except Unreachable as e:
            log(f"giving up after {args.retry_for:g} s of failures: {e}")
            return EXIT_UNREACHABLE, {**summary, "exit_reason": "unreachable"}
        except (KeyError, IndexError, TypeError) as e:
            log(f"the API's reply is not a chat completion: {e!r}")
            return EXIT_REFUSED, {**summary, "exit_reason": "bad_reply"}
        summary["turns"] += 1
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        # Echo the turn back exactly as it came, reasoning included: the adapter matches history by tokens.
        echoed = {"role": "assistant", "content": message.get("content")}
        for key in ("reasoning_content", "tool_calls"):
            if message.get(key):
                echoed[key] = message[key]
        messages.append(echoed)
        summary["final_text"] = message.get("content") if isinstance(message.get("content"), str) else None
        if not calls:
            if finish == "length":
                return EXIT_LENGTH, {**summary, "exit_reason": "length"}
            return EXIT_DONE, {**summary, "exit_reason": "stop"}
        log(f"turn {summary['turns']}: {len(calls)} tool call(s)")
        for call in calls:
            summary["tool_calls"] += 1
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": tool_result(call, shell)})
    return EXIT_MAX_TURNS, {**summary, "exit_reason": "max_turns"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="builtin_agent.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the OpenAI API root, ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, required=True, help="output tokens per turn")
    p.add_argument("--max-turns", type=int, default=None, help="stop after this many model turns (default: none)")
    p.add_argument("--command-timeout", type=float, default=600.0, help="seconds one bash command may run")
    p.add_argument("--retry-for", type=float, default=900.0,
                   help="seconds to keep retrying a failing API (a model server restart takes minutes)")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="seconds one API request may take")
    p.add_argument("prompt")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    api_key = os.environ.get("OPENAI_API_KEY", "")
    shell = Shell(os.getcwd(), args.command_timeout)

    def terminate(signum, frame):   # the sandbox's timeout: take the running command down with us
        shell.stop_current()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, terminate)
    code, summary = run_agent(args, api_key, shell)
    print(json.dumps(summary, ensure_ascii=False), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
