"""A reader for offline W&B run files.

An offline W&B run file (`run-*.wandb`) is a LevelDB-style log: a 7-byte header (`:W&B`,
magic 0xBEE1, version), then 32 KiB blocks of records, each a 7-byte header (CRC32C,
length, type: 1 full, 2 first, 3 middle, 4 last) and a chunk of a serialized
`wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import pathlib
import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  pass


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
    if pos + _HEADER.size + length > len(data):
      return  # a record still being written (the reader waits for the run's exit record)
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


def read_wandb_run(
  path: str | pathlib.Path, timeout_s: float = 120.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """`(history rows, config)` of an offline run file (config values JSON-decoded).

  Waits until the run's `exit` record is in the file: `run.finish()` can return before
  W&B's service process has written the last records (seen under load); after `timeout_s`
  it reads what is there.
  """
  from wandb.proto import wandb_internal_pb2

  deadline = time.monotonic() + timeout_s
  while True:
    records = [
      wandb_internal_pb2.Record.FromString(raw) for raw in _records(pathlib.Path(path).read_bytes())
    ]
    if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
      break
    time.sleep(0.05)
  history, config = [], {}
  for record in records:
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
