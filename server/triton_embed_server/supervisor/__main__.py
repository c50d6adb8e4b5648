"""``python -m triton_embed_server.supervisor [options] -- <tritonserver arguments>``."""

import sys

from triton_embed_server.supervisor.command import main

if __name__ == "__main__":
    sys.exit(main())
