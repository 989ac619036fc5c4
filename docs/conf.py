"""Sphinx configuration of the tunix-ppo-ext documentation (builds offline)."""

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

project = "tunix-ppo-ext"
author = "tunix-ppo-ext authors"
copyright = "2026, tunix-ppo-ext authors"

import tunix_ppo_ext  # noqa: E402

release = tunix_ppo_ext.__version__

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinxarg.ext",
  "ppo_ext_reference",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "reference/_generated", "**/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
default_role = "code"  # `name` in docstrings is code, as in the README

autosummary_generate = False  # one page per public module (automodule), no stub pages
autodoc_typehints = "signature"
autodoc_member_order = "alphabetical"
# Type names in signatures resolve to more than one documented re-export (e.g. `Environment`
# is public in both `envs` and `plugins`): any of them is right.
suppress_warnings = ["myst.header", "ref.python"]

# A public class is documented under its public name only (its `_src` home is private), so
# the same class re-exported by two public modules is not one object described twice.
try:
  from sphinx.ext.autodoc._property_types import _ClassDefProperties

  _ClassDefProperties.canonical_full_name = property(lambda self: None)
except ImportError:  # another Sphinx: classes keep their `:canonical:` option
  pass

html_theme = "sphinx_book_theme"
html_title = f"tunix-ppo-ext {release}"
html_static_path = []
html_theme_options = {
  "repository_url": "https://github.com/google/tunix",
  "use_repository_button": False,
  "show_toc_level": 2,
  "navigation_with_keys": False,
}
# offline: no intersphinx, no remote images
smartquotes = False  # `--output-dir` stays two hyphens
