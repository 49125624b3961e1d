#!/usr/bin/env bash
# The wheels tools/gpu_check.sh needs on a GPU node whose python3 holds torch with CUDA but not this
# project's own dependencies, fetched here (where PyPI is reachable) into .gpu-wheels/, which travels
# with the checkout. The node's Python is 3.12 (the device image this project's GPU checks run on);
# GPU_PYTHON_VERSION=3.11, say, for another. Each at the version `make venv` installs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-wheels
pyver=${GPU_PYTHON_VERSION:-3.12}
# Not on that image: this project's runtime dependencies and megatron-core (torch, transformers,
# numpy, httpx, pyyaml, jinja2, msgpack and pytest are there)
names=(pydantic pydantic_core annotated-types typing-inspection fastapi starlette uvicorn opentelemetry-api
       orjson submitit dockerfile-parse megatron-core pytest-timeout)
pins=()
for n in "${names[@]}"; do
  v=$(.venv/bin/pip show "$n" 2>/dev/null | sed -n 's/^Version: //p')
  [[ -n $v ]] || { echo "gpu_wheels: $n is not in .venv (make venv first)" >&2; exit 2; }
  pins+=("$n==$v")
done
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64 any; do
  platforms+=(--platform "$p")
done
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d "$out.tmp" "${pins[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
rm -rf "$out" && mv "$out.tmp" "$out"      # whole or not at all
echo "gpu_wheels: $(find "$out" -name "*.whl" | wc -l) wheels, $(du -sh "$out" | cut -f1), in $out (for Python $pyver)"
