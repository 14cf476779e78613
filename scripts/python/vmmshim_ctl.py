#!/usr/bin/env python3
"""vmmshim ctl / vmmshim top (scripts/vmmshim runs this: `vmmshim ctl ARGS` as
`vmmshim_ctl.py ARGS`, `vmmshim top ARGS` as `vmmshim_ctl.py top ARGS`). The code is in the vmmshim
package next to this file (vmmshim/cli.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from vmmshim import cli  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(cli.main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
