"""Finding released files under a user-given folder (never downloading them)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from privacylab.data.errors import DataError


def require_root(name: str, root: Path | None, expected: Sequence[str]) -> Path:
    """`root` as an existing folder, or DataError naming the files `name` expects there."""
    wanted = ", ".join(expected)
    if root is None:
        raise DataError(
            f"dataset {name!r} is read from a local folder: pass root= a folder holding "
            f"{wanted} (nothing is downloaded)"
        )
    if not root.is_dir():
        raise DataError(f"dataset {name!r}: root {root} is not a folder (expected {wanted})")
    return root


def find_folder(
    name: str, folders: Sequence[Path], files: Sequence[Sequence[str]]
) -> tuple[Path, list[Path]]:
    """The first of `folders` holding every file, each given as alternatives (e.g. with `.gz`).

    Returns the folder and the chosen path of each file, or raises DataError naming the expected
    files and every folder searched.
    """
    for folder in folders:
        chosen = []
        for alternatives in files:
            found = next((folder / f for f in alternatives if (folder / f).is_file()), None)
            if found is None:
                break
            chosen.append(found)
        else:
            return folder, chosen
    wanted = ", ".join("[" + " | ".join(alts) + "]" if len(alts) > 1 else alts[0] for alts in files)
    searched = ", ".join(str(f) for f in folders)
    raise DataError(
        f"dataset {name!r}: expected files {wanted} in one of {searched} (nothing is downloaded)"
    )
