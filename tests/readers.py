"""Test helper (not a test): reads an offline W&B run file back, without W&B's servers.

A `run-*.wandb` file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1,
version), then 32 KiB blocks of records, each a 7-byte header (CRC32C, length, type:
1 full, 2 first, 3 middle, 4 last) and a chunk of a serialized `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Iterator
from typing import Any

_BLOCK = 32768
_HEADER = struct.Struct("<IHB")


def _records(data: bytes) -> Iterator[bytes]:
  ident, magic, _ = struct.unpack("<4sHB", data[:7])
  assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
  pos, pending = 7, b""
  while pos + _HEADER.size <= len(data):
    left = _BLOCK - pos % _BLOCK
    if left < _HEADER.size:
      pos += left
      continue
    _, length, kind = _HEADER.unpack_from(data, pos)
    if kind == 0:  # zero padding up to the end of the block
      pos += left
      continue
    chunk = data[pos + _HEADER.size : pos + _HEADER.size + length]
    pos += _HEADER.size + length
    if kind == 1:
      yield chunk
    elif kind == 2:
      pending = chunk
    elif kind == 3:
      pending += chunk
    elif kind == 4:
      yield pending + chunk


def _key(item: Any) -> str:
  """W&B stores a key with `/` as its list of parts (`nested_key`)."""
  return item.key or "/".join(item.nested_key)


def read_wandb_run(path: str | pathlib.Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """`(history rows, config)` of an offline run file (config values JSON-decoded)."""
  from wandb.proto import wandb_internal_pb2  # noqa: PLC0415

  history, config = [], {}
  for raw in _records(pathlib.Path(path).read_bytes()):
    record = wandb_internal_pb2.Record.FromString(raw)
    kind = record.WhichOneof("record_type")
    if kind == "history":
      history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
    elif kind == "run":
      for item in record.run.config.update:
        config[item.key] = json.loads(item.value_json)
    elif kind == "config":
      for item in record.config.update:
        config[item.key] = json.loads(item.value_json)
  return history, config
