"""``python -m tracekit.capture.nsys CONFIG_JSON OUT_DIR``: the program nsys launches."""

import sys

from tracekit.capture.nsys.ranks import spawn_ranks

if __name__ == "__main__":
    spawn_ranks(sys.argv[1], sys.argv[2])
