"""A long batch never expires a ZooKeeper session: every kernel releases the GIL.

kazoo pings the server from a thread of its own; a numba kernel holding the
GIL for longer than the session timeout starves it, and the session — with
a worker's membership or an orchestrator's lease — is lost (measured on this
machine: ``shared/notes/infrastructure.md``). Python code between kernels
lets the thread run at every switch interval; a kernel does only with
``nogil=True``.
"""

import ast
import pathlib

import sparkcep


def test_every_kernel_releases_the_gil():
    core = pathlib.Path(sparkcep.__file__).parent
    holding = []
    for f in core.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            for d in getattr(node, "decorator_list", []):
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "njit":
                    if not any(k.arg == "nogil" and getattr(k.value, "value", False) for k in d.keywords):
                        holding.append(f"{f.relative_to(core)}:{node.lineno} {node.name}")
    assert not holding, f"kernels holding the GIL: {holding}"
