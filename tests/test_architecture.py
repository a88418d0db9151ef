"""The shape of release/: the import graph has no cycle, no module imports another's private
name, every subpackage says what it owns, the registry's gates keep the contract, and the Python
reference stays outside the pipeline and the tests (and out of every wheel)."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from release import catalogue
from release.gates import registry
from release.gates.contract import Judges
from release.util.paths import REFERENCE_DIR, REPO_ROOT

PACKAGE = REPO_ROOT / "release"

# What each part of release/ and reference/ may import of the pipeline: the most specific key
# that holds a module is its rule; a module always may import its own package. Every edge
# counts, those under TYPE_CHECKING too (a type is a dependency; it only loads later).
MAY_IMPORT: dict[str, frozenset[str]] = {
    key: frozenset(value.split())
    for key, value in {
        "release": "",
        "release.errors": "",
        "release.catalogue": "release.util",  # the gates a manifest may name, and their models
        "release.util": "release.errors",
        "release.manifest": "release.errors release.util release.catalogue",
        "release.records": "release.errors release.util",
        "release.evidence": "release.errors release.util release.records",
        "release.source_state": "release.errors release.util release.records",
        "release.wheelset": "release.errors release.util release.manifest release.records",
        "release.statement": "release.errors release.util release.evidence",
        "release.gpu": "release.errors release.evidence",
        "release.context": "release.errors release.util release.manifest release.records "
        "release.wheelset",
        "release.scripts": "",  # run in child interpreters, which have none of the pipeline
        "release.scripts.parity_replay": "reference",  # the child replays the reference too
        "release.builder": "release.errors release.util release.manifest release.records "
        "release.evidence release.source_state release.wheelset",
        "release.gates": "release.errors release.util release.manifest release.catalogue "
        "release.records release.evidence release.wheelset release.gpu release.builder "
        "release.scripts",  # the scripts' constants only (below)
        "release.trust": "release.errors release.util release.manifest release.catalogue "
        "release.records release.evidence release.statement release.source_state "
        "release.wheelset",
        # The trust steps adapt a step's context to the trust modules: the publisher's, and the
        # consumer's (verify --index, rebuild), which need none of the publisher's records.
        "release.trust.steps": "release.errors release.util release.manifest release.catalogue "
        "release.records release.evidence release.statement release.source_state "
        "release.wheelset release.context",
        "release.trust.consumer_steps": "release.errors release.util release.context",
        "release.report": "release.errors release.util release.manifest release.records "
        "release.evidence release.statement release.wheelset release.gpu "
        "release.trust.index",  # the consumer's install line
        "release.bench": "release.errors release.util release.manifest release.records "
        "release.wheelset release.builder release.gpu release.scripts",
        "release.ci": "release.errors release.util release.manifest release.catalogue "
        "release.records release.wheelset release.builder release.trust release.report",
        # The replay of the workflow (ci --replay): each part only what its job needs.
        "release.ci.replay": "release.errors release.util release.manifest",
        "release.ci.replay_context": "release.errors",
        "release.ci.replay_expressions": "release.errors",
        "release.ci.replay_envfiles": "release.errors",
        "release.ci.replay_secrets": "release.errors",
        "release.ci.replay_process": "",
        "release.ci.replay_plan": "",
        "release.ci.replay_job": "",
        "release.ci.replay_standins": "release.util",
        "release.ci.replay_cibuildwheel": "release.util release.gates.policy",
        "release.ci.replay_services": "release.trust.credential_names release.trust.server_process",
        "release.ci_workflow": "release.ci",
        "release.steps": "release",
        "release.cli": "release",
        "release.cli_options": "release.errors release.util release.gates.options",
        "release.__main__": "release.cli",
        "reference": "",  # the Python reference: numpy and the standard library only
    }.items()
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(p): p
    for root in (PACKAGE, REPO_ROOT / "reference")
    for p in sorted(root.rglob("*.py"))
}
RELEASE_MODULES = {name: path for name, path in MODULES.items() if name.split(".")[0] == "release"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, tree: ast.AST) -> list[tuple[str, list[str], bool]]:
    """(module, names, under TYPE_CHECKING) of every import in module `name`, function-level
    ones included, relative ones resolved."""
    found: list[tuple[str, list[str], bool]] = []
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            module = (
                ".".join([*base, node.module] if node.module else base)
                if node.level
                else (node.module or "")
            )
            found.append((module, [alias.name for alias in node.names], typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return found


def _edges() -> dict[tuple[str, str], bool]:
    """Each import edge between the modules, and whether TYPE_CHECKING alone makes it."""
    edges: dict[tuple[str, str], bool] = {}
    for name, path in MODULES.items():
        for module, names, typing_only in _imports(name, ast.parse(path.read_text())):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
            if len(targets) < len(names) or not names:
                targets.append(module)
            for target in targets:
                if target in MODULES and target != name:
                    edges[name, target] = edges.get((name, target), True) and typing_only
    return edges


def _graph(typing_too: bool = True) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for (source, target), typing_only in _edges().items():
        if typing_too or not typing_only:
            graph[source].add(target)
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


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _rule(module: str) -> tuple[str, frozenset[str]]:
    """The most specific MAY_IMPORT key holding `module`, and what it allows."""
    key = max((k for k in MAY_IMPORT if _within(module, k)), key=len)
    return key, MAY_IMPORT[key]


def _own_package(module: str) -> str:
    """The subpackage (or top-level module) `module` belongs to."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py"):
        return ".".join(parts[:2])
    return parts[0] if parts[0] == "reference" else module


def _breaches(edges: dict[tuple[str, str], bool]) -> list[str]:
    found = []
    for (source, target), typing_only in sorted(edges.items()):
        if _within(target, _own_package(source)):
            continue
        key, allowed = _rule(source)
        if not any(_within(target, prefix) for prefix in allowed):
            how = " (under TYPE_CHECKING)" if typing_only else ""
            found.append(f"{source} imports {target}{how}: {key} may import {sorted(allowed)}")
    return found


def test_every_module_is_under_an_import_rule() -> None:
    assert [name for name in MODULES if not any(_within(name, k) for k in MAY_IMPORT)] == []


def test_every_import_keeps_the_rule_of_its_package() -> None:
    assert _breaches(_edges()) == []


def test_the_rule_check_finds_a_planted_breach() -> None:
    edges = _edges()
    edges["release.trust.keys", "release.context"] = True  # the trust modules take no context
    edges["release.report.loader", "release.trust.attestation"] = False
    edges["reference.engine", "release.util.paths"] = False
    found = _breaches(edges)
    assert len(found) == 3
    assert found[0].startswith("reference.engine imports release.util.paths: reference may")
    assert "release.report.loader imports release.trust.attestation: release.report" in found[1]
    assert found[2].startswith("release.trust.keys imports release.context (under TYPE_CHECKING)")


def test_release_has_no_import_cycle_counting_every_edge() -> None:
    assert _cycles(_graph(typing_too=False)) == []  # what loading a module loads
    assert _cycles(_graph()) == []  # and with the edges only a type checker follows


def test_the_cycle_check_finds_a_planted_cycle() -> None:
    graph = _graph()
    graph["release.manifest"].add("release.steps")  # steps imports manifest
    assert any("release.manifest" in c and "release.steps" in c for c in _cycles(graph))


def test_the_cycle_check_counts_a_type_checking_edge() -> None:
    edges = _edges()
    edges["release.manifest", "release.gates.contract"] = True  # contract imports manifest
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for source, target in edges:
        graph[source].add(target)
    assert any("release.manifest" in c and "release.gates.contract" in c for c in _cycles(graph))


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{name} imports {module}.{imported}"
        for name, path in MODULES.items()
        for module, names, _ in _imports(name, ast.parse(path.read_text()))
        if module.split(".")[0] in ("release", "reference")
        for imported in names
        if imported.startswith("_") and not imported.startswith("__")
    ]
    assert private == []


def test_the_scripts_run_in_child_interpreters_import_nothing_of_the_pipeline() -> None:
    for name, path in RELEASE_MODULES.items():
        if name.startswith("release.scripts."):
            imported = [m for m, _, _ in _imports(name, ast.parse(path.read_text()))]
            assert not [m for m in imported if m.startswith("release")], name


def test_gates_import_only_the_scripts_constants() -> None:
    """A script's functions run in a child interpreter; a gate names its hooks and controls."""
    functions = [
        f"{name} imports {module}.{imported}"
        for name, path in RELEASE_MODULES.items()
        if name.startswith("release.gates.")
        for module, names, _ in _imports(name, ast.parse(path.read_text()))
        if _within(module, "release.scripts")
        for imported in names or [module]
        if not imported.isupper() or f"{module}.{imported}" in MODULES
    ]
    assert functions == []


@pytest.mark.parametrize(
    "package", sorted({n.rsplit(".", 1)[0] for n in RELEASE_MODULES if n.count(".") > 1})
)
def test_every_subpackage_says_what_it_owns_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    assert len(doc) > 80, package
    assert "import" in doc, f"{package}: its docstring should say what it may import"


@pytest.mark.parametrize("name", catalogue.names())
def test_each_registered_gate_keeps_the_contract(name: str) -> None:
    gate = registry.load(name)
    assert gate.name == name
    assert gate.runner in ("cpu", "gpu")
    assert isinstance(gate.judges, Judges)
    assert (gate.shared_file is not None) == (gate.judges is Judges.SHARED_FILE)
    assert callable(gate.run)


def test_a_registry_line_that_disagrees_with_its_gate_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(registry._GATES, "payload", catalogue.Entry("release.gates.payload", "gpu"))
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


def test_a_new_gate_is_one_module_and_one_catalogue_line(monkeypatch, tmp_path: Path) -> None:
    """Without its catalogue line the manifest that declares it is refused; with it, the gate runs
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
    monkeypatch.setitem(registry._GATES, "non-empty", catalogue.Entry("fixtures_gate", "cpu"))
    manifest = load_manifest(manifest_path)
    context = Context(manifest, REPO_ROOT, tmp_path / "out", tmp_path / "state")
    wheels = wheel_set(build_wheel(tmp_path / "dist", tag="py3-none-any"))
    inputs = steps.gate_inputs(context, wheels, gpu=None)
    assert registry.run_gate("non-empty", inputs).verdict == "pass"
    evidence = read_evidence(context.out_dir, "non-empty")
    assert evidence is not None and evidence.artefacts == wheels.digests
