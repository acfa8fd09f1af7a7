"""The parts of the Delta protocol the upsert sink writes itself: deletion
vectors, the table's live files with their deletion vectors, and a commit
that takes the next version or fails (docs/sinks.md, "Updates and deletes:
deletion vectors").

delta-rs 1.6.6 reads deletion vectors (its DataFusion scan, ``optimize``,
``merge``) but writes none, and its commit API (``create_write_transaction``)
has no field for one.  So the sink writes them as the Delta protocol
defines them ("Deletion Vector Format"):

* a deletion vector is a 64-bit RoaringBitmap of the deleted row positions
  in one data file, serialized as ``magic (1681511377, int32 LE)`` +
  the bitmap's portable 64-bit form (``numBuckets int64 LE``, per bucket its
  high 32 bits as ``uint32 LE`` and a portable 32-bit RoaringBitmap, written
  by ``pyroaring``);
* a deletion-vector file is a version byte ``1`` and, per vector,
  ``dataSize int32 BE``, the vector, its ``CRC-32 int32 BE``;
* an ``add``/``remove`` action points at it with a descriptor
  ``{"storageType": "u", "pathOrInlineDv": <Z85 of a UUID>, "offset",
  "sizeInBytes", "cardinality"}``: the file ``deletion_vector_<uuid>.bin``
  in the table's directory.

The commit is one JSON file ``_delta_log/<version>.json`` created only if
no other writer created it (a hard link of a fully written temporary file:
atomic, and it fails when the name exists), so two writers never both take
a version.  That needs a file system with hard links: the sink uses this
layout for tables on a local or shared (mounted) file system only.
"""
from __future__ import annotations

import json
import os
import struct
import uuid
import zlib
from typing import Iterable, Optional

#: the deletion-vector magic number of the Delta protocol
DV_MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}

__all__ = ["CommitTaken", "LiveFiles", "commit_next_version", "local_table_dir", "read_deletion_vector",
           "serialize_positions", "write_deletion_vectors"]


class CommitTaken(Exception):
    """Another writer committed the version this commit was built on top of."""


def local_table_dir(path: str) -> Optional[str]:
    """The table's directory when it is on a local (or mounted) file system,
    else ``None`` (object stores: the sink keeps delta-rs' own commits)."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if "://" in path:
        return None
    return os.path.abspath(path)


# --------------------------------------------------------------- Z85 encoding
def z85_encode(data: bytes) -> str:
    if len(data) % 4:
        raise ValueError("Z85 encodes multiples of 4 bytes")
    out = []
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            n, r = divmod(n, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError("Z85 text is a multiple of 5 characters")
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for c in text[i:i + 5]:
            n = n * 85 + _Z85_INDEX[c]
        out += n.to_bytes(4, "big")
    return bytes(out)


# ------------------------------------------------------------ deletion vectors
def serialize_positions(bitmap) -> bytes:
    """A ``pyroaring.BitMap`` of row positions (< 2**32) -> the Delta form
    (magic + portable 64-bit RoaringBitmap with one bucket)."""
    buckets = b"" if not bitmap else struct.pack("<I", 0) + bitmap.serialize()
    return struct.pack("<iq", DV_MAGIC, 1 if bitmap else 0) + buckets


def deserialize_positions(data: bytes):
    """The Delta form -> ``pyroaring.BitMap`` (row positions of one Parquet
    file are below 2**32: one bucket, or none)."""
    from pyroaring import BitMap
    magic, n = struct.unpack_from("<iq", data, 0)
    if magic != DV_MAGIC:
        raise ValueError(f"not a Delta deletion vector (magic {magic})")
    if n == 0:
        return BitMap()
    (high,) = struct.unpack_from("<I", data, 12)
    if n != 1 or high:
        raise ValueError("deletion vectors with row positions >= 2**32 are not supported")
    return BitMap.deserialize(data[16:])


def _dv_file(table_dir: str, descriptor: dict) -> str:
    kind, ref = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "p":
        return local_table_dir(ref) or ref
    prefix, encoded = ref[:-20], ref[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return os.path.join(table_dir, prefix, name) if prefix else os.path.join(table_dir, name)


def read_deletion_vector(table_dir: str, descriptor: Optional[dict]):
    """The deleted positions a descriptor names (empty without one)."""
    from pyroaring import BitMap
    if not descriptor:
        return BitMap()
    size = int(descriptor["sizeInBytes"])
    if descriptor["storageType"] == "i":
        return deserialize_positions(z85_decode(descriptor["pathOrInlineDv"])[:size])
    with open(_dv_file(table_dir, descriptor), "rb") as f:
        f.seek(int(descriptor.get("offset") or 1))
        (stored,) = struct.unpack(">i", f.read(4))
        data = f.read(stored)
        (crc,) = struct.unpack(">I", f.read(4))
    if stored != size or zlib.crc32(data) != crc:
        raise ValueError(f"deletion vector {descriptor} is damaged (size or checksum)")
    return deserialize_positions(data)


def write_deletion_vectors(table_dir: str, bitmaps: Iterable) -> tuple[str, list[dict]]:
    """Write the bitmaps into one new deletion-vector file -> (its path, one
    descriptor per bitmap, in order)."""
    ident = uuid.uuid4()
    path = os.path.join(table_dir, f"deletion_vector_{ident}.bin")
    blob, descriptors = bytearray(b"\x01"), []
    for bitmap in bitmaps:
        data = serialize_positions(bitmap)
        descriptors.append({"storageType": "u", "pathOrInlineDv": z85_encode(ident.bytes),
                            "offset": len(blob), "sizeInBytes": len(data), "cardinality": len(bitmap)})
        blob += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    with open(path, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    return path, descriptors


# --------------------------------------------------------------- live files
class LiveFiles:
    """The table's live data files (``add`` actions, deletion vectors
    included) at a version, read from the log: the last checkpoint, then the
    JSON commits after it; later versions are read incrementally."""

    def __init__(self, table_dir: str):
        self.table_dir = table_dir
        self.version = -1
        self.files: dict[str, dict] = {}

    @property
    def _log(self) -> str:
        return os.path.join(self.table_dir, "_delta_log")

    def at(self, version: int) -> dict[str, dict]:
        """path -> ``add`` action of every live file at ``version``."""
        if version < self.version:
            self.version, self.files = -1, {}
        if self.version < 0:
            self._from_checkpoint(version)
        for v in range(self.version + 1, version + 1):
            with open(os.path.join(self._log, f"{v:020d}.json")) as f:
                self._apply(json.loads(line) for line in f if line.strip())
            self.version = v
        return self.files

    def _from_checkpoint(self, version: int) -> None:
        import pyarrow.parquet as pq
        try:
            with open(os.path.join(self._log, "_last_checkpoint")) as f:
                last = json.load(f)
        except FileNotFoundError:
            return
        cp = int(last["version"])
        if cp > version:
            return
        parts = int(last.get("parts") or 0)
        names = ([f"{cp:020d}.checkpoint.parquet"] if not parts else
                 [f"{cp:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])
        for name in names:
            adds = pq.read_table(os.path.join(self._log, name), columns=["add"])["add"]
            for a in adds.to_pylist():
                if a is not None:
                    self.files[a["path"]] = _json_form(a)
        self.version = cp

    def _apply(self, actions) -> None:
        for a in actions:
            if "add" in a:
                self.files[a["add"]["path"]] = a["add"]
            elif "remove" in a:
                self.files.pop(a["remove"]["path"], None)


def _json_form(add: dict) -> dict:
    """An ``add`` read from a checkpoint (Parquet: maps as key-value lists,
    absent fields as nulls) as the log's JSON has it."""
    out = {}
    for k, v in add.items():
        if v is None or k.endswith("_parsed"):
            continue
        if k in ("partitionValues", "tags"):
            v = dict(v)
        elif k == "deletionVector":
            v = {f: x for f, x in v.items() if x is not None}
        out[k] = v
    return out


def commit_next_version(table_dir: str, version: int, actions: list[dict]) -> None:
    """Write ``actions`` as commit ``version``, only if no writer took it
    (:class:`CommitTaken` otherwise)."""
    log = os.path.join(table_dir, "_delta_log")
    final = os.path.join(log, f"{version:020d}.json")
    tmp = os.path.join(log, f".{version:020d}.json.{uuid.uuid4()}.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise CommitTaken(f"version {version} of the Delta table at {table_dir!r} was committed by "
                          f"another writer") from None
    finally:
        os.remove(tmp)
