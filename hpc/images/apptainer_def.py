"""A task's Dockerfile as an Apptainer definition file, its steps kept in order.

spython's converter moves COPY into %files, which Apptainer runs before %post: a Dockerfile
that copies a file and then runs it, or runs a step and then copies over its output, would
build something else. Here %files only stages the whole build context at CONTEXT_DIR, and
%post replays the Dockerfile step by step in one shell: ARG and ENV as exported variables
(ENV also in %environment, for the image's runtime), WORKDIR as `mkdir -p` and `cd`, RUN as
`/bin/sh -c` (or the SHELL's argv, or the exec form), COPY and ADD as copies out of the staged
context with Docker's rules for directories and trailing slashes (ADD unpacks a local tar
and downloads a URL), then the staged context is removed. What Apptainer cannot do is
refused, naming the line: a multi-stage Dockerfile, COPY --from, and RUN as a USER other
than root (%post runs as root); buildah builds those.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

from .dockerfile import DockerfileError, DockerfilePlan, assignments, split_flags, substitute, words_of

CONTEXT_DIR = "/.agentrl-context"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TAR = re.compile(r"\.(tar|tar\.gz|tgz|tar\.bz2|tbz2|tar\.xz|txz)$")

# COPY's rules, as sh: a directory's contents go into DEST; several sources, or a DEST ending
# in /, make DEST a directory; else DEST is the file's new name. Relative DEST is from WORKDIR.
_COPY = r'''agentrl_copy() {
    dest=$1; shift
    case $dest in */) mkdir -p "$dest" ;; esac
    [ $# -gt 1 ] && mkdir -p "$dest"
    for src in "$@"; do
        if [ -d "$src" ]; then mkdir -p "$dest" && cp -a "$src"/. "$dest"/
        elif [ -d "$dest" ]; then cp -a "$src" "$dest"/
        else mkdir -p "$(dirname "$dest")" && cp -a "$src" "$dest"
        fi
    done
}'''


def _env_value(value: str) -> str:
    """A double-quoted sh word that expands $VAR as Docker's ENV does, and nothing else (no `...` or $(...))."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$(", "\\$(")
    return f'"{escaped}"'


def _sources(sources: list[str]) -> str:
    """Context paths for sh, globs left to expand."""
    out = []
    for s in sources:
        rel = s.lstrip("/")
        path = f"{CONTEXT_DIR}/{rel}" if rel not in ("", ".") else CONTEXT_DIR
        out.append(path if re.search(r"[*?\[]", rel) and not re.search(r"[\s'\"$`;&|<>()\\]", rel)
                   else shlex.quote(path))
    return " ".join(out)


def definition(plan: DockerfilePlan, context: str, build_args: Mapping[str, str] | None = None,
               bootstrap: str = "docker") -> str:
    """The .def for `plan` (hpc.images.dockerfile.plan_dockerfile), its build context staged from the
    host directory `context`. Each step is announced as buildah does (`STEP n/m: ...`), so that a
    build's log reads the same whichever builder made it (hpc.images.buildah.network_failures).
    `bootstrap`: docker (plan.bases[0] a reference) or oci (plan.bases[0] an OCI layout directory)."""
    if plan.stages != 1:
        raise DockerfileError(f"a multi-stage Dockerfile ({plan.stages} FROM lines) cannot be built with "
                              "Apptainer: build it with buildah (--builder buildah)")
    args = {**dict(plan.args), **dict(build_args or {})}
    post = ["set -e", _COPY, f"export PATH=${{PATH:-{DEFAULT_PATH}}}", "cd /"]
    total = len(plan.final_steps) + 1
    environment: list[str] = []
    shell = ["/bin/sh", "-c"]
    user = None
    for n, step in enumerate(plan.final_steps, 2):
        op, words = step.op, words_of(step.value)
        post.append(f"echo {shlex.quote(f'STEP {n}/{total}: {op} {step.value}')}")
        if op in ("ARG", "ENV"):
            for name, value in assignments(step):
                line = f"export {name}={_env_value(args.get(name, '') if value is None else value)}"
                post.append(line)
                if op == "ENV":
                    environment.append(line)
        elif op == "WORKDIR":
            path = _env_value(words[0])       # ENV and ARG expand in WORKDIR, as Docker's do
            post.append(f"mkdir -p {path} && cd {path}")
        elif op == "SHELL":
            shell = json.loads(step.value)
        elif op == "USER":
            user = words[0]
        elif op == "RUN":
            if user not in (None, "root", "0", "0:0"):
                raise DockerfileError(f"{step}: runs as USER {user}, but Apptainer's %post runs as root: build "
                                      "it with buildah (--builder buildah), or move the USER line after it")
            exec_form = step.value.strip().startswith("[")
            post.append(shlex.join(words) if exec_form else shlex.join([*shell, step.value]))
        elif op in ("COPY", "ADD"):
            flags, paths = split_flags(words)
            unsupported = sorted(set(flags) & {"from", "chown", "chmod", "link", "parents"})
            if unsupported:
                raise DockerfileError(f"{step}: {op} --{unsupported[0]} is not replayed in Apptainer's %post: "
                                      "build it with buildah (--builder buildah)")
            *sources, dest = paths
            post.extend(_copy(op, sources, dest))
    post.append(f"rm -rf {CONTEXT_DIR}")
    lines = [f"Bootstrap: {bootstrap}", f"From: {plan.bases[0]}", "", "%files", f"    {context} {CONTEXT_DIR}", "",
             "%post", *(f"    {line}" for block in post for line in block.splitlines())]
    if environment:
        lines += ["", "%environment", *(f"    {line}" for line in environment)]
    return "\n".join(lines) + "\n"


def _copy(op: str, sources: list[str], dest: str) -> list[str]:
    out = []
    urls = [s for s in sources if op == "ADD" and s.startswith(("http://", "https://"))]
    tars = [s for s in sources if op == "ADD" and s not in urls and _TAR.search(s)]
    plain = [s for s in sources if s not in urls and s not in tars]
    if plain:
        out.append(f"agentrl_copy {shlex.quote(dest)} {_sources(plain)}")
    for url in urls:
        target = dest if not dest.endswith("/") else dest + url.rstrip("/").rsplit("/", 1)[-1]
        out.append(f"mkdir -p \"$(dirname {shlex.quote(target)})\" && "
                   f"(curl -fsSL -o {shlex.quote(target)} {shlex.quote(url)} || "
                   f"wget -q -O {shlex.quote(target)} {shlex.quote(url)})")
    for tar in tars:
        out.append(f"mkdir -p {shlex.quote(dest)} && tar -xf {_sources([tar])} -C {shlex.quote(dest)}")
    return out


def runtime_env(plan: DockerfilePlan) -> dict[str, str]:
    """The image's ENV as the sandbox should see it, resolved statically: $VAR from earlier ARG/ENV, and
    PATH, which a docker base image sets, as the usual default (the base's config is not read here)."""
    variables = {**dict(plan.args), "PATH": DEFAULT_PATH}
    env: dict[str, str] = {}
    for step in plan.final_steps:
        if step.op in ("ARG", "ENV"):
            for name, value in assignments(step):
                value = substitute(value or variables.get(name, ""), variables) or ""
                variables[name] = value
                if step.op == "ENV":
                    env[name] = value
    return env

