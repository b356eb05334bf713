"""Where Helix keeps what it writes once and reuses: the demo checkpoints, converted GGUF folders."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$HELIX_CACHE``, else ``$XDG_CACHE_HOME/helix``, else ``~/.cache/helix`` (not created here)."""
    base = os.environ.get("HELIX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "helix")
    return Path(base)
