"""``python -m triton_embed_server.shm``: see :mod:`triton_embed_server.shm.cli`."""

import sys

from triton_embed_server.shm.cli import main

if __name__ == "__main__":
    sys.exit(main())
