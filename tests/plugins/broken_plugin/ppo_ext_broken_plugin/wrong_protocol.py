"""Imports fine but breaks the protocols: a KL estimator needing 3 arguments, a non-env."""


def not_a_kl(logp, ref_logp, temperature):
  """Takes a third, required argument: not `(logp, ref_logp)`."""
  return (logp - ref_logp) / temperature


class NotAnEnv:
  """Builds, but has no `reset`/`step`/`max_return`."""

  name = "not_an_env"
