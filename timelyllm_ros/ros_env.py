"""Where the colcon-built msg types live, and the environment a process needs to use them.

On a machine with a ROS 2 distribution the package is installed by colcon and sourced as usual;
everything here is then a no-op. On a pip-only machine the interface types are built into
`.cache/colcon/install` of the repository by scripts/bootstrap.sh.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "timelyllm_ros"
INSTALL_PREFIX = REPO_ROOT / ".cache" / "colcon" / "install" / PACKAGE
PY_SITE = INSTALL_PREFIX / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
LIB_DIR = INSTALL_PREFIX / "lib"


def interfaces_built() -> bool:
    return (PY_SITE / PACKAGE / "msg" / "__init__.py").is_file()


def extend_package_path(package_path: list[str]) -> None:
    generated = PY_SITE / PACKAGE
    if generated.is_dir() and str(generated) not in package_path:
        package_path.append(str(generated))
        _preload_interface_libraries()


def _preload_interface_libraries() -> None:
    # The generated Python extensions link against our typesupport libraries by soname, and the
    # loader only searches LD_LIBRARY_PATH as it was at process start. Loading them first, by full
    # path and globally, lets `import timelyllm_ros.msg` work in any process; rosidl's runtime
    # lookup of the fastrtps typesupport reads LD_LIBRARY_PATH when it runs, so extend it too.
    if not LIB_DIR.is_dir():
        return
    ld_parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if str(LIB_DIR) not in ld_parts:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([str(LIB_DIR), *ld_parts])
    ament = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    if str(INSTALL_PREFIX) not in ament:
        os.environ["AMENT_PREFIX_PATH"] = os.pathsep.join([str(INSTALL_PREFIX), *ament, sys.prefix])
    # Generator libraries first: the typesupport libraries depend on them.
    libs = sorted(LIB_DIR.glob(f"lib{PACKAGE}__*.so"), key=lambda p: "generator" not in p.name)
    for lib in libs:
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            # A typesupport for an RMW that is not installed; rosidl skips it at runtime too.
            pass


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
