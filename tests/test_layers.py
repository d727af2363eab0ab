"""The library's layers (docs/design.md, "Layers"): every module of `rlhf/` imports only from its own layer or the
layers below it, and no import chain, at module level or inside a function, comes back to where it started."""

import ast
import re

from conftest import REPO

# Bottom to top. `data` is rlhf/data.py with rlhf/chat.py; every other name is a package of rlhf/.
LAYERS = ["core", "task", "data", "judges", "benchmarks", "analysis", "stage", "models", "loop", "rollout"]
LAYERS += ["methods"]
LAYERS += ["online", "pipeline", "report"]
SAME_LAYER = {"chat": "data"}


def library_imports() -> dict[str, set[str]]:
    """Each module of rlhf/ (dotted) -> the modules of rlhf/ it imports, anywhere in its file."""
    modules = {
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (REPO / "rlhf").rglob("*.py")
    }
    imports = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhf"):
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    found.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("rlhf")}
        assert found <= set(modules), (name, found - set(modules))
        imports[name] = found - {name}
    return imports


def layer(module: str) -> int | None:
    parts = module.split(".")
    return None if len(parts) == 1 else LAYERS.index(SAME_LAYER.get(parts[1], parts[1]))


def test_every_module_imports_only_its_layer_or_below():
    imports = library_imports()
    assert all(layer(module) is not None for module in imports if module != "rlhf")  # every module has a layer
    climbs = [
        f"{m} -> {d}" for m, deps in imports.items() for d in deps if layer(m) is not None and layer(d) > layer(m)
    ]
    assert climbs == []


def test_no_import_circle():
    imports = library_imports()
    done: set[str] = set()
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for dependency in sorted(imports[module]):
            if dependency in path:
                circles.append(" -> ".join(path[path.index(dependency) :] + [dependency]))
            elif dependency not in done:
                visit(dependency, path + [dependency])
        done.add(module)

    for module in sorted(imports):
        visit(module, [module])
    assert circles == []


def test_the_design_page_draws_the_layers_in_order():
    text = (REPO / "docs" / "design.md").read_text()
    drawn = re.search(r"## Layers\n(.*?)\n## ", text, re.S).group(1)
    names = re.findall(r"^\s*rlhf/(\w+)", drawn, re.M)
    top_down = [SAME_LAYER.get(n, n) for n in names]
    assert list(dict.fromkeys(reversed(top_down))) == LAYERS
