"""Where a node finds what it reads at run time: the source tree, or the package's share
directory of a colcon install (`share/timelyllm_ros`: config/, lrtrace/, launch/, models/).

From a source checkout everything resolves in the repository, as before. From an install space
(`colcon build` in a workspace, no symlink install) `timelyllm_ros/` lives in
`<prefix>/lib/python3.X/site-packages` with no config beside it, so the share directory is
found through the ament index (or, failing that, the prefix layout), and the core's own default
paths are pointed there through their environment overrides.
"""

from __future__ import annotations

import os
from pathlib import Path

import timelyllm_ros
from timelyllm_ros.core.tuf import CONFIG_DIR_ENV

PACKAGE = "timelyllm_ros"
LRTRACE_DIR_ENV = "TIMELYLLM_LRTRACE_DIR"
MODEL_DIR_ENV = "TIMELYLLM_MODEL_DIR"
MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE_DIR = Path(timelyllm_ros.__file__).resolve().parent


def source_root() -> Path | None:
    """The repository root when running from a source checkout, else None."""
    root = _PACKAGE_DIR.parent
    return root if (root / "package.xml").is_file() and (root / "config").is_dir() else None


def share_dir() -> Path:
    """The source root, or share/timelyllm_ros of the install this package was imported from."""
    root = source_root()
    if root is not None:
        return root
    # <prefix>/lib/python3.X/site-packages/timelyllm_ros -> <prefix>/share/timelyllm_ros
    beside = _PACKAGE_DIR.parents[3] / "share" / PACKAGE
    if (beside / "config").is_dir():
        return beside
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception as err:  # noqa: BLE001 - PackageNotFoundError, or no ament index at all
        raise FileNotFoundError(f"{PACKAGE}: no source tree beside {_PACKAGE_DIR} and no share "
                                f"directory ({err})") from None


def config_dir() -> Path:
    env = os.environ.get(CONFIG_DIR_ENV)
    return Path(env) if env else share_dir() / "config"


def model_dir() -> Path:
    """The bundled model: $TIMELYLLM_MODEL_DIR, else models/ of the source tree or share dir."""
    env = os.environ.get(MODEL_DIR_ENV)
    return Path(env) if env else share_dir() / "models" / MODEL_NAME


def launch_dir() -> Path:
    return share_dir() / "launch"


def use_installed_config() -> None:
    """Point the core's default paths (config, LRTrace traces) at the share directory when
    running from an install space; a no-op in a source checkout or when already set."""
    if source_root() is not None:
        return
    share = share_dir()
    os.environ.setdefault(CONFIG_DIR_ENV, str(share / "config"))
    os.environ.setdefault(LRTRACE_DIR_ENV, str(share / "lrtrace"))
