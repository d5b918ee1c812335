"""`python -m privacylab` runs the command line."""

from __future__ import annotations

from privacylab.cli import app

if __name__ == "__main__":
    app(prog_name="privacylab")
