"""Sphinx configuration of the tunix-ppo-ext documentation (builds offline)."""

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

project = "tunix-ppo-ext"
author = "tunix-ppo-ext authors"
copyright = "2026, tunix-ppo-ext authors"  # noqa: A001

import tunix_ppo_ext  # noqa: E402

release = tunix_ppo_ext.__version__

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "sphinxarg.ext",
  "ppo_ext_reference",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "reference/_generated", "**/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
default_role = "code"  # `name` in docstrings is code, as in the README

autosummary_generate = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
suppress_warnings = ["myst.header"]

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
