"""The shapes of the values a traced program carries (for the KV-cache tests)."""

from __future__ import annotations


def value_shapes(jaxpr) -> list[tuple[int, ...]]:
  """The shapes of every value `jaxpr` and the jaxprs inside it (scan, cond, custom_vjp,
  pjit bodies) compute."""
  shapes = []
  for eqn in jaxpr.eqns:
    shapes += [tuple(getattr(var.aval, "shape", ())) for var in eqn.outvars]
    for sub in _inner(eqn.params):
      shapes += value_shapes(sub)
  return shapes


def _inner(params: dict) -> list:
  """The jaxprs among an equation's parameters (open, closed, or a tuple of them)."""
  found = []
  for value in params.values():
    for item in value if isinstance(value, tuple | list) else (value,):
      item = getattr(item, "jaxpr", item)  # a ClosedJaxpr's open jaxpr
      if hasattr(item, "eqns"):
        found.append(item)
  return found
