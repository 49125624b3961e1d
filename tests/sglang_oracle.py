"""SGLang's own code as the judge of what the toolkit sends and reads, on a CPU machine without SGLang's GPU stack.

    python tests/sglang_oracle.py ENV_DIR ANSWERS_JSON < QUESTIONS_JSON

ENV_DIR is a tests/sglang_env.py environment (SGLang and its pinned transformers); it goes first on sys.path,
before the project's venv. The questions (command lines, request bodies, parser names) come from the test, which
builds them with the toolkit's code; the answers are what SGLang's code made of them:
- `launch`: per command line, the ServerArgs fields that `add_cli_args` + `from_cli_args` set (as the flags set
  them, before `__post_init__` normalizes) and how far `__post_init__` ran: as rendered, and with `--device cpu`
  added, which takes it past the accelerator probe through the rest of its checks.
- `requests`: per body, the request type SGLang's route parses it into (read from the route's signature in
  entrypoints/http_server.py), built as `Type(**body)`, so a key it has no field for is an error; for
  /generate also `normalize_batch_and_arguments()`, SamplingParams(**sampling_params).verify(), and the
  newest SGLang's own body contract check (`generate_contract_error`) where it has one.
- `routes`, `meta_info_keys`, `reply_keys`: the routes' methods and the keys their handlers write, and the keys
  the tokenizer manager writes into a /generate reply and its meta_info, read from the source with `ast`
  (building a TokenizerManager takes a scheduler); `finish_reasons` and `output_token_logprobs` from SGLang's
  own functions.

Run in a subprocess of its own: the stubs below replace modules process-wide.
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
import warnings
from pathlib import Path
from typing import Any

# GPU-only or runtime-only packages SGLang imports at module level, served as inert stubs. Nothing the oracle
# calls uses them: an attribute is a class whose attributes are more of the same, and calling one returns
# another (or, as a decorator, the function it decorates).
STUBBED = frozenset({
    "triton", "torchvision", "tvm_ffi", "zmq", "aiohttp", "IPython", "pybase64", "partial_json_parser",
    "sentencepiece", "einops", "compressed_tensors", "gguf", "xgrammar",
})
# What the stubs say when asked for a GPU: real triton on a machine without one raises here too, and SGLang
# falls back to its CPU paths.
NO_GPU = frozenset({"triton.runtime.driver.active"})
# In the venv, but at a version the pinned transformers cannot load (it imports `kernels` when present):
# absent to everyone.
HIDDEN = frozenset({"kernels"})


def _stub_attribute(name: str) -> type:
    if name in NO_GPU:
        raise RuntimeError(f"0 active drivers: {name} is a stub (no GPU)")
    return _StubType(name, (), {})


class _StubType(type):
    """A stub attribute: a class (so it can be subclassed and isinstance-checked) standing in for anything."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub_attribute(f"{cls.__name__}.{attr}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]          # used as a decorator
        return _stub_attribute(f"{cls.__name__}()")

    def __getitem__(cls, key: Any) -> type:
        return cls

    def __iter__(cls):
        return iter(())

    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # a pydantic model with a stub-typed field takes anything there

        return core_schema.any_schema()


class _StubModule(types.ModuleType):
    __version__ = "0.0.0"

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub_attribute(f"{self.__name__}.{attr}")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by {__file__})", name=name)
        if top in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_stubs() -> None:
    # torch decides once (functools.cache) whether triton is installed; asked before the stub exists, it says
    # no, and torch's CPU paths never touch the stub.
    import torch.utils._triton

    torch.utils._triton.has_triton_package()
    sys.meta_path.insert(0, _Stubs())
    find_spec = importlib.util.find_spec

    def without_hidden(name: str, package: str | None = None):
        return None if name.partition(".")[0] in HIDDEN else find_spec(name, package)
    importlib.util.find_spec = without_hidden    # transformers probes packages with it


# -- the answers ------------------------------------------------------------------------------------------------

def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def launch(argv: list[str], fields: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    seen: dict[str, Any] = {}

    class Snapshot(ServerArgs):         # a subclass, as 0.5.23's ServerArgs (a msgspec Struct) binds its hooks early
        def __post_init__(self):
            seen.update({f: getattr(self, f, "<no such field>") for f in fields})
            super().__post_init__()

    out: dict[str, Any] = {"fields": seen}
    for key, extra in (("post_init", []), ("post_init_cpu", ["--device", "cpu"])):
        try:
            ns, unknown = parser.parse_known_args([*argv, *extra])
        except (SystemExit, argparse.ArgumentError) as e:      # a bad value
            out["error"] = _error(e)
            return out
        if unknown:
            out["error"] = f"unrecognized arguments: {' '.join(unknown)}"
            return out
        try:
            Snapshot.from_cli_args(ns)
            out[key] = "ok"
        except Exception as e:  # noqa: BLE001 - how far it ran is the answer
            out[key] = _error(e)
    return out


def parser_names() -> dict[str, list[str]]:
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    return {"tool_call": sorted(FunctionCallParser.ToolCallParserEnum),
            "reasoning": sorted(ReasoningParser.DetectorMap)}


def _handlers(source: str) -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    """http_server.py's route handlers by path, from their @app.get/post/api_route decorators."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.AsyncFunctionDef, ast.FunctionDef)):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args \
                        and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str):
                    out.setdefault(d.args[0].value, node)
    return out


def _methods(handler) -> list[str]:
    found: set[str] = set()
    for d in handler.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute):
            if d.func.attr in ("get", "post", "put"):
                found.add(d.func.attr.upper())
            for kw in d.keywords:
                if kw.arg == "methods" and isinstance(kw.value, ast.List):
                    found.update(e.value for e in kw.value.elts if isinstance(e, ast.Constant))
    return sorted(found)


def _body_type(handler) -> str | None:
    """The io_struct type of the handler's `obj` parameter (`obj: T` or `obj: Annotated[T, Body()]`)."""
    for arg in handler.args.args:
        if arg.arg == "obj" and arg.annotation is not None:
            a = arg.annotation
            if isinstance(a, ast.Subscript) and isinstance(a.slice, ast.Tuple):
                a = a.slice.elts[0]
            return ast.unparse(a)
    return None


def _dict_keys(node: ast.AST) -> list[str]:
    return sorted({k.value for d in ast.walk(node) if isinstance(d, ast.Dict)
                   for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)})


def routes(sglang_dir: Path) -> dict[str, Any]:
    handlers = _handlers((sglang_dir / "srt/entrypoints/http_server.py").read_text())
    return {path: {"methods": _methods(h), "body": _body_type(h), "keys": _dict_keys(h)}
            for path, h in handlers.items()}


def written_keys(sglang_dir: Path) -> dict[str, list[str]]:
    """Keys tokenizer_manager.py writes into meta_info (dict displays bound to it, `meta_info[K] = ...`,
    `meta_info.update({...})`) and into the reply around it (the dicts holding a "meta_info" key)."""
    tree = ast.parse((sglang_dir / "srt/managers/tokenizer_manager.py").read_text())
    meta: set[str] = set()
    reply: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id == "meta_info" and isinstance(node.value, ast.Dict):
                    meta.update(_dict_keys(node.value))
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "meta_info" \
                        and isinstance(t.slice, ast.Constant):
                    meta.add(t.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "meta_info" and node.args:
            meta.update(_dict_keys(node.args[0]))       # meta_info.update({...})
        if isinstance(node, ast.Dict) and "meta_info" in _dict_keys(node):
            reply.update(_dict_keys(node))
    return {"meta_info": sorted(meta), "reply": sorted(reply)}


def request(path: str, body: dict[str, Any], type_name: str | None, vocab_size: int) -> dict[str, Any]:
    from sglang.srt.managers import io_struct

    out: dict[str, Any] = {"type": type_name}
    if type_name is None:
        return out
    try:
        obj = getattr(io_struct, type_name)(**body)
        out["values"] = {k: getattr(obj, k) for k in body}
        if path == "/generate":
            obj.normalize_batch_and_arguments()
            from sglang.srt.sampling.sampling_params import SamplingParams

            params = SamplingParams(**(obj.sampling_params or {}))
            params.verify(vocab_size)
            # each key as SamplingParams holds it (`stop` becomes stop_strs: held under another name)
            out["sampling"] = {k: getattr(params, k, "<held under another name>") for k in obj.sampling_params or {}}
            try:
                from sglang.srt.entrypoints.api_contract import generate_contract_error
            except ImportError:
                pass            # older SGLang: no such check
            else:
                out["contract_error"] = generate_contract_error(body)
        else:
            out["defaults"] = {k: v for k, v in _fields(obj).items() if k not in body}
    except Exception as e:  # noqa: BLE001 - the refusal is the answer
        out["error"] = _error(e)
    return out


def _fields(obj: Any) -> dict[str, Any]:
    names = getattr(obj, "__struct_fields__", None) or [f for f in getattr(obj, "__dataclass_fields__", {})]
    return {n: _plain(getattr(obj, n)) for n in names}


def _plain(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def _method(path: Path, cls: str, name: str) -> Any:
    """A method of `cls` in `path`, compiled from its source alone: importing tokenizer_manager.py would import
    the scheduler's dependencies (uvloop, xgrammar, ...) for one small function."""
    [node] = [f for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef) and c.name == cls
              for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name]
    namespace: dict[str, Any] = {}
    import typing

    exec(compile(ast.Module([node], []), str(path), "exec"), vars(typing) | namespace, namespace)  # noqa: S102
    return namespace[name]


def replies(sglang_dir: Path) -> dict[str, Any]:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, FINISH_MATCHED_TOKEN

    detokenize = _method(sglang_dir / "srt/managers/tokenizer_manager.py", "TokenizerManager",
                         "detokenize_logprob_tokens")
    return {"finish_reasons": {"length": FINISH_LENGTH(length=4).to_json(),
                               "stop": FINISH_MATCHED_TOKEN(matched=7).to_json(),
                               "abort": FINISH_ABORT().to_json()},
            # self is used only to decode token texts, which decode_to_text=False skips
            "output_token_logprobs": detokenize(None, [-0.5, -1.25], [7, 9], False)}


def answer(questions: dict[str, Any]) -> dict[str, Any]:
    import sglang

    sglang_dir = Path(sglang.__file__).parent
    found = routes(sglang_dir)
    return {
        "version": sglang.__version__,
        "file": sglang.__file__,
        "launch": [launch(argv, questions["fields"]) for argv in questions["argvs"]],
        "parsers": parser_names(),
        "routes": found,
        "requests": [request(q["path"], q["body"], (found.get(q["path"]) or {}).get("body"), questions["vocab_size"])
                     for q in questions["requests"]],
        "written": written_keys(sglang_dir),
        **replies(sglang_dir),
    }


def main() -> int:
    env_dir, answers = sys.argv[1:3]
    sys.path.insert(0, env_dir)
    install_stubs()
    warnings.simplefilter("ignore")      # SGLang warns at import about every GPU feature it will not have
    questions = json.load(sys.stdin)
    # a file, not stdout: SGLang's imports may print
    Path(answers).write_text(json.dumps(answer(questions), default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
