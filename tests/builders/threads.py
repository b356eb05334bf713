"""One torch thread for the worker tests (a helper module; its name is unique across tests/)."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread():
    """Tiny matrices gain nothing from threads, and on a shared 2-core machine OpenMP spinning makes
    them several times slower; the setting is restored for tests outside this folder."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
