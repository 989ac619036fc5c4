"""Plugin kinds, the protocols each kind must meet, and the entry-point registry (stdlib only)."""
