"""Public benchmarks read from files: IFEval and XSTest, torch-free."""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def locate(path: str | Path) -> Path:
    """A benchmark file: `path` as given when it exists (or is absolute), else relative to this checkout, so that
    the default `../shared/data/...` paths work from any working folder."""
    given = Path(path).expanduser()
    return given if given.is_absolute() or given.exists() else CHECKOUT / given
