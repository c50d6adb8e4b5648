"""``python -m triton_embed_server.run.supervisor [options] -- <tritonserver arguments>``."""

import sys

from triton_embed_server.run.supervisor.command import main

if __name__ == "__main__":
    sys.exit(main())
