"""Fails to import: it needs a package that is not installed."""

import ppo_ext_no_such_dependency  # noqa: F401


def broken_kl(logp, ref_logp):
  """Never reached."""
  return logp - ref_logp
