"""How the user started omnictl, so the commands we suggest can be pasted as they are.

``omnictl`` is on ``PATH`` only while its venv is active; someone who typed
``.venv/bin/omnictl serve`` must be told ``.venv/bin/omnictl bench ...``, not a command their
shell cannot find.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys


def program(argv0: str | None = None, path: str | None = None) -> str:
    """The command to type for omnictl, as it was invoked: ``omnictl`` when that name on
    ``PATH`` is the program now running, else the path it was started by (or
    ``python -m omnictl.cli.main`` when it was started as a module)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if not argv0 or argv0.endswith(".py") or argv0 == "-m":
        return f"{shlex.quote(sys.executable)} -m omnictl.cli.main"
    found = shutil.which("omnictl", path=path)
    if found is not None and os.path.exists(argv0) and os.path.samefile(found, argv0):
        return "omnictl"
    if os.path.basename(argv0) == argv0 and found is not None:
        return "omnictl"  # started by name from PATH
    return shlex.quote(argv0)
