"""OpenHands (its software-agent SDK, PyPI `openhands-sdk` and `openhands-tools`; OpenAI API through litellm),
one conversation a task (docs/agent-clis.md, docs/harnesses.md).

The SDK, not the agent server: the server is the SDK behind a REST and websocket API for a remote workspace
(a container it talks to); here the workspace is the sandbox the agent runs in, so the SDK runs there, in one
process, and nothing listens. It needs Python 3.12 or newer: the harness bundles one (python_tool.py copies a
CPython 3.12 of the host, e.g. pyenv's), so the task image's Python is not used. Installed with exactly the
pinned closure of the SDK and the tools, less what the terminal and the file editor never import: browser-use
(the browser tools, about 190 MB with Google's API client) and tom-swe.

Its LLM is litellm's `openai/MODEL` at the adapter's /v1 with the session key; litellm's price map is read
from its own copy (LITELLM_LOCAL_MODEL_COST_MAP), not fetched. The launcher lists the model among those whose
replies' reasoning_content the SDK echoes (else every turn forks the chain).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .base import (
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compaction_warnings,
    read_summary_line,
    with_overrides,
)
from .install import OPENHANDS_DIR
from .prompts import prompt_and_files
from .python_tool import PythonTool, find_python, launch_env

PACKAGE = "openhands-sdk"
VERSION = "1.58.2"
DIR = OPENHANDS_DIR
MIN_PYTHON = (3, 12)
# The read timeout of a model call (the SDK's default is 300 s, then litellm retries: the same turn generated
# again). The sandbox's time limit is the real bound.
REQUEST_TIMEOUT_S = 3600
# No step cap, as no harness has one (docs/harnesses.md): the SDK's default of 500 would end a run that the
# sandbox's time limit allows.
MAX_ITERATIONS = 1_000_000
# openhands-sdk and openhands-tools 1.58.2 and their requirements but browser-use and tom-swe, as pip resolved
# them on 2026-12-07 (CPython 3.12.1), installed exactly.
PINS = """
agent-client-protocol==0.12.1 aiofile==3.12.3 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0
annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 Authlib==1.9.10 beartype==0.23.1 binaryornot==0.6.0
blake3==1.0.11 boto3==1.44.18 botocore==1.44.18 cachetools==8.0.3 caio==0.12.10 certifi==2026.10.19.post1
cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 cryptography==51.0.1 cyclopts==5.5.2 deprecation==2.1.0
distro==1.9.0 dnspython==2.9.2 docstring_parser==0.18.0 email-validator==2.4.0 exceptiongroup==1.3.2
fakeredis==2.41.0 fastmcp==3.4.11 fastmcp-slim==3.4.11 fastuuid==0.14.0 filelock==3.32.7 frozenlist==1.8.0
fsspec==2026.9.0 func_timeout==4.3.5 googleapis-common-protos==1.76.0 griffelib==2.4.1 grpcio==1.85.4 h11==0.16.0
h2==4.4.1 hf-xet==1.8.0 hpack==4.2.0 httpcore==1.0.9 httpx==0.29.0 httpx-sse==0.4.3 huggingface_hub==1.33.0
hyperframe==6.1.0 idna==3.21 importlib_metadata==8.9.0 jaraco.classes==3.4.0 jaraco.context==6.1.2
jaraco.functools==4.6.0 jeepney==0.9.0 Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 joserfc==1.8.0 jsonref==1.1.0
jsonschema==4.26.0 jsonschema-path==0.5.0 jsonschema-specifications==2025.9.1 keyring==25.7.0 libtmux==0.62.0
litellm==1.105.7 lmnr==0.7.67 lmnr-claude-code-proxy==0.2.0 lupa==2.8 markdown-it-py==4.3.0 MarkupSafe==3.0.4
mcp==1.30.0 mdurl==0.1.2 more-itertools==11.2.1 multidict==7.2.1 openai==2.54.0 openapi-pydantic==0.6.0
openhands-sdk==1.58.2 openhands-tools==1.58.2 opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-instrumentation==0.66b2
opentelemetry-instrumentation-threading==0.66b2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.4.13 orjson==3.13.0
packaging==26.4 pathable==0.6.0 pillow==13.0.0 platformdirs==4.14.9 propcache==0.5.4 protobuf==7.36.2
py-key-value-aio==0.4.6 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3
Pygments==2.21.0 PyJWT==2.15.1 pyperclip==1.11.0 python-dateutil==2.9.0.post0 python-dotenv==1.2.4
python-frontmatter==1.3.0 python-json-logger==4.2.0 python-multipart==0.0.34 PyYAML==6.0.4 redis==8.2.0
referencing==0.37.0 regex==2026.12.2 requests==2.34.2 rich==15.0.0 rich-rst==2.2.0 rpds-py==2026.9.1
s3transfer==0.19.3 SecretStorage==3.5.0 six==1.17.0 sniffio==1.3.1 socksio==1.0.0 sortedcontainers==2.4.0
sse-starlette==3.7.1 starlette==1.10.0 tenacity==9.2.1 tiktoken==0.14.0 tokenizers==0.23.3 tqdm==4.70.1
tree-sitter==0.26.1 tree-sitter-bash==0.25.1 typing_extensions==4.16.0 typing-inspection==0.4.5 uncalled-for==0.6.2
urllib3==2.8.0 uvicorn==0.55.0 watchfiles==1.3.0 websockets==17.4 wrapt==1.17.3 yarl==1.25.1 zipp==4.1.2
""".split()


@functools.cache       # probing the host's interpreters runs each of them: once a process
def python312() -> Path:
    return find_python(MIN_PYTHON, f"OpenHands ({PACKAGE} {VERSION})")


TOOL = PythonTool(dir=DIR, package=PACKAGE, version=VERSION, pins=tuple(PINS),
                  own_files=((Path(__file__).with_name("openhands_run.py"), "agentrl_openhands.py"),),
                  interpreter=python312)


def config(run: HarnessRun) -> dict:
    return {"model": run.model, "base_url": f"{run.base_url}/v1", "max_input_tokens": run.max_context,
            "max_output_tokens": run.max_new_tokens, "timeout_s": REQUEST_TIMEOUT_S, "max_iterations": MAX_ITERATIONS}


class OpenHands:
    name = "openhands"
    protocol: WireProtocol = "openai"
    # The SDK refuses a smaller window at start (LLMContextWindowTooSmallError): every attempt would fail.
    min_context = 16384
    min_context_why = "the OpenHands SDK refuses a smaller context window at start"

    def install(self, tools_dir: Path) -> None:
        TOOL.install(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        ours = f"{run.home}/.config/agentrl-openhands.json"
        files[ours] = json.dumps(config(run), indent=1).encode()
        root = f"{run.tools_dir}/{DIR}"
        env = {"HOME": run.home, **launch_env(root), "OPENHANDS_LLM_API_KEY": run.api_key}
        argv, env = with_overrides([*TOOL.argv(root), ours], env, run)
        argv += ["--", prompt]
        # No condenser: the SDK's summarising one asks the model on the side (a second chain).
        warnings = compaction_warnings(run, None, "OpenHands") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_summary_line(stdout)
