"""Each training backend has every member of the Policy protocol the loop is written against.

mypy checks the same where Trainer.make_policy returns either backend as a Policy; this test needs
no model, no process group and no megatron-core (it reads the classes and their __init__ source).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from agentrl.train.megatron_backend import MegatronPolicy
from agentrl.train.policy import Policy
from agentrl.train.torch_backend import TorchPolicy


def protocol_members(proto: type) -> dict[str, object]:
    """Name -> what the protocol (and the protocols it extends) declares: an annotation, a method, a property."""
    members: dict[str, object] = {}
    for base in reversed(proto.__mro__):
        if not getattr(base, "_is_protocol", False) or base.__module__ == "typing":
            continue
        for name in vars(base).get("__annotations__", {}):
            members[name] = "attribute"
        for name, value in vars(base).items():
            if not name.startswith("_") and (callable(value) or isinstance(value, property)):
                members[name] = value
    return members


def init_attributes(cls: type) -> set[str]:
    """The `self.<name>` that cls.__init__ assigns (plain, annotated or tuple assignments)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    return names


def missing_members(cls: type, proto: type = Policy) -> list[str]:
    """The protocol's members cls lacks, or has as something else (an attribute for a method, another signature)."""
    instance_attrs = init_attributes(cls)
    missing = []
    for name, declared in sorted(protocol_members(proto).items()):
        if callable(declared):          # a method: cls's must take the same parameters
            found = getattr(cls, name, None)
            if not callable(found) or (list(inspect.signature(found).parameters) !=
                                       list(inspect.signature(declared).parameters)):
                missing.append(name)
        elif not hasattr(cls, name) and name not in instance_attrs:      # an attribute or a read-only property
            missing.append(name)
    return missing


def test_the_protocol_lists_what_the_loop_uses():
    assert set(protocol_members(Policy)) == {"steps", "collective_io", "dp_rank", "dp_size", "train_step",
                                             "fingerprint", "save", "load", "export_hf"}


@pytest.mark.parametrize("backend", [TorchPolicy, MegatronPolicy], ids=lambda c: c.__name__)
def test_backend_has_every_policy_member(backend):
    assert missing_members(backend) == []


def test_a_backend_lacking_a_member_is_caught():
    class Partial:
        collective_io = False

        def __init__(self):
            self.dp_rank, self.dp_size = 0, 1

        def train_step(self, batch, plan):
            return {}

        def save(self, path: Path) -> None: ...
        def load(self, path: Path) -> None: ...
        def export_hf(self, target: Path) -> None: ...       # another parameter name than Saveable's

    assert missing_members(Partial) == ["export_hf", "fingerprint", "steps"]
