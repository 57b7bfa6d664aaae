"""The rendezvous of multi-process tests without a free-port race: no port is picked, released and then bound again.

``torchrun --standalone`` binds its store on a port the system picks and hands it to its workers
(:data:`TORCHRUN_STANDALONE`); processes spawned by a test join :func:`agent_store`, a store the test holds open,
the way ``torchrun``'s workers join its agent's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from torch.distributed import TCPStore

TORCHRUN_STANDALONE = "--standalone"
"""``torch.distributed.run``'s single-node rendezvous on a port of the system's choosing."""


@contextmanager
def agent_store() -> Iterator[dict[str, str]]:
    """A store bound on a port the system picks, held open while the block runs; yields the environment that makes
    ``init_process_group`` (``env://``) join it as ``torchrun``'s workers join their agent's store."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    try:
        yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCHELASTIC_RESTART_COUNT": "0"}
    finally:
        del store
