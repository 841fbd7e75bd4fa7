"""`import detr` needs only torch, torchvision and scipy: exporters, notebooks and torch.hub users load the
model without the training stack (Lightning), the image pipeline (albumentations, OpenCV), figures
(matplotlib) or any interop package (transformers, timm, safetensors, onnx, onnxruntime, supervision)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HEAVY = ("lightning", "albumentations", "cv2", "matplotlib", "transformers", "timm", "safetensors", "onnx",
         "onnxruntime", "openvino", "pycocotools", "fastapi", "uvicorn", "supervision", "detr.data", "detr.lightning",
         "detr.serving")


def test_import_detr_loads_only_the_model_stack() -> None:
    code = ("import sys, detr; detr.load_checkpoint; detr.build_detr; detr.PostProcess; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


# --- The layering (docs/STYLE habit 16): imports point down the layers and never form a cycle. ---
# Every import counts, those inside functions too: a function-local import hides a cycle from Python's
# import machinery, not from a reader. A package's __init__ is the module named after the package.

PACKAGE = Path(__file__).resolve().parents[1] / "detr"

#: Layers that must not be imported from the named layer (besides the shared leaves detr.box_ops and
#: detr.categories, which every layer may use).
FORBIDDEN = {  # docs/layout.md: what each layer may import
    "detr.models": ("detr.loss", "detr.inference", "detr.checkpoints", "detr.lightning", "detr.data",
                    "detr.evaluation", "detr.visualize", "detr.serving", "detr.commands"),
    "detr.loss": ("detr.inference", "detr.checkpoints", "detr.lightning", "detr.data", "detr.evaluation",
                  "detr.visualize", "detr.serving", "detr.commands"),
    "detr.data": ("detr.models", "detr.loss", "detr.inference", "detr.checkpoints", "detr.lightning",
                  "detr.evaluation", "detr.visualize", "detr.serving", "detr.commands"),
    "detr.evaluation": ("detr.models", "detr.loss", "detr.inference", "detr.checkpoints", "detr.lightning",
                        "detr.data", "detr.visualize", "detr.serving", "detr.commands"),
    "detr.checkpoints": ("detr.loss", "detr.lightning", "detr.data", "detr.evaluation", "detr.visualize",
                         "detr.serving", "detr.commands"),
    "detr.visualize": ("detr.loss", "detr.checkpoints", "detr.lightning", "detr.serving", "detr.commands"),
    "detr.lightning": ("detr.serving", "detr.commands"),
    # serving sits beside lightning: inference, checkpoints and visualize below it, never the training stack
    "detr.serving": ("detr.lightning", "detr.commands"),
}
#: The one module of a forbidden layer that a layer may import: the data pipeline follows the models' input
#: contract (sizes, normalisation, padding); the panoptic evaluator opens a json's PNGs by the data layer's
#: file-name rule.
ALLOWED = {"detr.data": ("detr.models.inputs",), "detr.evaluation": ("detr.data.file_names",)}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The detr modules that ``path`` imports anywhere in its body (relative imports resolved). ``from a
    import b`` counts a.b when that is a module, else a (b is then a name defined in a)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            # `import detr.a.b` imports detr.a.b (and its parents' __init__, which are not edges of interest)
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """detr module → the detr modules it imports (anywhere in the file)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {_module_name(path): _imported_modules(path, modules) for path in paths}


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of one module without a self-loop are left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["e", "f"]]


def test_the_import_graph_sees_relative_and_function_local_imports(tmp_path, monkeypatch) -> None:
    package = tmp_path / "detr"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from detr.sub import a\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("def f():\n    from . import b\n")
    (package / "sub" / "b.py").write_text("from ..sub.a import f\nimport detr.sub\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert import_graph() == {"detr": {"detr.sub.a"}, "detr.sub": set(), "detr.sub.a": {"detr.sub.b"},
                              "detr.sub.b": {"detr.sub.a", "detr.sub"}}


def test_no_import_cycle_among_detr_modules() -> None:
    graph = import_graph()
    cycles = strongly_connected_components(graph)
    report = "\n".join(
        " <-> ".join(component) + ": " + "; ".join(f"{module} imports {sorted(graph[module] & set(component))}"
                                                  for module in component)
        for component in cycles)
    assert not cycles, f"import cycles among detr modules (imports inside functions included):\n{report}"


def test_the_package_root_holds_at_most_five_modules() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert len(root) <= 5, f"detr/ holds {len(root)} modules at its root: {root}; move each into its layer's folder"


def test_imports_point_down_the_layers() -> None:
    wrong = [f"{module} imports {target}"
             for module, targets in import_graph().items()
             for layer, forbidden in FORBIDDEN.items() if module == layer or module.startswith(layer + ".")
             for target in sorted(targets) if any(target == f or target.startswith(f + ".") for f in forbidden)
             and target not in ALLOWED.get(layer, ())]
    assert not wrong, "imports that point up the layers:\n" + "\n".join(wrong)


def test_tests_share_helpers_through_helper_modules() -> None:
    """Test modules and benchmarks import shared code from tests/helpers.py (or another helper module), never
    from conftest.py (pytest loads that itself, as a plugin: importing it again makes a second copy) or from a
    test module (that ties two test files together, and imported fixtures or tests run in both)."""
    repo = PACKAGE.parent
    wrong = []
    for path in sorted([*(repo / "tests").rglob("*.py"), *(repo / "benchmarks").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(repo)}:{node.lineno} imports {name}" for name in names
                      if name == "tests.conftest" or name.split(".")[-1].startswith("test_")]
    assert not wrong, "import shared test code from tests/helpers.py instead:\n" + "\n".join(wrong)


# --- Families (docs/STYLE habit 20): a family folder imports the shared blocks (detr.models.layers), the top-level
# model modules and at most its declared parent; the shared blocks import no family. ---

#: Each family folder's declared parent (the folder it builds on); a folder not named here has none.
FAMILY_PARENTS = {"dfine": "rtdetr", "deimv2": "dfine"}


def family_folders() -> set[str]:
    """The family folders: every package directly under detr/models but the shared layers."""
    return {path.parent.name for path in (PACKAGE / "models").glob("*/__init__.py")} - {"layers"}


def family_import_violations(graph: dict[str, set[str]], families: set[str]) -> list[str]:
    """``module imports target`` for every import of a family folder from outside it, other than from its declared
    child (:data:`FAMILY_PARENTS`)."""
    def family_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["detr", "models"] and parts[2] in families else None

    wrong = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        importer = family_of(module)
        shared_layer = parts[:3] == ["detr", "models", "layers"]
        if importer is None and not shared_layer:
            continue
        for target in sorted(targets):
            imported = family_of(target)
            if imported is not None and imported != importer and imported != FAMILY_PARENTS.get(importer or ""):
                wrong.append(f"{module} imports {target}")
    return wrong


def test_the_family_rule_finds_a_cross_family_import() -> None:
    graph = {"detr.models.rfdetr.decoder": {"detr.models.rtdetr.decoder", "detr.models.layers.mlp"},
             "detr.models.dfine.decoder": {"detr.models.rtdetr.decoder", "detr.models.dfine.encoder"},
             "detr.models.deimv2.model": {"detr.models.dfine.model", "detr.models.rtdetr.model"},
             "detr.models.layers.denoising": {"detr.models.anchor.denoising"},
             "detr.models.build": {"detr.models.rtdetr.build"}}
    assert family_import_violations(graph, {"rfdetr", "rtdetr", "dfine", "deimv2", "anchor"}) == [
        "detr.models.deimv2.model imports detr.models.rtdetr.model",
        "detr.models.layers.denoising imports detr.models.anchor.denoising",
        "detr.models.rfdetr.decoder imports detr.models.rtdetr.decoder"]


def test_a_family_folder_imports_shared_layers_and_its_parent_only() -> None:
    families = family_folders()
    assert {"rtdetr", "dfine", "rfdetr", "deformable", "anchor"} <= families
    wrong = family_import_violations(import_graph(), families)
    assert not wrong, ("a family folder imports another family's folder (move the shared block to "
                       "detr/models/layers/, or declare the parent in FAMILY_PARENTS):\n" + "\n".join(wrong))
