# Shared by scripts/bootstrap.sh and scripts/test_megatron016.sh (sourced, not run).
# find_python VERSION: the path of a working pythonVERSION (on PATH, else in pyenv's
# versions), or status 1.
# pyver PYTHON: its "major.minor".
# installer ENV_DIR [pip]: sets the array `install` to `uv pip install` into ENV_DIR where
# uv can be had (a small venv of its own in the user's cache), else to ENV_DIR's pip. uv
# does not look at the CPU torch wheel on this disk, so callers that want that wheel pass
# `pip`.

runs() { "$1" -c '' >/dev/null 2>&1; } # a pyenv shim without that version refuses here

find_python() {
  local version=$1 candidate
  if command -v "python$version" >/dev/null && runs "python$version"; then
    command -v "python$version"
    return
  fi
  if command -v pyenv >/dev/null; then
    for candidate in "$(pyenv root)"/versions/"$version"*/bin/"python$version"; do
      if [ -x "$candidate" ] && runs "$candidate"; then
        echo "$candidate"
        return
      fi
    done
  fi
  return 1
}

pyver() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

installer() {
  local env_dir=$1 mode=${2:-uv} uv_home=${XDG_CACHE_HOME:-$HOME/.cache}/scout-bootstrap-uv
  if [ "$mode" = uv ] && [ ! -x "$uv_home/bin/uv" ]; then
    { "$env_dir/bin/python" -m venv "$uv_home" && "$uv_home/bin/pip" install -q uv; } >/dev/null 2>&1 || true
  fi
  if [ "$mode" = uv ] && [ -x "$uv_home/bin/uv" ]; then
    install=("$uv_home/bin/uv" pip install -q --python "$env_dir/bin/python")
  else
    install=("$env_dir/bin/pip" install -q --disable-pip-version-check)
  fi
}
