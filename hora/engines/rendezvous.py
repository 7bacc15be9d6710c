"""The torch.distributed rendezvous store, hosted by the launcher on a port it keeps bound.

"Bind port 0, close it, hand the number on and hope" races with every other program on the host
("Address already in use"). Here the launcher binds the store's listening socket itself, on the
interface its ranks dial, and hands it to torch's store server (`master_listen_fd`), which keeps
it for the run; workers connect to it as clients (TORCHELASTIC_USE_AGENT_STORE), rank 0 included.

The socket is the host's own family: torch's server would listen on an IPv6 socket that takes
IPv4 peers as v4-mapped addresses, which it then reverse-resolves by DNS for its logs, in its one
thread, at every connection: a resolver that drops a query stalls the whole store for 5 s, for a
thousand ranks as for one (pytorch#159007). An IPv4 socket's loopback peers resolve from
/etc/hosts. Its backlog takes a thousand ranks that dial at once.
"""

from __future__ import annotations

import socket
from typing import Any

BACKLOG = 4096


def host_store(host: str) -> tuple[Any, int]:
    """Start a TCPStore server on `host`; returns (store, port). Drop the store to close it."""
    from torch.distributed import TCPStore  # imported here: `import hora` stays light

    listener = socket.create_server((host, 0), backlog=BACKLOG)
    port = int(listener.getsockname()[1])
    try:
        store = TCPStore(
            host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno()
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store's server owns it now, and closes it with the store
    return store, port
