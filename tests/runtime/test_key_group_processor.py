"""The keyed operators' stateful processor unpickles without the runtime's
heavy modules (runtime/key_group_processor.py): Spark's pre-init process on
the driver, one per stateful operator and query start, only declares state."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from pyspark import cloudpickle

from spark_changelog.operators.normalize import ChangelogNormalize
from spark_changelog.runtime.key_group_processor import KeyGroupProcessor

LOAD = """
import pickle, sys
p = pickle.load(open(sys.argv[1], 'rb'))
print(sorted(m for m in ('pandas', 'pyarrow', 'numpy', 'spark_changelog.operators.normalize') if m in sys.modules))
print(type(p.operator).__name__, p.operator.key, p.pack, 'pandas' in sys.modules)
"""


def test_the_processor_unpickles_without_pandas_and_its_operator_when_asked(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_kind", pa.int8()), ("_seq", pa.int64())])
    processor = KeyGroupProcessor(ChangelogNormalize(schema, ["id"]), schema.names, 1.0, 8, "UTC", 32)
    assert processor.operator.key == ("id",)      # unpickled on the driver: not pickled again
    path = tmp_path / "processor.pkl"
    path.write_bytes(cloudpickle.dumps(processor))
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "ChangelogNormalize ('id',) None True"]
