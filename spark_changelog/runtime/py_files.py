"""The package as a zip for a cluster's executors (``--py-files`` /
``spark.submit.pyFiles``), with its bytecode (docs/deploy.md, "A standalone
cluster, step by step").

Python imports modules from a zip without writing bytecode caches, so each
new Python worker on an executor compiled the package's source again (about
0.8 s of CPU for the whole package, measured on this machine; several
seconds of wall time at the first task of each stage on a loaded node).
Next to every ``x.py`` the zip holds ``x.pyc`` (the layout ``zipimport``
reads), compiled by this interpreter as an unchecked hash-based pyc: the
zip never changes once written, so nothing needs to be compared at import.
A node whose Python is another version finds a magic number it does not
know and compiles the source as before: the zip works everywhere, fast where
the versions match.
"""
from __future__ import annotations

import os
import py_compile
import tempfile
import zipfile

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_package_zip(path: str, *, bytecode: bool = True) -> int:
    """Write this package (its ``.py`` files, and their ``.pyc`` unless
    ``bytecode`` is false) to the zip ``path``; the number of modules."""
    root = os.path.dirname(PACKAGE_DIR)
    tmp = path + ".tmp"
    count = 0
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z, tempfile.TemporaryDirectory() as work:
        for dirpath, dirs, files in os.walk(PACKAGE_DIR):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                z.write(full, rel)
                if bytecode:
                    # named by its path inside the zip (tracebacks), not this machine's
                    pyc = py_compile.compile(full, os.path.join(work, "module.pyc"), dfile=rel,
                                             doraise=True,
                                             invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                    z.write(pyc, rel + "c")
                count += 1
    os.replace(tmp, path)
    return count
