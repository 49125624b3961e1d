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
