"""Bug operators: the one-site rewrites of Python source that make a mutant (pure; libcst).

libcst keeps the source's formatting, so a mutant differs from its original in the rewritten
expression alone and its diff is one hunk a reader (and the inverse patch) can follow. Each
operator names the nodes it can rewrite and what each becomes; `Mutator.sites` lists every
(operator, node, rewrite) of a module in traversal order, so a site's index in that list is
stable for the same source and the same operators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

OPERATORS = ("comparison", "off-by-one", "negated-condition", "swapped-operator", "removed-branch",
             "swapped-arguments", "changed-default")

# A boundary moved or an equality turned round: the flips a reader's off-by-one comes from.
_COMPARISON: dict[type, type] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
    cst.In: cst.NotIn, cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
}
_BINARY: dict[type, type] = {
    cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.FloorDivide,
    cst.FloorDivide: cst.Multiply, cst.Modulo: cst.FloorDivide, cst.Divide: cst.Multiply,
}
_BOOLEAN: dict[type, type] = {cst.And: cst.Or, cst.Or: cst.And}
# Calls whose argument order is syntax more than meaning: swapping them makes a TypeError, not a bug.
_NO_SWAP = frozenset({"isinstance", "issubclass", "getattr", "setattr", "hasattr", "super", "print", "range"})
_EXITS = (cst.Return, cst.Raise, cst.Continue, cst.Break)


@dataclass(frozen=True)
class Site:
    """One rewrite of one node: what `apply` needs (its index) and what a task says about it."""
    index: int
    operator: str
    line: int                 # 1-based, in the original
    function: str             # the enclosing function's qualified name, or "<module>"
    before: str               # the node's code, and what it becomes
    after: str


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _int_value(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        try:
            return int(node.value, 0)
        except ValueError:     # 0777-style and underscores are left alone
            return None
    return None


def _plus(expr: cst.BaseExpression, delta: int) -> cst.BaseExpression:
    """`expr + 1` (or - 1); an integer literal becomes its neighbour instead."""
    value = _int_value(expr)
    if value is not None and value + delta >= 0:
        return cst.Integer(str(value + delta))
    op: cst.BaseBinaryOp = cst.Add() if delta > 0 else cst.Subtract()
    left = expr if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer)) \
        else expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=left, operator=op, right=cst.Integer(str(abs(delta))))


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    inner = test if not isinstance(test, (cst.BooleanOperation, cst.Comparison, cst.IfExp, cst.NamedExpr,
                                          cst.Lambda)) or test.lpar \
        else test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(operator=cst.Not(), expression=inner)


class _Collector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.found: list[tuple[str, cst.CSTNode, cst.CSTNode, str]] = []
        self.scope: list[str] = []
        self.slice_depth = 0

    def _add(self, operator: str, node: cst.CSTNode, new: cst.CSTNode) -> None:
        self.found.append((operator, node, new, ".".join(self.scope) or "<module>"))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scope.append(node.name.value)
        for param in (*node.params.params, *node.params.kwonly_params):
            if param.default is not None and (new := _changed_default(param.default)) is not None:
                self._add("changed-default", param.default, new)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scope.pop()

    def visit_Comparison(self, node: cst.Comparison) -> None:
        for target in node.comparisons:
            flipped = _COMPARISON.get(type(target.operator))
            if flipped is not None:
                self._add("comparison", target, target.with_changes(operator=_respaced(flipped, target.operator)))
            value = _int_value(target.comparator)
            if value is not None:
                self._add("off-by-one", target.comparator, _plus(target.comparator, 1))

    def visit_Slice(self, node: cst.Slice) -> None:
        for part in (node.lower, node.upper):
            if part is not None:
                self._add("off-by-one", part, _plus(part, 1))

    def visit_Index(self, node: cst.Index) -> None:
        value = _int_value(node.value)
        if value is not None:
            self._add("off-by-one", node.value, _plus(node.value, 1))

    def visit_Call(self, node: cst.Call) -> None:
        name = node.func.value if isinstance(node.func, cst.Name) else None
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if name == "range":
            for arg in positional:
                self._add("off-by-one", arg.value, _plus(arg.value, 1 if _int_value(arg.value) == 0 else -1))
        if name not in _NO_SWAP and len(positional) >= 2 and positional[:2] == list(node.args[:2]):
            a, b = node.args[0], node.args[1]
            if _code(a.value) != _code(b.value):
                swapped = [a.with_changes(value=b.value), b.with_changes(value=a.value), *node.args[2:]]
                self._add("swapped-arguments", node, node.with_changes(args=swapped))

    def _condition(self, node: cst.If | cst.While | cst.IfExp) -> None:
        self._add("negated-condition", node.test, _negated(node.test))

    def visit_If(self, node: cst.If) -> None:
        self._condition(node)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._condition(node)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        swapped = _BINARY.get(type(node.operator))
        if swapped is not None and not (isinstance(node.left, cst.SimpleString) or
                                        isinstance(node.right, (cst.SimpleString, cst.FormattedString))):
            self._add("swapped-operator", node, node.with_changes(operator=_respaced(swapped, node.operator)))

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        self._add("swapped-operator", node, node.with_changes(operator=_respaced(_BOOLEAN[type(node.operator)],
                                                                                 node.operator)))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        # An `if` with no else whose body leaves (return, raise, continue, break): a guard. Removed, the
        # code falls through to what the guard kept it from; never the block's only statement.
        if len(node.body) < 2:
            return
        for stmt in node.body:
            if isinstance(stmt, cst.If) and stmt.orelse is None and _exits(stmt.body):
                self._add("removed-branch", stmt, cst.RemovalSentinel.REMOVE)  # type: ignore[arg-type]


def _respaced(new: type, old: cst.CSTNode) -> Any:
    """An operator of type `new` spaced as `old` was (`a<b` stays tight, `a < b` keeps its spaces)."""
    return new(**{k: getattr(old, k) for k in ("whitespace_before", "whitespace_after") if hasattr(old, k)})


def _exits(body: cst.BaseSuite) -> bool:
    last = body.body[-1] if body.body else None
    if isinstance(last, cst.SimpleStatementLine):
        return any(isinstance(s, _EXITS) for s in last.body)
    return False


def _changed_default(default: cst.BaseExpression) -> cst.BaseExpression | None:
    value = _int_value(default)
    if value is not None:
        return cst.Integer(str(value + 1))
    if isinstance(default, cst.Name) and default.value in ("True", "False"):
        return cst.Name("False" if default.value == "True" else "True")
    if isinstance(default, cst.SimpleString) and default.evaluated_value not in ("", b""):
        prefix = default.prefix
        quote = default.quote
        return cst.SimpleString(f"{prefix}{quote}{quote}")
    return None


class Mutator:
    """The sites of one module, parsed once; `mutate(i)` is the module with site i rewritten."""

    def __init__(self, source: str) -> None:
        """Raises cst.ParserSyntaxError for what Python cannot parse."""
        wrapper = MetadataWrapper(cst.parse_module(source))
        collector = _Collector()
        wrapper.visit(collector)
        self._module, self._found = wrapper.module, collector.found
        positions = wrapper.resolve(PositionProvider)
        self.sites = [Site(i, operator, positions[node].start.line, function, _code(node).strip(),
                           "" if isinstance(new, cst.RemovalSentinel) else _code(new).strip())
                      for i, (operator, node, new, function) in enumerate(self._found)]

    def mutate(self, index: int) -> str:
        _, node, new, _ = self._found[index]
        changed = self._module.deep_remove(node) if isinstance(new, cst.RemovalSentinel) \
            else self._module.deep_replace(node, new)
        assert isinstance(changed, cst.Module)
        return changed.code
