"""Where the colcon-built msg types live, and the environment a process needs to use them.

On a machine with a ROS 2 distribution the package is installed by colcon and sourced as usual;
everything here is then a no-op. On a pip-only machine the interface types are built into
`.cache/colcon/install` of the repository by scripts/bootstrap.sh.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from timelyllm_ros import (INSTALL_PREFIX, LIB_DIR, PACKAGE, PY_SITE,  # noqa: F401 - re-exported
                           REPO_ROOT, interfaces_built)


def shell_exports() -> str:
    """Lines for `eval "$(timelyllm env)"`: rclpy and our msg types in a user's own scripts."""
    venv = Path(sys.prefix)
    ld = [str(LIB_DIR), str(venv / "lib")] + [
        str(p) for p in sorted((venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                                 / "site-packages").glob("ros_*.libs"))
    ]
    lines = [
        f'export PATH="{venv / "bin"}:$PATH"',
        f'export PYTHONPATH="{REPO_ROOT}:{PY_SITE}${{PYTHONPATH:+:$PYTHONPATH}}"',
        f'export LD_LIBRARY_PATH="{os.pathsep.join(ld)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        f'export AMENT_PREFIX_PATH="{INSTALL_PREFIX}:{venv}${{AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}}"',
        'export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"',
    ]
    return "\n".join(lines)
