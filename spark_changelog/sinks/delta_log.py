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
no other writer created it, so two writers never both take a version: on a
local or mounted file system a hard link of a fully written temporary file
(atomic, it fails when the name exists); on S3 and S3-compatible stores a
conditional ``PutObject`` with ``If-None-Match: *`` (boto3), the same
put-if-absent delta-rs makes with ``conditional_put = etag``.  Every other
read and write of the table's files (log, checkpoints, deletion vectors,
data files) goes through :class:`TableStore`, one file system for both:
pyarrow's over delta-rs' ``DeltaStorageHandler`` with the sink's
``storage_options`` (the local directory directly).
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

__all__ = ["CommitTaken", "LiveFiles", "TableStore", "commit_next_version", "local_table_dir",
           "read_deletion_vector", "serialize_positions", "write_deletion_vectors"]


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


#: URL schemes whose stores take a conditional put (``If-None-Match: *``)
_S3_SCHEMES = ("s3", "s3a")
#: ``storage_options`` names (lower case) of an S3 client's settings, as
#: delta-rs (object_store) spells them, -> boto3's argument
_S3_CLIENT_OPTIONS = {
    "aws_endpoint_url": "endpoint_url", "aws_endpoint": "endpoint_url", "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url", "aws_access_key_id": "aws_access_key_id", "access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key", "secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token", "session_token": "aws_session_token", "aws_token": "aws_session_token",
    "aws_region": "region_name", "region": "region_name", "aws_default_region": "region_name"}


class TableStore:
    """The files of the table at ``path``, named relative to its root: the
    one file system the sink reads and writes the log, checkpoints,
    deletion vectors and data files through (docs/sinks.md, "Updates and
    deletes: deletion vectors").  A local (or mounted) table is read with
    the operating system's calls; any other URL through pyarrow's file
    system over delta-rs' ``DeltaStorageHandler`` with ``storage_options``,
    so it reaches every store delta-rs reaches, with the same settings.
    Picklable (the executors open their own)."""

    def __init__(self, path: str, storage_options: Optional[dict] = None):
        self.path = path.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.local_dir = local_table_dir(path)
        self._fs = None
        self._s3 = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_s3": None}

    @property
    def can_commit(self) -> bool:
        """The sink can take a version itself (put-if-absent): a local file
        system (hard links), or S3 whose other writers use conditional puts
        too (a table whose delta-rs writers lock through DynamoDB instead,
        ``AWS_S3_LOCKING_PROVIDER``, keeps delta-rs' own commits)."""
        if self.local_dir is not None:
            return True
        locking = {k.lower(): v for k, v in self.storage_options.items()}.get("aws_s3_locking_provider")
        return self.path.split("://", 1)[0].lower() in _S3_SCHEMES and not locking

    @property
    def fs(self):
        if self._fs is None:
            import pyarrow.fs as pafs
            from deltalake.fs import DeltaStorageHandler
            self._fs = pafs.PyFileSystem(DeltaStorageHandler(self.path, self.storage_options or None))
        return self._fs

    def uri(self, name: str) -> str:
        return os.path.join(self.local_dir, name) if self.local_dir is not None else f"{self.path}/{name}"

    def read(self, name: str) -> bytes:
        """The whole file (``FileNotFoundError`` if there is none)."""
        if self.local_dir is not None:
            with open(os.path.join(self.local_dir, name), "rb") as f:
                return f.read()
        with self.fs.open_input_stream(name) as f:
            return f.read()

    def read_range(self, name: str, offset: int, size: int) -> bytes:
        if self.local_dir is not None:
            with open(os.path.join(self.local_dir, name), "rb") as f:
                f.seek(offset)
                return f.read(size)
        with self.fs.open_input_file(name) as f:
            return f.read_at(size, offset)

    def parquet(self, name: str):
        """A ``pyarrow.parquet.ParquetFile`` of the data or checkpoint file."""
        import pyarrow.parquet as pq
        if self.local_dir is not None:
            return pq.ParquetFile(os.path.join(self.local_dir, name))
        return pq.ParquetFile(self.fs.open_input_file(name))

    def write(self, name: str, data: bytes) -> None:
        """A new file, whole (synced on a local file system)."""
        if self.local_dir is not None:
            with open(os.path.join(self.local_dir, name), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return
        import pyarrow as pa
        # delta-rs' stream takes ``bytes`` only, and pyarrow hands a direct
        # write a Buffer; a buffered stream larger than the data passes it on
        # as bytes when it is flushed
        with self.fs.open_output_stream(name) as f, pa.BufferedOutputStream(f, buffer_size=len(data) + 1) as b:
            b.write(data)

    def delete(self, name: str) -> None:
        """Delete the file if it is there."""
        if self.local_dir is not None:
            try:
                os.remove(os.path.join(self.local_dir, name))
            except FileNotFoundError:
                pass
            return
        try:
            self.fs.delete_file(name)
        except FileNotFoundError:
            pass

    def put_if_absent(self, name: str, data: bytes) -> None:
        """Create the file with ``data`` only if no file has that name
        (``FileExistsError`` otherwise), atomically: a hard link of a fully
        written, synced temporary file, or S3's conditional put."""
        if self.local_dir is not None:
            final = os.path.join(self.local_dir, name)
            tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)
            finally:
                os.remove(tmp)
            return
        if not self.can_commit:
            raise NotImplementedError(f"no put-if-absent for {self.path!r} (local file systems and S3 only)")
        from botocore.exceptions import ClientError
        bucket, _, prefix = self.path.split("://", 1)[1].partition("/")
        key = f"{prefix}/{name}" if prefix else name
        try:
            self._s3_client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as err:
            # 412: the key exists; 409: a concurrent conditional put of it is in flight
            if err.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") \
                    or err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                raise FileExistsError(key) from None
            raise

    def _s3_client(self):
        """boto3's S3 client with the ``storage_options`` delta-rs is given
        (endpoint, keys, region; the rest from boto3's own environment and
        configuration, as delta-rs reads ``AWS_*`` from the environment)."""
        if self._s3 is None:
            import boto3
            kwargs = {}
            for name, value in self.storage_options.items():
                arg = _S3_CLIENT_OPTIONS.get(name.lower())
                if arg and value:
                    kwargs[arg] = value
            self._s3 = boto3.session.Session().client("s3", **kwargs)
        return self._s3


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


def _dv_file(store: TableStore, descriptor: dict) -> str:
    """The name of a descriptor's deletion-vector file in ``store``."""
    kind, ref = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "p":
        # an absolute path: inside the table (the store's names are relative)
        root = store.uri("")
        local = local_table_dir(ref) or ref
        return os.path.relpath(local, store.local_dir) if store.local_dir is not None else ref[len(root):]
    prefix, encoded = ref[:-20], ref[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def read_deletion_vector(store: TableStore, descriptor: Optional[dict]):
    """The deleted positions a descriptor names (empty without one)."""
    from pyroaring import BitMap
    if not descriptor:
        return BitMap()
    size = int(descriptor["sizeInBytes"])
    if descriptor["storageType"] == "i":
        return deserialize_positions(z85_decode(descriptor["pathOrInlineDv"])[:size])
    blob = store.read_range(_dv_file(store, descriptor), int(descriptor.get("offset") or 1), size + 8)
    (stored,) = struct.unpack_from(">i", blob, 0)
    data = blob[4:4 + stored]
    (crc,) = struct.unpack_from(">I", blob, 4 + stored) if len(blob) >= 8 + stored else (None,)
    if stored != size or zlib.crc32(data) != crc:
        raise ValueError(f"deletion vector {descriptor} is damaged (size or checksum)")
    return deserialize_positions(data)


def write_deletion_vectors(store: TableStore, bitmaps: Iterable) -> tuple[str, list[dict]]:
    """Write the bitmaps into one new deletion-vector file -> (its name in
    the store, one descriptor per bitmap, in order)."""
    ident = uuid.uuid4()
    name = f"deletion_vector_{ident}.bin"
    blob, descriptors = bytearray(b"\x01"), []
    for bitmap in bitmaps:
        data = serialize_positions(bitmap)
        descriptors.append({"storageType": "u", "pathOrInlineDv": z85_encode(ident.bytes),
                            "offset": len(blob), "sizeInBytes": len(data), "cardinality": len(bitmap)})
        blob += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    store.write(name, bytes(blob))
    return name, descriptors


# --------------------------------------------------------------- live files
class LiveFiles:
    """The table's live data files (``add`` actions, deletion vectors
    included) at a version, read from the log: the last checkpoint, then the
    JSON commits after it; later versions are read incrementally."""

    def __init__(self, store: TableStore):
        self.store = store
        self.version = -1
        self.files: dict[str, dict] = {}

    def at(self, version: int) -> dict[str, dict]:
        """path -> ``add`` action of every live file at ``version``."""
        if version < self.version:
            self.version, self.files = -1, {}
        if self.version < 0:
            self._from_checkpoint(version)
        for v in range(self.version + 1, version + 1):
            text = self.store.read(f"_delta_log/{v:020d}.json").decode("utf-8")
            self._apply(json.loads(line) for line in text.splitlines() if line.strip())
            self.version = v
        return self.files

    def _from_checkpoint(self, version: int) -> None:
        try:
            last = json.loads(self.store.read("_delta_log/_last_checkpoint"))
        except FileNotFoundError:
            return
        cp = int(last["version"])
        if cp > version:
            return
        parts = int(last.get("parts") or 0)
        names = ([f"{cp:020d}.checkpoint.parquet"] if not parts else
                 [f"{cp:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])
        for name in names:
            adds = self.store.parquet(f"_delta_log/{name}").read(columns=["add"])["add"]
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


def commit_next_version(store: TableStore, version: int, actions: list[dict]) -> None:
    """Write ``actions`` as commit ``version``, only if no writer took it
    (:class:`CommitTaken` otherwise): :meth:`TableStore.put_if_absent`."""
    text = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    try:
        store.put_if_absent(f"_delta_log/{version:020d}.json", text.encode("utf-8"))
    except FileExistsError:
        raise CommitTaken(f"version {version} of the Delta table at {store.path!r} was committed by "
                          f"another writer") from None
