"""Every module the package imports at run time is a declared dependency, and every module imports.

A fresh install has only what ``pyproject.toml`` declares (the README's
install command installs the ``test`` extra too): a package present on one
machine by chance must not hide a missing declaration.
"""

import ast
import importlib.metadata as md
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("sparkcep", "pyspark_upmcep")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """Distributions the README's install command installs: the dependencies and the extras it names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.findall(r'-e "\.\[([\w,]+)\]"', (ROOT / "install.sh").read_text())
    assert extras, "install.sh installs the package with its extras: -e \".[test]\""
    reqs = list(project["dependencies"])
    for extra in extras[0].split(","):
        reqs += project["optional-dependencies"][extra]
    return {_norm(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]) for r in reqs}


def imported() -> dict[str, str]:
    """Top-level modules the package imports (not its own, not the standard library) -> a file importing it."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        out.setdefault(top, str(f.relative_to(ROOT)))
    return out


def test_every_imported_package_is_declared():
    providers = md.packages_distributions()
    wanted = declared()
    missing = {}
    for module, where in imported().items():
        dists = {_norm(d) for d in providers.get(module, [])}
        if not dists & wanted:
            missing[module] = f"{where} (provided by {sorted(dists) or 'nothing installed'})"
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_module_imports_in_a_fresh_interpreter():
    """Isolated mode: no PYTHONPATH, no user site, not the current directory."""
    code = ("import importlib, pkgutil, sparkcep, pyspark_upmcep\n"
            "for m in pkgutil.walk_packages(sparkcep.__path__, 'sparkcep.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n")
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300,
                         cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
