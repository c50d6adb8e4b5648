"""``python -m triton_embed_server.host.shm``: see :mod:`triton_embed_server.host.shm.cli`."""

import sys

from triton_embed_server.host.shm.cli import main

if __name__ == "__main__":
    sys.exit(main())
