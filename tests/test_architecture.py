"""The rules of posenc's layout (docs/architecture.md), checked on the source.

* a module holds one idea, as long as the idea: one past about 800 lines says why in its
  docstring (a paragraph that starts ``Length:``);
* no import cycle between posenc's modules (imports inside functions included), nor
  between its packages (``posenc.cli`` imports ``posenc.bench``, never the reverse);
* no module of the core imports a private name of another core module;
* the core imports no framework, no spec and no tool;
* every front end's ``_backend.py`` has the same primitives, with the same signatures,
  and nothing else;
* every public module and layer of a front end has at most two posenc classes among its
  bases, ancestors included (a role and the table lifecycle, say): one to read for each
  concern, not a stack of mixins.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "posenc"
LONG_MODULE = 800  # lines; a module longer than this says why (``Length:``)
PRIMITIVES = (
    "dtype_name",
    "format_of",
    "gather_rows",
    "index_range",
    "is_traced",
    "known_value",
    "to_index",
    "to_tensor",
    "wide_index",
)
FRAMEWORKS = ("torch", "keras", "tensorflow", "jax", "flax", "matplotlib", "tqdm")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``pkg/__init__.py`` as ``pkg``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """``(module imported, names imported from it)`` for every import in the file, with
    relative imports resolved; ``if TYPE_CHECKING:`` blocks are skipped."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = {
        id(node)
        for guard in ast.walk(tree)
        if isinstance(guard, ast.If) and "TYPE_CHECKING" in ast.unparse(guard.test)
        for child in guard.body
        for node in ast.walk(child)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [alias.name for alias in node.names]))
    return found


def internal_target(module: str, names: list[str]) -> list[str]:
    """The posenc modules an import statement loads (``from pkg import submodule`` too)."""
    targets = [module] if module in MODULES else []
    targets += [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    return targets


def test_a_long_module_says_why():
    unexplained = {
        name: count
        for name, path in MODULES.items()
        if (count := len((text := path.read_text(encoding="utf-8")).splitlines())) > LONG_MODULE
        and "\nLength: " not in (ast.get_docstring(ast.parse(text)) or "")
    }
    assert unexplained == {}, (
        f"modules past {LONG_MODULE} lines without a 'Length:' paragraph in their docstring "
        f"that says why they hold one idea: {unexplained}"
    )


def import_graph(group: Any = lambda name: name) -> dict[str, set[str]]:
    """Who imports whom among posenc's modules, each named by ``group(module)``."""
    graph: dict[str, set[str]] = {group(name): set() for name in MODULES}
    for name, path in MODULES.items():
        for module, names in imports(name, path):
            for target in internal_target(module, names):
                if target != name and not name.startswith(target + "."):  # its own parent
                    graph[group(name)].add(group(target))
    for node, targets in graph.items():
        targets.discard(node)
    return graph


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (depth-first search for a back edge), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = first_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_packages():
    # posenc.core.rope and posenc.core are one package here: a package is posenc's child
    cycle = first_cycle(import_graph(lambda name: ".".join(name.split(".")[:2])))
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


def test_the_core_imports_no_private_name_of_another_module():
    offenders = [
        f"{name} imports {imported} from {module}"
        for name, path in MODULES.items()
        if name.startswith("posenc.core")
        for module, names in imports(name, path)
        if module.startswith("posenc.") and module != name
        for imported in names
        if imported.startswith("_") and not imported.startswith("__")
    ]
    assert offenders == []


def test_the_core_imports_no_framework_spec_or_tool():
    offenders = [
        f"{name} imports {module}"
        for name, path in MODULES.items()
        if name.startswith("posenc.core")
        for module, _ in imports(name, path)
        if module.split(".")[0] in FRAMEWORKS
        or (module.startswith("posenc.") and not module.startswith(("posenc.core", "posenc._")))
    ]
    assert offenders == []


def _backend(frontend: str):
    if importlib.util.find_spec(frontend) is None:
        pytest.skip(f"{frontend} is not installed")
    return importlib.import_module(f"posenc.{frontend}._backend")


@pytest.mark.parametrize("frontend", ["torch", "keras", "jax"])
def test_every_backend_has_the_primitives_and_nothing_else(frontend):
    backend = _backend(frontend)
    assert sorted(backend.__all__) == sorted(PRIMITIVES)
    missing = [name for name in PRIMITIVES if not callable(getattr(backend, name, None))]
    assert missing == [], f"posenc.{frontend}._backend lacks {missing}"


@pytest.mark.parametrize("frontend", ["keras", "jax"])
def test_the_primitives_have_the_same_signatures_in_every_front_end(frontend):
    """The parameters (names, order, kinds, defaults) of each primitive are PyTorch's."""
    reference, backend = _backend("torch"), _backend(frontend)

    def parameters(function):
        return [
            (p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
        ]

    for name in PRIMITIVES:
        assert parameters(getattr(backend, name)) == parameters(getattr(reference, name)), name


def _front_end(package: str):
    """``posenc.<package>``, or a skip when its framework is not installed."""
    needs = {"jax.linen": ("jax", "flax")}.get(package, (package,))
    if any(importlib.util.find_spec(name) is None for name in needs):
        pytest.skip(f"{package} is not installed")
    return importlib.import_module(f"posenc.{package}")


@pytest.mark.parametrize("package", ["torch", "keras", "jax", "jax.linen"])
def test_dir_of_a_front_end_shows_its_public_api(package):
    module = _front_end(package)
    shown = set(dir(module))
    assert set(module.__all__) <= shown
    assert shown - set(module.__all__) <= {"linen"}  # posenc.jax's lazily imported package
    assert not {"torch", "jax", "keras", "missing", "importlib"} & shown


MAX_POSENC_BASES = 2


@pytest.mark.parametrize("package", ["torch", "keras", "jax.linen"])
def test_public_modules_have_at_most_two_posenc_base_classes(package):
    front = _front_end(package)  # posenc.keras under the backend the suite runs in
    stacked = {}
    for name in front.__all__:
        cls = getattr(front, name)
        if not inspect.isclass(cls):
            continue
        bases = [c.__qualname__ for c in cls.__mro__[1:] if c.__module__.startswith("posenc")]
        if len(bases) > MAX_POSENC_BASES:
            stacked[name] = bases
    assert stacked == {}


# The module every front end keeps each kind of scheme in (one of these per front end,
# where it has the scheme): a reader who knows one front end finds it in the others.
SCHEME_MODULES = {
    "encodings": {"SinusoidalPositionalEncoding", "sinusoidal"},
    "nd": {"SinusoidalPositionalEncodingND", "sinusoidal_nd"},
    "rope": {"RotaryEmbedding", "rope_tables", "apply_rope"},
    "bias": {"ALiBiBias", "T5RelativeBias", "alibi_bias", "t5_bias"},
    "kernel_bias": {
        "KERPLEBias",
        "FIREBias",
        "SandwichBias",
        "kerple_bias",
        "fire_bias",
        "sandwich_bias",
    },
    "packing": {"positions_from_cu_seqlens", "positions_from_attention_mask"},
}


@pytest.mark.parametrize("package", ["torch", "keras", "jax", "jax.linen"])
def test_each_scheme_lives_in_the_same_named_module_in_every_front_end(package):
    front = _front_end(package)
    misplaced = {
        name: getattr(front, name).__module__
        for module, names in SCHEME_MODULES.items()
        for name in names
        if hasattr(front, name) and getattr(front, name).__module__ != f"posenc.{package}.{module}"
    }
    assert misplaced == {}
