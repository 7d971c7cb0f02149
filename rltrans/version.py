"""The package version, in one place: pyproject.toml reads it, ``--version`` prints it,
checkpoints and exports record it, and CHANGELOG.md's newest release names it.

A leaf module: it imports nothing, so any layer may read the version without importing the
package's root (``rltrans/__init__.py`` re-exports it as ``rltrans.__version__``).
"""

__version__ = "0.2.0"
