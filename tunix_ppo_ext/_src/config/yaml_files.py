"""The YAML reader of config files and overrides: PyYAML's safe loader that refuses a key
given twice in one mapping (YAML keeps the last), reads `1e-8` as a float, and answers bad
input in one line naming the file or override and the line."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Hashable
from typing import Any

import yaml

from tunix_ppo_ext._src.checks import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
  """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last).

  A merge key (`<<: *anchor`) is flattened as PyYAML does: the mapping's own keys are
  checked among themselves first, then override the merged ones."""

  def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
    if isinstance(node, yaml.MappingNode):
      seen: set[Any] = set()
      for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:
          continue
        key = self.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
          continue  # an unhashable key: the safe loader's own error follows
        if key in seen:
          raise yaml.constructor.ConstructorError(
            None, None, f"key {str(key)!r} given twice", key_node.start_mark
          )
        seen.add(key)
    return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e-8` (no dot) as a string; YAML 1.2 and JSON read a float, and
# `config.json` writes floats that way, so exponent floats without a dot are floats here too.
UniqueKeyLoader.add_implicit_resolver(
  "tag:yaml.org,2002:float",
  re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
  list("-+0123456789"),
)


def load_yaml(source: pathlib.Path | str, where: str) -> Any:
  """YAML from a file or a string; ConfigError naming `where` and the line on bad input."""
  try:
    text = source.read_text() if isinstance(source, pathlib.Path) else source
    return yaml.load(text, Loader=UniqueKeyLoader)
  except UnicodeDecodeError as err:
    raise ConfigError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
  except yaml.YAMLError as err:
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    raise ConfigError(f"{where}: invalid YAML: {problem}{at}") from None
