"""Read the records of an offline W&B run file (``run-<id>.wandb``).

wandb 0.31 no longer ships a Python reader for its run files (``wandb.sdk.internal.datastore`` was removed when
the writer moved to the Go core), so the tests read them here: a 7-byte header (``:W&B``, magic 0xBEE1, version)
followed by LevelDB's log format (32 KiB blocks; each chunk: CRC32 (4), little-endian length (2), type (1):
1 full, 2 first, 3 middle, 4 last), each record a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
FILE_HEADER = 7
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, pending, offset = [], b"", FILE_HEADER
    while offset + CHUNK_HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < CHUNK_HEADER:  # block trailer: padding
            offset += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + CHUNK_HEADER])
        payload = data[offset + CHUNK_HEADER : offset + CHUNK_HEADER + length]
        offset += CHUNK_HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block
            continue
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def history_rows(path: Path) -> list[dict[str, str]]:
    """Each logged history row: key -> JSON-encoded value."""
    return [
        {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
        for record in read_records(path)
        if record.WhichOneof("record_type") == "history"
    ]
