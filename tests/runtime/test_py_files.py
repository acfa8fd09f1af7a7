"""The package zip for a cluster's executors (runtime/py_files.py,
``spark-changelog package``; docs/deploy.md, "A standalone cluster, step
by step")."""
from __future__ import annotations

import subprocess
import sys
import zipfile

from spark_changelog.cli import main


def test_the_package_zip_holds_sources_and_the_bytecode_python_imports(tmp_path, capsys):
    path = tmp_path / "spark_changelog.zip"
    assert main(["package", str(path)]) == 0
    assert "with bytecode for Python 3.11" in capsys.readouterr().out
    names = set(zipfile.ZipFile(path).namelist())
    sources = {n for n in names if n.endswith(".py")}
    assert "spark_changelog/runtime/keyed_rows.py" in sources
    assert {n + "c" for n in sources} == names - sources
    assert not any("__pycache__" in n for n in names)
    # a Python without this environment's site-packages (-S: nor the editable
    # install) imports the package from the zip, from its bytecode
    r = subprocess.run([sys.executable, "-S", "-c",
                        f"import sys; sys.path.insert(0, {str(path)!r}); "
                        "import spark_changelog.runtime.worker_launcher as m; print(m.__file__)"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == f"{path}/spark_changelog/runtime/worker_launcher.pyc"
    source_only = tmp_path / "source.zip"
    assert main(["package", str(source_only), "--no-bytecode"]) == 0
    assert all(n.endswith(".py") for n in zipfile.ZipFile(source_only).namelist())
