"""The shape of release/: the import graph has no cycle, no module imports another's private
name, every subpackage says what it owns, the registry's gates keep the contract, and the Python
reference stays outside the pipeline and the tests (and out of every wheel)."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from release.gates import registry
from release.gates.contract import Judges
from release.util.paths import REFERENCE_DIR, REPO_ROOT

PACKAGE = REPO_ROOT / "release"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names) of every import executed at run time, function-level ones included."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, names in _imports(ast.parse(path.read_text())):
            if not module.startswith("release"):
                continue
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
            if len(targets) < len(names) or not names:
                targets.append(module)
            graph[name] |= {t for t in targets if t in MODULES and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in graph:
        if node not in index:
            connect(node)
    return components


def test_release_has_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle() -> None:
    graph = _graph()
    graph["release.manifest"].add("release.steps")  # steps imports manifest
    assert any("release.manifest" in c and "release.steps" in c for c in _cycles(graph))


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{_module_name(path)} imports {module}.{name}"
        for path in MODULES.values()
        for module, names in _imports(ast.parse(path.read_text()))
        if module.startswith("release") or module.startswith("reference")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def test_the_scripts_run_in_child_interpreters_import_nothing_of_the_pipeline() -> None:
    for name, path in MODULES.items():
        if name.startswith("release.scripts."):
            imported = [m for m, _ in _imports(ast.parse(path.read_text()))]
            assert not [m for m in imported if m.startswith("release")], name


@pytest.mark.parametrize(
    "package", sorted({n.rsplit(".", 1)[0] for n in MODULES if n.count(".") > 1})
)
def test_every_subpackage_says_what_it_owns_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    assert len(doc) > 80, package
    assert "import" in doc, f"{package}: its docstring should say what it may import"


@pytest.mark.parametrize("name", registry.names())
def test_each_registered_gate_keeps_the_contract(name: str) -> None:
    gate = registry.load(name)
    assert gate.name == name
    assert gate.runner in ("cpu", "gpu")
    assert isinstance(gate.judges, Judges)
    assert (gate.shared_file is not None) == (gate.judges is Judges.SHARED_FILE)
    assert callable(gate.run)


def test_a_registry_line_that_disagrees_with_its_gate_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(registry._GATES, "payload", ("release.gates.payload", "gpu"))
    with pytest.raises(AssertionError, match="registry says 'payload' on 'gpu'"):
        registry.load("payload")


def test_the_python_reference_lives_outside_the_pipeline_and_the_tests() -> None:
    assert REFERENCE_DIR == REPO_ROOT / "reference"
    assert (REFERENCE_DIR / "engine.py").is_file()
    assert not (REPO_ROOT / "tests" / "reference").exists()
    engine = importlib.import_module("reference.engine")
    assert Path(engine.__file__).resolve().parent == REFERENCE_DIR


# The distributions of pyproject's `gpu-runner` group (and theirs), by top-level module.
GPU_RUNNER_MODULES = frozenset({
    "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions",
    "rich", "markdown_it", "mdurl", "pygments", "packaging", "securesystemslib", "cryptography",
    "cffi", "_cffi_backend", "pycparser", "numpy", "tomlkit",
})  # fmt: skip


def test_a_gpu_runner_needs_only_its_dependency_group(tmp_path: Path) -> None:
    """`python -m release gpu-gates`, judging a wheel and signing its attestations with a
    runner key (here without a GPU: "not run", still signed), loads third-party modules of the
    `gpu-runner` group only: nothing of the build, index or TUF stacks."""
    import subprocess
    import sys

    from fixtures_wheels import build_wheel

    wheel = build_wheel(tmp_path / "dist", tag="cp312-abi3-manylinux_2_28_x86_64")
    code = (
        "import runpy, sys, sysconfig\n"
        "started = set(sys.modules)  # what site's .pth hooks loaded is not the pipeline's\n"
        "sys.argv = ['release', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('release', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "site = sysconfig.get_paths()['purelib']\n"
        "print(sorted({name.split('.')[0] for name, module in list(sys.modules.items())\n"
        "              if name not in started\n"
        "              and (getattr(module, '__file__', None) or '').startswith(site)}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "gpu-gates", "--wheel", str(wheel), "--out",
         str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"')))
    assert loaded - GPU_RUNNER_MODULES == set(), result.stdout
    assert {"securesystemslib", "cryptography"} <= loaded  # it did sign
    assert (tmp_path / "out" / "evidence" / "warmup.intoto.json").is_file()


def test_a_new_gate_is_one_module_and_one_registry_line(monkeypatch, tmp_path: Path) -> None:
    """Without its registry line the manifest that declares it is refused; with it, the gate runs
    through the registry like every other and leaves its evidence."""
    from fixtures_wheels import build_wheel, wheel_set

    from release import steps
    from release.context import Context
    from release.errors import ManifestError
    from release.evidence import read_evidence
    from release.manifest import load_manifest
    from release.util.paths import DEFAULT_MANIFEST

    manifest_path = tmp_path / "activekv.toml"
    manifest_path.write_text(DEFAULT_MANIFEST.read_text() + '\n[gates.non-empty]\nrunner = "cpu"\n')
    with pytest.raises(ManifestError, match=r"gates\.non-empty: expected a gate the pipeline has"):
        load_manifest(manifest_path)
    monkeypatch.setitem(registry._GATES, "non-empty", ("fixtures_gate", "cpu"))
    manifest = load_manifest(manifest_path)
    context = Context(manifest, REPO_ROOT, tmp_path / "out", tmp_path / "state")
    wheels = wheel_set(build_wheel(tmp_path / "dist", tag="py3-none-any"))
    inputs = steps.gate_inputs(context, wheels, gpu=None)
    assert registry.run_gate("non-empty", inputs).verdict == "pass"
    evidence = read_evidence(context.out_dir, "non-empty")
    assert evidence is not None and evidence.artefacts == wheels.digests
