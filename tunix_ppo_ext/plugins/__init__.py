"""The plugin layer (stdlib only, no side effects): kinds, protocols and the registry.

`registry` finds names through entry points (`tunix_ppo_ext.<kind>` groups) and in-code
registrations; `protocols` says what each kind must be.
"""

from tunix_ppo_ext.plugins import kinds, protocols, registry

__all__ = ["kinds", "protocols", "registry"]
