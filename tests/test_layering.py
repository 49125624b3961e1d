"""What docs/architecture.md says of the code's shape, checked against the code: the layer rule, and
which modules read the process environment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hpc", "agentrl")


def modules(package: str) -> list[Path]:
    return [p for p in sorted((ROOT / package).rglob("*.py")) if "bundled_tasks" not in p.parts]


def imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def reads_environment(tree: ast.AST) -> bool:
    """os.environ read (os.environ[...], .get, passed on) or os.getenv called: not a copy handed to a child."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            return True
    return False


def test_hpc_never_imports_agentrl():
    offenders = [str(p.relative_to(ROOT)) for p in modules("hpc")
                 if any(n == "agentrl" or n.startswith("agentrl.") for n in imported(ast.parse(p.read_text())))]
    assert offenders == [], f"hpc is the substrate and knows nothing of the application: {offenders}"


def test_the_architectures_layout_names_every_module():
    layout = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    unnamed = [str(p.relative_to(ROOT)) for package in PACKAGES for p in modules(package)
               if p.name != "__init__.py" and not re.search(rf"\b{p.stem}(\.py)?\b", layout)]
    assert unnamed == [], "docs/architecture.md's layout does not say what these are"


def test_the_modules_that_read_the_environment_are_the_ones_the_architecture_names():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    listed = {path for line in section.splitlines() if line.startswith("- ")
              for path in re.findall(r"`((?:hpc|agentrl)/[\w/]+\.py)`", line)}
    found = {str(p.relative_to(ROOT)) for package in PACKAGES for p in modules(package)
             if reads_environment(ast.parse(p.read_text()))}
    assert found - listed == set(), "these read os.environ but docs/architecture.md does not say so"
    assert listed - found == set(), "docs/architecture.md names these, but they no longer read os.environ"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of hpc and agentrl -> the modules of ours it imports, wherever the import sits (a function's
    body too: a cycle that only a lazy import hides is still a cycle); `from P import m` names the module P.m."""
    paths = {module_name(p): p for package in PACKAGES for p in modules(package) if "sandbox_scripts" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                    if node.level else node.module or ""
                for a in node.names:
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base)
        graph[name] = (found & set(paths)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]     # the check can fail
    graph = import_graph()
    assert "agentrl.pool.claimed" in graph["agentrl.eval.score"]    # relative imports resolve
    found = cycles(graph)
    assert found == [], ("import cycles (break each: move what both need into a module of its own, or the "
                         f"command-line part into agentrl/commands/): {found}")


SLURM_COMMANDS = {"sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct", "sacctmgr", "sprio", "sstat"}


def runs_slurm(tree: ast.AST) -> list[str]:
    """The Slurm client commands a module puts first in a command line: ["squeue", ...], or a string
    "squeue -h ...". Not the executor's name among the others (Literal["sbatch", "submitit", "local"])."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if words[:1] == [getattr(node.elts[0], "value", None)] and words[0] in SLURM_COMMANDS and \
                    not {"submitit", "local"} & set(words):
                found.append(words[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            tokens = node.value.split()
            if len(tokens) > 1 and tokens[0] in SLURM_COMMANDS and tokens[1].startswith("-"):
                found.append(tokens[0])
    return found


def test_slurm_commands_run_only_in_the_slurm_module():
    assert runs_slurm(ast.parse('subprocess.run(["scancel", job])')) == ["scancel"]       # the check can fail
    assert runs_slurm(ast.parse('os.system("squeue -h -j 1")')) == ["squeue"]
    assert runs_slurm(ast.parse('executor: Literal["sbatch", "submitit", "local"] = "sbatch"')) == []   # a name
    offenders = {str(p.relative_to(ROOT)): found for package in PACKAGES for p in modules(package)
                 if p != ROOT / "hpc" / "slurm.py" and (found := runs_slurm(ast.parse(p.read_text())))}
    assert offenders == {}, f"Slurm is asked through hpc/slurm.py alone (as submitit's Slurm classes): {offenders}"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into packages: agentrl.pool.worker counts as agentrl.pool."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])
    folded: dict[str, set[str]] = {package(m): set() for m in graph}
    for module, imports in graph.items():
        folded[package(module)] |= {package(i) for i in imports} - {package(module)}
    return folded


def test_no_package_imports_itself_through_others():
    """agentrl/commands/ holds the command lines (the roles' included), so that no package needs the run config
    that imports its own config back."""
    assert package_graph({"a.x.m": {"a.y.n"}, "a.y.n": {"a.x.o"}, "a.x.o": set()}) == {"a.x": {"a.y"}, "a.y": {"a.x"}}
    found = cycles(package_graph(import_graph()))
    assert found == [], f"import cycles between packages: {found}"


RUN_DIR_NAMES = {"run.yaml", "services", "ledger", "buffer", "checkpoints", "trajectories", "launch", "metrics.jsonl",
                 "heartbeats", "plan.json", "end.json", "eval", "attempts", "results.jsonl", "summary.json"}


def builds_run_paths(tree: ast.AST) -> list[str]:
    """The names of a run (or eval) directory's parts that a module joins by hand: `root / "ledger"`."""
    return [node.right.value for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
            and node.right.value in RUN_DIR_NAMES]


def test_run_directory_paths_are_named_by_the_run_layout_alone():
    assert builds_run_paths(ast.parse('p = run_dir / "ledger" / name')) == ["ledger"]     # the check can fail
    offenders = {str(p.relative_to(ROOT)): found for package in PACKAGES for p in modules(package)
                 if p != ROOT / "hpc" / "runlayout.py" and "sandbox_scripts" not in p.parts
                 and (found := builds_run_paths(ast.parse(p.read_text())))}
    assert offenders == {}, f"use hpc.runlayout's RunLayout or EvalLayout for these: {offenders}"


# Programs of their own, started by path or -m where no `agentrl` command runs: the built-in agent inside the
# sandbox (standard library only), and one array task of a mutations validation batch.
OWN_PROGRAMS = {"agentrl/harness/builtin_agent.py", "agentrl/swe/mutate/slurm.py"}


def test_command_lines_are_parsed_in_agentrl_commands_only():
    """Domain code takes typed options; argparse, and what an argparse namespace carries, stay at the top."""
    offenders = [rel for p in modules("agentrl") if "argparse" in imported(ast.parse(p.read_text()))
                 and not (rel := str(p.relative_to(ROOT))).startswith("agentrl/commands/")
                 and rel not in ("agentrl/cli.py", *OWN_PROGRAMS)]
    assert offenders == [], f"move these command lines into agentrl/commands/: {offenders}"
