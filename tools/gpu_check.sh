#!/usr/bin/env bash
# The checks only a GPU node can run, one line each (docs/train.md, "On a GPU node"):
#
#   tools/gpu_check.sh [--logs DIR]        on a node with one NVIDIA GPU and torch with CUDA
#
#   megatron   the Megatron backend unpatched on the GPU: log-probs, a train step, checkpoint and
#              export against the torch backend (test_on_a_gpu_without_patches), and the trainer loop
#   server     the torch stand-in for SGLang with its forward pass on the GPU, answering as on the CPU
#   learning   the learning CI test (tests/test_learning.py) with its trainer on the GPU
#   moe        routing replay on the tiny MoE: the stand-in's bfloat16 forward and the torch trainer on the GPU,
#              then the Megatron backend unpatched with replay: log-probs and a step against the torch
#              backend's under the same routes, checkpoint and export
#
# No network is needed there: the Python packages the node's python3 lacks travel as wheels in
# .gpu-wheels/ (make gpu-wheels, on a machine with network; about 6 MiB), installed under /tmp.
# Each check has its time limit (150, 60, 360 and 150 s: under 12 minutes in all). Ends at once, exit 2,
# where there is no GPU. Exit 1 if a check failed; its log says why.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

logs=${TMPDIR:-/tmp}/agentrl-gpu-check
if [[ ${1:-} == --logs ]]; then logs=${2:?--logs needs a directory}; shift 2; fi
if (($#)); then echo "usage: tools/gpu_check.sh [--logs DIR]" >&2; exit 2; fi
py=${PYTHON:-python3}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU on this machine (nvidia-smi is not on PATH): run it on a GPU node," \
       "e.g. srun --gpus=1 tools/gpu_check.sh" >&2
  exit 2
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
  echo "gpu_check: $py has no torch that sees a CUDA GPU ($("$py" -c 'import torch; print("torch", torch.__version__, "built for CUDA", torch.version.cuda)' 2>&1 | tail -1));" \
       "set PYTHON to an interpreter whose torch has CUDA" >&2
  exit 2
fi

mkdir -p "$logs"
if [[ -d .gpu-wheels ]]; then
  site=$logs/site
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .gpu-wheels/*.whl >"$logs/wheels.log" 2>&1 \
    || { echo "gpu_check: installing .gpu-wheels failed: $logs/wheels.log" >&2; exit 2; }
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
missing=$("$py" - <<'EOF'
import importlib.util
need = ["pydantic", "fastapi", "uvicorn", "httpx", "orjson", "transformers", "yaml", "jinja2", "submitit", "msgpack",
        "dockerfile_parse", "pytest", "megatron.core"]
print(" ".join(n for n in need if importlib.util.find_spec(n.split(".")[0]) is None
               or (n == "megatron.core" and importlib.util.find_spec(n) is None)))
EOF
)
if [[ -n $missing ]]; then
  echo "gpu_check: $py lacks $missing: run make gpu-wheels on a machine with network and bring .gpu-wheels" >&2
  exit 2
fi
"$py" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

failed=0
check() {   # NAME TIMEOUT_S PYTEST_ARGS...
  local name=$1 limit=$2 t0 rc line
  shift 2
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$limit" "$py" -m pytest -q -p no:cacheprovider -rs "$@" >"$logs/$name.log" 2>&1
  rc=$?
  line=$(grep -E '^[0-9]+ (passed|failed|skipped)|^=+ .*(passed|failed|skipped|error)' "$logs/$name.log" | tail -1 \
         | tr -d '=' | xargs)
  if ((rc == 0)) && grep -q "passed" <<<"$line" && ! grep -q "skipped" <<<"$line"; then
    echo "PASS $name $(($(date +%s) - t0)) s: $line"
  elif ((rc == 0)); then    # something was skipped: say why (the node lacks bwrap, say)
    echo "SKIP $name $(($(date +%s) - t0)) s: $line; $(grep -m1 '^SKIPPED' "$logs/$name.log")"
  else
    ((rc == 124)) && line="timed out after $limit s"
    echo "FAIL $name $(($(date +%s) - t0)) s: ${line:-exit $rc}; log: $logs/$name.log"
    failed=1
  fi
}
check megatron 150 tests/test_train_megatron.py::test_on_a_gpu_without_patches \
  tests/test_train_megatron.py::test_the_trainer_loop_on_a_gpu_without_patches
check server 60 tests/test_cpu_server.py::test_on_a_gpu_the_server_answers_as_on_the_cpu
check learning 360 tests/test_learning.py
check moe 150 tests/test_routing_replay_bench.py::test_on_a_gpu_replay_narrows_the_gap \
  tests/test_train_megatron_moe.py::test_on_a_gpu_replay_without_patches
exit $failed
