"""`python -m crashreplay ARGS`: runs the `crashreplay` executable with ARGS.

The executable is the C++ tool (record, info, verify, replay, bisect, ...);
`pip install .` puts it in the environment's bin/ beside python. Looked up,
in order: $CRASHREPLAY_BIN; the file the installed distribution recorded
(its RECORD, wherever pip's scheme put the scripts); the scripts directory
of this interpreter; PATH; an in-tree build (<checkout>/build/tools). The
process is replaced by the executable (os.execv), so exit codes and signals
are the tool's own (docs/cli.md).
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from typing import List, Optional

_NAME = "crashreplay"


def _from_distribution() -> Optional[str]:
    try:
        from importlib import metadata

        files = metadata.distribution(_NAME).files or []
    except Exception:  # not installed as a distribution (in-tree use)
        return None
    for f in files:
        if f.name == _NAME and f.parent.name in ("bin", "Scripts"):
            path = str(f.locate())
            if os.access(path, os.X_OK):
                return path
    return None


def find_executable() -> Optional[str]:
    """The `crashreplay` executable this package belongs with, or None."""
    env = os.environ.get("CRASHREPLAY_BIN")
    if env:
        return env
    candidates = [_from_distribution(), os.path.join(sysconfig.get_path("scripts"), _NAME), shutil.which(_NAME)]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "build", "tools", _NAME))  # <checkout>/python/crashreplay
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    exe = find_executable()
    if exe is None:
        print("crashreplay: the crashreplay executable was not found (install the package with `pip install .`, "
              "build it with scripts/build.sh, or set CRASHREPLAY_BIN)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
