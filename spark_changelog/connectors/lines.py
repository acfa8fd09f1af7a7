"""CDC files as numbered lines, read in parallel over byte ranges (docs/runtime.md).

Every CDC format is parsed from one row per line: ``file`` (the file's URI as
Spark lists it), ``file_no`` (:func:`file_number`), ``line`` (1-based line
number within the file) and ``raw`` (the line's text).

How line numbers survive splitting
----------------------------------
Spark's ``text`` source splits files but cannot number lines: a task only sees
its byte range.  Here Spark lists the files (the ``binaryFile`` source without
its ``content`` column, so nothing is read; in streaming it is Spark's file
stream source, with its checkpointed file log and ``maxFilesPerTrigger``), each
file is cut into as many byte ranges as there are tasks (at least 1 MB, at
most ``spark.sql.files.maxPartitionBytes`` each), a file's ranges are placed
on consecutive tasks (:func:`placement_sql`), and a Python task
(``mapInArrow``) reads its range with ``pyarrow.fs``:

* a range owns the lines that *start* inside it (Hadoop's rule): it skips a
  partial first line and reads past its end to finish its last line;
* the number of its first line is one plus the newlines before it, counted
  by reading the file from its start (a sequential scan at memory speed, only
  for ranges after the first);
* lines are cut with numpy on the byte buffer, and go back to the JVM as one
  Arrow string column: no Python object per line.

A format may hand the task a *line parser* (``parser=``, e.g.
:class:`~spark_changelog.connectors.debezium_arrow.DebeziumArrowParser`): it
turns the lines it can decide into finished rows of its own columns (any
number per line, in line order) and gives every other line one row with its
text; rows it finished get ``raw`` NULL, so their text never crosses to the
JVM.  The other lines' decisions (validation, dead letters) stay in Spark.

Compressed files
----------------
A file whose name ends in ``.gz``/``.gzip``, ``.bz2``, ``.xz``, ``.zst``/``.zstd``
or ``.deflate`` is decompressed by its extension, as Flink's file source does
(:data:`COMPRESSIONS`).  A compressed stream cannot be entered in the middle,
so such a file is one range (:func:`split_size_sql`): its task reads the file
once, decompresses it in memory and numbers its lines like any other file's
(line numbers are those of the decompressed text).  A file that fails to
decompress gives ONE row, line 0, whose ``raw`` is ``UNREADABLE_PREFIX`` and
the reason: the formats turn it into one dead letter naming the file (never
its bytes on the terminal).

Normalisation (as documented for the readers): a UTF-8 byte-order mark at the
start of a file is dropped, ``\\r\\n`` line ends count as ``\\n`` (a lone ``\\r``
stays part of the line), and blank (whitespace-only) lines after the last
non-blank line of a file are not rows; a file without a non-blank line has no
rows.
"""
from __future__ import annotations

import re
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from .session_info import default_parallelism

#: digits strings longer than this exceed 2^59 (range checks reject them)
_ROW_LIMIT_DIGITS = 18
_OUT_OF_RANGE = 1 << 62
_EXTENSIONS = re.compile(r"(\.[A-Za-z][A-Za-z0-9]*)+$")
_LAST_DIGITS = re.compile(r"(\d+)\D*$")
_BOM = b"\xef\xbb\xbf"
_BLANK = b" \t\r\n"
#: bytes read per call when looking for the end of a range's last line
_CHUNK = 1 << 20
#: lines per Arrow batch a range task yields
_BATCH_LINES = 32768
#: file name ending -> how its bytes are compressed (``None``: Python's zlib/lzma)
COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd",
                ".xz": None, ".deflate": None}
_COMPRESSED_SQL = "(?i).*(" + "|".join(re.escape(e) for e in COMPRESSIONS) + ")$"
#: ``raw`` of the one row of a file that cannot be decompressed (then the reason)
UNREADABLE_PREFIX = "cannot decompress this file: "


def compression_of(path: str) -> Optional[str]:
    """The extension of ``path`` if it names a compressed file (``.gz``, ...), else None."""
    lower = path.lower()
    return next((e for e in COMPRESSIONS if lower.endswith(e)), None)


def decompress(data: bytes, extension: str) -> bytes:
    """The decompressed bytes of a whole file compressed as ``extension`` says."""
    codec = COMPRESSIONS[extension]
    if codec is not None:
        with pa.CompressedInputStream(pa.BufferReader(data), codec) as stream:
            return stream.read()
    if extension == ".xz":
        import lzma
        return lzma.decompress(data)
    import zlib
    return zlib.decompress(data)


def file_number(path: str) -> int:
    """The last run of digits in the file name without its extensions (0 if
    none): ``inventory.customers+0+0000000042.json`` -> 42.  A number too long
    for the ``_seq`` encoding is returned as 2^62 so range checks reject it."""
    base = path.rsplit("/", 1)[-1]
    stem = _EXTENSIONS.sub("", base)
    m = _LAST_DIGITS.search(stem)
    if not m:
        return 0
    digits = m.group(1).lstrip("0") or "0"
    return _OUT_OF_RANGE if len(digits) > _ROW_LIMIT_DIGITS else int(digits)


def line_schema(keep_header: bool, parser=None) -> pa.Schema:
    fields = [pa.field("file", pa.string()), pa.field("file_no", pa.int64()), pa.field("line", pa.int64()),
              pa.field("raw", pa.string())]
    if keep_header:
        fields.append(pa.field("header", pa.string()))
    return pa.schema(fields + (list(parser.fields) if parser is not None else []))


def line_ddl(keep_header: bool, parser=None) -> str:
    return ("file STRING, file_no BIGINT, line BIGINT, raw STRING" + (", header STRING" if keep_header else "")
            + (", " + parser.ddl if parser is not None else ""))


# --------------------------------------------------------------------------- Spark side


def list_files(spark, path: Union[str, Sequence[str]], *, streaming: bool = False,
               max_files_per_trigger: Optional[int] = None):
    """The files at ``path`` (``binaryFile`` without reading ``content``;
    streaming: Spark's file stream source, its file log and
    ``maxFilesPerTrigger``)."""
    if streaming:
        schema = "path STRING, modificationTime TIMESTAMP, length BIGINT, content BINARY"
        reader = spark.readStream.format("binaryFile").schema(schema)
        if max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", int(max_files_per_trigger))
        return reader.load(path)
    paths = [path] if isinstance(path, str) else list(path)
    return spark.read.format("binaryFile").load(paths)


def read_lines(spark, path: Union[str, Sequence[str]], *, streaming: bool = False,
               max_files_per_trigger: Optional[int] = None, keep_header: bool = False, parser=None,
               files=None):
    """One row per line of the files at ``path`` (module docstring).  With
    ``keep_header`` a ``header`` column holds each file's first line (CSV);
    with a ``parser`` its columns follow: a line it finished is its rows with
    ``raw`` NULL, any other line one row with its text.  ``files``: their
    :func:`list_files`, when made already."""
    if files is None:
        files = list_files(spark, path, streaming=streaming, max_files_per_trigger=max_files_per_trigger)
    max_split = max(1, int(_bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", "128m"))))
    tasks = max(1, default_parallelism(spark))
    ranges = files.selectExpr(
        "path", "length", f"CASE WHEN path RLIKE '{_COMPRESSED_SQL}' THEN greatest(length, 1) ELSE "
        + split_size_sql("length", tasks, max_split) + " END AS split")
    ranges = ranges.selectExpr(
        "path", "length", "split",
        "posexplode(sequence(0, greatest(length - 1, 0), split)) AS (range_no, start)",
    ).selectExpr("path", "length", "start", "least(start + split, length) AS end",
                 placement_sql("path", "range_no", tasks) + " AS _task")
    reader = RangeReader(keep_header, parser)
    return ranges.repartition(tasks, "_task").drop("_task").mapInArrow(reader, line_ddl(keep_header, parser))


#: a file is not cut into ranges smaller than this (each range costs a task
#: call and, after the first, a scan of the file's start to number its lines)
MIN_RANGE_BYTES = 1 << 20


def split_size_sql(length: str, tasks: int, max_split: int) -> str:
    """The byte size of a file's ranges: the file cut into ``tasks`` ranges
    (so a micro-batch of a few files still keeps every task busy), each at
    least :data:`MIN_RANGE_BYTES` and at most ``maxPartitionBytes``."""
    return (f"least(CAST({max_split} AS BIGINT), greatest(CAST({MIN_RANGE_BYTES} AS BIGINT), "
            f"CAST(ceil({length} / {tasks}) AS BIGINT)))")


def placement_sql(path: str, range_no: str, tasks: int) -> str:
    """The id to repartition a range by so that it lands on task
    ``(pmod(hash(path), tasks) + range_no) % tasks``: a file's ranges go to
    consecutive tasks, so a file cut into ``tasks`` ranges gives each task one.
    A round-robin repartition placed the ranges by a random start per listing
    partition and could put a micro-batch's two files on one task."""
    from ..model.partitioning import spread_group_ids
    ids = ", ".join(str(i) for i in spread_group_ids(tasks))
    return f"element_at(array({ids}), CAST(pmod(pmod(hash({path}), {tasks}) + {range_no}, {tasks}) AS INT) + 1)"


def _bytes(text: str) -> int:
    """A Spark size setting (``128m``, ``134217728b``, ``1g``) in bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        return 128 << 20
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)]


# --------------------------------------------------------------------------- Python task side


class RangeReader:
    """The ``mapInArrow`` function: byte ranges in, numbered lines out."""

    def __init__(self, keep_header: bool, parser=None):
        self.keep_header = keep_header
        self.parser = parser
        self.schema = line_schema(keep_header, parser)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols = batch.to_pydict()
            for path, length, start, end in zip(cols["path"], cols["length"], cols["start"], cols["end"]):
                yield from self.read_range(path, int(length), int(start), int(end))

    def read_range(self, path: str, length: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        fs, local = _filesystem(path)
        extension = compression_of(path)
        if extension is not None:
            yield from self.read_compressed(fs, local, path, extension)
            return
        with fs.open_input_file(local) as fh:
            yield from lines_of_range(fh, path, length, start, end, self.keep_header, self.schema, self.parser)

    def read_compressed(self, fs, local: str, path: str, extension: str) -> Iterator[pa.RecordBatch]:
        """A compressed file, whole (one range): read once, decompressed in
        memory, numbered as any file; one ``UNREADABLE_PREFIX`` row if it
        does not decompress."""
        with fs.open_input_file(local) as fh:
            data = fh.read()
        try:
            text = decompress(data, extension)
        except Exception as e:           # any codec's error: the file is bad, not the run
            reason = f"{UNREADABLE_PREFIX}{extension} data is corrupt or not {extension} ({type(e).__name__}: {e})"
            columns = [pa.array([path]), pa.array([file_number(path)], pa.int64()), pa.array([0], pa.int64()),
                       pa.array([reason[:500]])]
            if self.keep_header:
                columns.append(pa.nulls(1, pa.string()))
            columns += [pa.nulls(1, f.type) for f in self.schema][len(columns):]
            yield pa.RecordBatch.from_arrays(columns, schema=self.schema)
            return
        yield from lines_of_range(pa.BufferReader(text), path, len(text), 0, len(text), self.keep_header,
                                  self.schema, self.parser)


def _filesystem(uri: str):
    from pyarrow import fs
    return fs.FileSystem.from_uri(uri)


def lines_of_range(fh, path: str, length: int, start: int, end: int, keep_header: bool,
                   schema: pa.Schema, parser=None, batch_lines: int = None) -> Iterator[pa.RecordBatch]:
    """The lines starting in ``[start, end)`` of the open file ``fh`` (with
    ``parser``, its rows per line: its columns, and ``raw`` only where it asks for it), in
    batches of at most ``batch_lines`` lines: the JVM converts one batch while
    the task parses the next."""
    bom = len(_BOM) if length >= 3 and fh.read_at(3, 0) == _BOM else 0
    first = max(start, bom)
    if first > bom:
        # a range owns the lines starting inside it: skip the partial first line
        if fh.read_at(1, first - 1) != b"\n":
            nl = _find_newline(fh, first, length)
            if nl is None or nl + 1 >= end:
                return
            first = nl + 1
    if first >= end:
        return
    stop = end
    if end < length and fh.read_at(1, end - 1) != b"\n":
        # finish the last line, which runs past the range (found first, so the
        # range is read in one piece: no second copy of its bytes)
        nl = _find_newline(fh, end, length)
        stop = length if nl is None else nl + 1
    data = fh.read_at(stop - first, first)
    at_eof = first + len(data) >= length
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(buf)]))
    if len(data) and data.endswith(b"\n"):
        starts, ends = starts[:-1], ends[:-1]      # nothing after the final newline
    # \r\n counts as \n (and a \r ending the file is dropped with it)
    cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr
    if len(starts) and not _has_content(buf[starts[-1]:ends[-1]]) and (
            at_eof or not _rest_has_content(fh, first + len(data), length)):
        # blank lines after the last non-blank line of the file are not rows
        keep = _last_non_blank(buf, starts, ends)
        starts, ends = starts[:keep], ends[:keep]
    if not len(starts):
        return
    line0 = 1 + _count_newlines(fh, bom, first)
    file_no = file_number(path)
    header = first_line(fh, bom, length) if keep_header else None
    step = batch_lines or _BATCH_LINES
    for a in range(0, len(starts), step):
        s, e = starts[a:a + step], ends[a:a + step]
        numbers = np.arange(line0 + a, line0 + a + len(s), dtype=np.int64)
        parsed: list = []
        if parser is None:
            raw = _string_array(buf, s, e)
        else:
            line_of, parsed, needs_raw = parser(buf, s, e, file_no, numbers)
            if needs_raw.all() and len(line_of) == len(s):
                raw = _string_array(buf, s, e)
            else:
                s, e, numbers = s[line_of], e[line_of], numbers[line_of]
                raw = _some_strings(buf, s, e, needs_raw)
        n = len(s)
        columns = [pa.repeat(pa.scalar(path, pa.string()), n), pa.array(np.full(n, file_no, dtype=np.int64)),
                   pa.array(numbers), raw]
        if keep_header:
            columns.append(pa.repeat(pa.scalar(header, pa.string()), n))
        yield pa.RecordBatch.from_arrays(columns + list(parsed), schema=schema)


def _find_newline(fh, pos: int, length: int) -> Optional[int]:
    while pos < length:
        chunk = fh.read_at(min(_CHUNK, length - pos), pos)
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i
        pos += len(chunk)
    return None


def _count_newlines(fh, start: int, stop: int) -> int:
    n, pos = 0, start
    while pos < stop:
        chunk = fh.read_at(min(_CHUNK * 16, stop - pos), pos)
        n += chunk.count(b"\n")
        pos += len(chunk)
    return n


def _rest_has_content(fh, pos: int, length: int) -> bool:
    while pos < length:
        chunk = fh.read_at(min(_CHUNK, length - pos), pos)
        if chunk.strip(_BLANK):
            return True
        pos += len(chunk)
    return False


def _has_content(part: np.ndarray) -> bool:
    return bool(bytes(part).strip(_BLANK))


def _last_non_blank(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
    """How many lines remain after dropping the trailing whitespace-only ones."""
    i = len(starts)
    while i > 0 and not _has_content(buf[starts[i - 1]:ends[i - 1]]):
        i -= 1
    return i


def first_line(fh, bom: int, length: int) -> str:
    nl = _find_newline(fh, bom, length)
    stop = length if nl is None else nl
    text = fh.read_at(stop - bom, bom)
    if text.endswith(b"\r"):
        text = text[:-1]
    return text.decode("utf-8", errors="replace")


def _string_array(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Consecutive lines ``[starts[i], ends[i])`` of ``buf`` as one Arrow string array.

    Between two lines there is only their separator (``\n`` or ``\r\n``):
    removing those gaps leaves the values back to back (one copy, no per-line work)."""
    lo, hi = int(starts[0]), int(ends[-1])
    values = buf[lo:hi]
    if len(starts) > 1:
        edges = np.zeros(hi - lo + 1, dtype=np.int8)
        edges[ends[:-1] - lo] += 1
        edges[starts[1:] - lo] -= 1
        values = values[np.cumsum(edges[:-1], dtype=np.int8) == 0]
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), len(starts),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)]).cast(pa.string())


def _some_strings(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, wanted: np.ndarray) -> pa.Array:
    """Lines ``[starts[i], ends[i])`` of ``buf`` where ``wanted[i]``, NULL elsewhere."""
    n = len(starts)
    if not wanted.any():
        return pa.nulls(n, pa.string())
    lengths = np.where(wanted, ends - starts, 0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    picked = np.flatnonzero(wanted & (lengths > 0))
    # one gather of every picked byte: output position j of line i reads
    # buf[starts[i] + (j - offsets[i])] (no per-line Python)
    values = buf[np.arange(offsets[-1]) + np.repeat(starts[picked] - offsets[picked], lengths[picked])]
    validity = pa.py_buffer(np.packbits(wanted, bitorder="little"))
    return pa.Array.from_buffers(pa.large_string(), n, [validity, pa.py_buffer(offsets),
                                                       pa.py_buffer(values)]).cast(pa.string())
