"""The torch.distributed rendezvous store, hosted by the launcher on a port it keeps bound.

"Bind port 0, close it, hand the number on and hope" races with every other program on the host
("Address already in use"). Here the store's own server binds port 0 and stays up for the run;
workers connect to it as clients (TORCHELASTIC_USE_AGENT_STORE), rank 0 included.
"""

from __future__ import annotations

from typing import Any


def host_store(host: str) -> tuple[Any, int]:
    """Start a TCPStore server on `host`; returns (store, port). Drop the store to close it."""
    from torch.distributed import TCPStore  # imported here: `import hora` stays light

    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
    return store, store.port
