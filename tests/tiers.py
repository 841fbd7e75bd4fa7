"""The suite's two tiers, decided from what each test uses, so that nobody has to remember to mark a test.

A test is an *integration* test when its code (its function, the fixtures it requests and the helpers in tests/
that these call, followed through) drives the Lightning CLI or a ``Trainer``, runs the demo's training, exports
or quantises (``torch.export``, ONNX, OpenVINO, NNCF), starts a server, a browser, a subprocess or DDP, or is
marked ``slow``. ``make test`` leaves these out (``-m "not integration"``); ``make test-all`` (CI) runs all.

A *parity* test, one that compares with another implementation (the literal reference DETR and the authors'
panoptic model in tests/reference_*.py, transformers' models and image processors, torchmetrics' PQ, the losses'
formulas in tests/loss/), stays in the quick tier whatever else it uses, unless it exports (then it is an export
test whose model happens to come from transformers): a parity check is what ``make test`` is for.

The rules read source code only (``inspect.getsource`` and the names a module binds); nothing runs.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

INTEGRATION = "integration"
PARITY = "parity"

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# What a qualified name (module.qualname of the object a name resolves to, or an imported module's dotted path)
# is, or is inside, -> why it makes a test an integration test; a trailing "*" matches any continuation.
HEAVY_PREFIXES = {
    "detr.lightning.cli.": "Lightning CLI",
    "detr.lightning.command.": "Lightning CLI",
    "detr.commands.demo.main": "demo training",
    "lightning.pytorch.trainer.trainer.Trainer": "Trainer",
    "lightning.Trainer": "Trainer",
    "lightning.pytorch.Trainer": "Trainer",
    "lightning.pytorch.strategies.ddp": "DDP",
    "detr.checkpoints.export.export*": "export",  # export, export_onnx, export_program, export_openvino
    "detr.inference.quantize.quantize*": "quantise",
    "detr.commands.export": "export",
    "torch.onnx.export": "export",
    "torch.onnx.utils.export": "export",
    "torch.export.export": "export",
    "openvino": "export",
    "nncf": "quantise",
    "detr.commands.serve.main": "server",
    "uvicorn": "server",
    "tests.browser.": "browser",
    "subprocess": "subprocess",
    "multiprocessing": "subprocess",
    "torch.multiprocessing": "subprocess",
}
# Names called on a fixture's value, where the object cannot be resolved without running the fixture.
HEAVY_CALLED_NAMES = {"running_server": "server", "fit": "Trainer"}
HEAVY_FIXTURES = {"chromium": "browser"}
# benchmarks/ and tools/ scripts a test names ("tools/export.py", "panoptic_shapes.py", load_tool("predict")): text
# that makes running them heavy (they are scripts, not test code, so the text is matched rather than resolved),
# in them or in the scripts beside them that they import.
HEAVY_SCRIPT_TEXT = {"Trainer(": "Trainer", ".fit(": "Trainer", "subprocess": "subprocess",
                     "detr.lightning.cli": "Lightning CLI", "detr.commands.export": "export",
                     "detr.commands.demo": "demo training", "detr.commands.serve": "server"}

PARITY_PREFIXES = ("transformers", "tests.reference_detr", "tests.reference_segmentation", "torchmetrics")
PARITY_FOLDERS = ("loss",)


@dataclass
class Uses:
    """What a test's code refers to: qualified names of the objects and modules, names called on values that
    cannot be resolved statically, the strings given as a Lightning ``strategy``, and the names of ``.py`` files
    (scripts of benchmarks/ and tools/, whose text is read)."""

    qualnames: set[str] = field(default_factory=set)
    called: set[str] = field(default_factory=set)
    strategies: set[str] = field(default_factory=set)
    scripts: set[str] = field(default_factory=set)

    def update(self, other: Uses) -> None:
        self.qualnames |= other.qualnames
        self.called |= other.called
        self.strategies |= other.strategies
        self.scripts |= other.scripts


def _qualname(obj: Any) -> str | None:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    return None


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None when the base is not a plain name (a call, a subscript)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _resolve(chain: list[str], namespace: dict) -> list[Any]:
    """The objects ``chain`` names step by step (a module's or class's attributes only: nothing is called)."""
    if chain[0] not in namespace:
        return []
    objects = [namespace[chain[0]]]
    for name in chain[1:]:
        holder = objects[-1]
        if not isinstance(holder, (types.ModuleType, type)):
            break
        try:
            objects.append(inspect.getattr_static(holder, name) if isinstance(holder, type) else getattr(holder, name))
        except AttributeError:
            break
    return objects


def _in_tests(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "tests" or module.startswith("tests.") or module == "conftest")


@functools.cache
def _uses_of(func: Callable) -> tuple[Uses, tuple[Callable, ...]]:
    """What ``func``'s own source refers to, and the functions and classes of tests/ it refers to."""
    uses, followed = Uses(), []
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return uses, ()
    namespace = getattr(func, "__globals__", None)
    if namespace is None:  # a class: its methods share the module's globals
        namespace = vars(inspect.getmodule(func)) if inspect.getmodule(func) else {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses.qualnames |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            uses.qualnames |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        elif isinstance(node, ast.keyword) and node.arg == "strategy":
            uses.strategies |= {inner.value for inner in ast.walk(node.value)
                                if isinstance(inner, ast.Constant) and isinstance(inner.value, str)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "--trainer.strategy=" in node.value:
                uses.strategies.add(node.value.split("--trainer.strategy=", 1)[1])
            if node.value.endswith(".py"):
                uses.scripts.add(node.value)
        elif isinstance(node, ast.Call):
            chain = _chain(node.func)
            if chain and chain[-1] == "load_tool" and node.args:
                argument = node.args[0]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    uses.scripts.add(f"tools/{argument.value}.py")
            if isinstance(node.func, ast.Attribute):
                uses.called.add(node.func.attr)
        if isinstance(node, (ast.Name, ast.Attribute)):
            chain = _chain(node)
            for obj in _resolve(chain, namespace) if chain else []:
                name = _qualname(obj)
                if name:
                    uses.qualnames.add(name)
                if _in_tests(obj) and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj is not func:
                    followed.append(obj)
    return uses, tuple(followed)


def collect_uses(roots: list[Callable]) -> Uses:
    """The union of what ``roots`` and the tests/ functions and classes they refer to (followed through) use."""
    uses, seen, stack = Uses(), set(), list(roots)
    while stack:
        func = stack.pop()
        func = getattr(func, "__func__", func)  # a bound method
        func = inspect.unwrap(func)
        if id(func) in seen:
            continue
        seen.add(id(func))
        own, followed = _uses_of(func)
        uses.update(own)
        stack.extend(followed)
    return uses


def item_roots(item: pytest.Item) -> list[Callable]:
    """The test function and the functions of every fixture it requests (directly or through other fixtures)."""
    roots = [item.obj] if getattr(item, "obj", None) is not None else []
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for definition in (info.name2fixturedefs.get(name, ()) if info else ()):
            roots.append(definition.func)
    return roots


def _under(name: str, prefix: str) -> bool:
    """Whether the dotted ``name`` is ``prefix`` or inside it ("subprocess.run" is under "subprocess"), or, for a
    prefix that ends in "*", starts with the rest."""
    if prefix.endswith("*"):
        return name.startswith(prefix[:-1])
    prefix = prefix.rstrip(".")
    return name == prefix or name.startswith(prefix + ".")


@functools.cache
def _script_reasons(script: Path) -> frozenset[str]:
    """Why running the script at ``script`` is heavy, with the scripts beside it that it imports."""
    text = script.read_text()
    reasons = {reason for needle, reason in HEAVY_SCRIPT_TEXT.items() if needle in text}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("from", "import") and (script.parent / f"{words[1]}.py").is_file():
            reasons |= _script_reasons(script.parent / f"{words[1]}.py")
    return frozenset(reasons)


def _scripts(uses: Uses) -> list[Path]:
    """The scripts of benchmarks/ and tools/ that a test's code names: "tools/export.py" or "convergence.py"."""
    found = []
    for name in uses.scripts:
        found += [path for path in (REPO / name, REPO / "benchmarks" / name, REPO / "tools" / name) if path.is_file()]
    return found


def heavy_reasons(item: pytest.Item, uses: Uses) -> set[str]:
    """Why ``item`` is an integration test (empty when it is not)."""
    reasons = {reason for name in uses.qualnames for prefix, reason in HEAVY_PREFIXES.items() if _under(name, prefix)}
    reasons |= {reason for name, reason in HEAVY_CALLED_NAMES.items() if name in uses.called}
    reasons |= {reason for name, reason in HEAVY_FIXTURES.items() if name in getattr(item, "fixturenames", ())}
    reasons |= {reason for script in _scripts(uses) for reason in _script_reasons(script)}
    if any(strategy.startswith("ddp") for strategy in uses.strategies):
        reasons.add("DDP")
    if item.get_closest_marker("slow"):
        reasons.add("slow")
    return reasons


def is_parity(item: pytest.Item, uses: Uses, reasons: set[str]) -> bool:
    """Whether ``item`` compares with another implementation (transformers, a reference in tests/, a formula). A
    test that exports is an export test, also when its model comes from transformers."""
    if reasons & {"export", "quantise"}:
        return False
    path = Path(str(item.path)).resolve()
    if path.parent.name in PARITY_FOLDERS and path.parent.parent == TESTS:
        return True
    return any(_under(name, prefix) for name in uses.qualnames for prefix in PARITY_PREFIXES)


def classify(item: pytest.Item) -> tuple[set[str], bool]:
    """(why ``item`` is an integration test, whether it is a parity test)."""
    uses = collect_uses(item_roots(item))
    reasons = heavy_reasons(item, uses)
    return reasons, is_parity(item, uses, reasons)
