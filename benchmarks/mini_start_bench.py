"""mini-swe-agent's start: its `mini` command and model layer imported, with our model classes and with litellm.

What every mini attempt pays before its first model call. Both sides run the bundled Python of the
checkout's `make clis` build (TOOLS/mini-swe-agent) with `-I -S`, as the harness does, and import mini's
`mini` command (minisweagent.run.mini) and one model class:
    ours       agentrl_mini_model.AdapterTextbasedModel (mini's OpenRouter classes pointed at the adapter;
               what the harness uses, docs/harnesses.md)
    litellm    minisweagent.models.litellm_textbased_model.LitellmTextbasedModel (mini's default model
               layer, and the harness's until 2026-12-05), from litellm 1.110.2 and openai 3.57.0 with
               their pinned closure installed once into WORK/litellm-site (needs PyPI or a pip index)
Each is started --runs times, alternating, and the median wall time of each is printed with the ratio
litellm / ours: the seconds of CPU the change saves every attempt. LITELLM_LOCAL_MODEL_COST_MAP=True
on both sides, so litellm reads its bundled price list rather than trying the network.

    python -m benchmarks.mini_start_bench [--runs N] [--work DIR] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import statistics
import subprocess
import tempfile
import time

from agentrl.harness.mini_swe_agent import CHECKOUT_MINI, TOOL, VERSION
from agentrl.harness.python_tool import PYTHON, launch_env

ROOT = Path(__file__).resolve().parents[1]
# litellm's side: the two packages our model classes replaced, at the versions the harness pinned, and
# the closure pip resolved for them with mini's other requirements (2026-12-02, CPython 3.11).
LITELLM = ("litellm==1.110.2", "openai==3.57.0")
LITELLM_PINS = """
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0
attrs==26.1.0 boto3==1.44.8 botocore==1.44.8 certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1
fastuuid==0.14.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0 h2==4.4.1 hf-xet==1.8.0 hpack==4.2.0
httpcore==1.0.9 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 huggingface_hub==2.4.0 hyperframe==6.1.0 idna==3.20
importlib_metadata==8.9.0 Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 litellm==1.110.2 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2
multidict==7.2.1 openai==3.57.0 packaging==26.4 platformdirs==4.14.9 prompt_toolkit==3.0.53 propcache==0.5.4
pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 Pygments==2.21.0 python-dateutil==2.9.0.post0
python-dotenv==1.2.4 PyYAML==6.0.4 referencing==0.37.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0
rpds-py==2026.9.1 s3transfer==0.19.3 shellingham==1.5.4 six==1.17.0 sniffio==1.3.1 tenacity==9.2.1 tiktoken==0.14.0
tokenizers==0.23.3 tqdm==4.70.1 truststore==0.10.5 typer==0.29.2 typing_extensions==4.16.0 typing-inspection==0.4.5
urllib3==2.8.0 wcwidth==0.9.4 yarl==1.25.1 zipp==4.1.2
""".split()
IMPORTS = {
    "ours": "import agentrl_mini_model",
    "litellm": "import minisweagent.models.litellm_textbased_model",
}
PROBE = """\
import site, sys
for d in sys.argv[1:]:
    site.addsitedir(d)
import minisweagent.run.mini
{imports}
"""


def litellm_site(work: Path) -> Path:
    """litellm and openai with their closure, installed once (pip --target) and kept."""
    site = work / "litellm-site"
    if (site / "litellm").is_dir():
        return site
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write("\n".join(LITELLM_PINS) + "\n")
        pins.flush()
        tmp = work / "litellm-site.tmp"
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        print(f"installing {' '.join(LITELLM)} into {site} (once)", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(tmp), "--quiet", "--no-input",
                            "--disable-pip-version-check", "-c", pins.name, *LITELLM], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"mini_start_bench: pip could not install {' '.join(LITELLM)} (it needs PyPI or a pip "
                             f"index): {r.stderr.strip()[-1500:]}")
    tmp.rename(site)
    return site


def start_s(side: str, sites: list[Path], work: Path) -> float:
    probe = work / f"probe-{side}.py"
    probe.write_text(PROBE.format(imports=IMPORTS[side]))
    env = {"HOME": str(work / "home"), "MSWEA_GLOBAL_CONFIG_DIR": str(work / "home"), "MSWEA_SILENT_STARTUP": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", **launch_env(CHECKOUT_MINI)}
    t0 = time.perf_counter()
    r = subprocess.run([str(CHECKOUT_MINI / PYTHON), "-I", "-S", str(probe), *map(str, sites)], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"mini_start_bench: the {side} start failed: {r.stderr.strip()[-1500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mini_start_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7, help="starts of each side (default 7)")
    p.add_argument("--work", type=Path, default=ROOT / ".cache" / "mini-start-bench")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be 1 or more, got {args.runs}")
    if not TOOL.ready(CHECKOUT_MINI):
        raise SystemExit(f"mini_start_bench: {CHECKOUT_MINI} does not run mini-swe-agent {VERSION}: run `make clis`")
    work = args.work.resolve()
    (work / "home").mkdir(parents=True, exist_ok=True)
    site = CHECKOUT_MINI / "site"
    sides = {"ours": [site], "litellm": [site, litellm_site(work)]}
    for side, sites in sides.items():     # a first start of each, untimed: the page cache
        start_s(side, sites, work)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.runs):
        for side, sites in sides.items():
            times[side].append(start_s(side, sites, work))
    median = {side: statistics.median(t) for side, t in times.items()}
    ratio = median["litellm"] / median["ours"]
    if args.json:
        print(json.dumps({"median_s": median, "runs": times, "ratio": ratio}))
        return 0
    print(f"mini-swe-agent's start (its `mini` command and a model class imported), median of {args.runs}:")
    print(f"  with litellm (baseline)   {median['litellm']:.2f} s")
    print(f"  with our model classes    {median['ours']:.2f} s")
    print(f"  ratio litellm / ours      {ratio:.1f}x   ({median['litellm'] - median['ours']:.2f} s saved each attempt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
