"""``python -m triton_embed_server.gateway --upstream HOST:PORT[,HOST:PORT...] [flags]``."""

import sys

from triton_embed_server.gateway.command import main

if __name__ == "__main__":
    sys.exit(main())
