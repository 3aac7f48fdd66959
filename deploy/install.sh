#!/usr/bin/env bash
# Install hpbroker as a systemd service on this machine (Debian or alike, as root):
#
#   sudo deploy/install.sh        # or: make install
#   sudo systemctl enable --now hpbroker
#   systemctl status hpbroker; journalctl -u hpbroker
#
# Steps, each one skipped or harmless when already done, so running it again upgrades the
# package and the unit and leaves everything else as it is:
#   1. the system user and group `hpbroker` (no login shell; home is the data directory)
#   2. the data directory /var/lib/hpbroker, owned by hpbroker, mode 0750, when absent (an
#      existing one keeps its owner and mode)
#   3. /etc/hpbroker/hpbroker.toml from deploy/hpbroker.toml, only when absent: local settings
#      are never overwritten (docs/CONFIGURATION.md describes every one).  When it exists, its
#      data_dir (and run_dir, if set) are the ones the unit is written for
#   4. a virtualenv in /opt/hpbroker holding this source tree, installed with pip from a copy of
#      the files git does not ignore (nothing is built or written in the source tree); pip builds
#      the compiled extensions: a C compiler and Python headers are needed, and PyPI for the
#      dependencies the first time; a later run works offline when they are installed already
#   5. /etc/systemd/system/hpbroker.service from deploy/hpbroker.service (always replaced: put
#      local changes in a drop-in, `systemctl edit hpbroker`)
#   6. `systemctl daemon-reload`, when systemd runs; a running broker keeps running the old
#      version until `systemctl restart hpbroker`
#
# Environment, for other layouts (the unit and a new configuration are written to match):
#   PREFIX=/opt/hpbroker  CONFIG_DIR=/etc/hpbroker  DATA_DIR=/var/lib/hpbroker
#   UNIT_DIR=/etc/systemd/system  SERVICE_USER=hpbroker  PYTHON=python3 (3.11 or later)
#   INSTALL_PACKAGE=no: leave the virtualenv as it is (re-install the unit and configuration only)
# DATA_DIR given while the configuration exists must agree with its data_dir (else nothing is
# changed); left out, the configuration's is used.  Paths the unit names may not hold white space,
# quotes or backslashes.
set -euo pipefail

SOURCE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${PREFIX:-/opt/hpbroker}
CONFIG_DIR=${CONFIG_DIR:-/etc/hpbroker}
DATA_DIR_GIVEN=${DATA_DIR:+yes}
DATA_DIR=${DATA_DIR:-/var/lib/hpbroker}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
SERVICE_USER=${SERVICE_USER:-hpbroker}
PYTHON=${PYTHON:-python3}
INSTALL_PACKAGE=${INSTALL_PACKAGE:-yes}
CONFIG="$CONFIG_DIR/hpbroker.toml"

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a Python 3.11 or later"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is older than 3.11; set PYTHON to a newer one"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Settings files are read and written by Python (tomllib, and str.replace rather than sed), so
# that no character of a path is taken for syntax.
py() { "$PYTHON" - "$@"; }

# The configuration's data_dir and run_dir, one per line ("" for run_dir when unset).
config_paths() {
  py "$1" <<'EOF'
import os, sys, tomllib
path = sys.argv[1]
try:
    with open(path, "rb") as f:
        broker = tomllib.load(f).get("broker", {})
except (OSError, tomllib.TOMLDecodeError) as e:
    sys.exit(f"install.sh: cannot read {path}: {e}")
data_dir, run_dir = broker.get("data_dir"), broker.get("run_dir", "")
if not isinstance(data_dir, str) or not os.path.isabs(data_dir):
    sys.exit(f"install.sh: {path} must set data_dir to an absolute path (the unit needs it), got {data_dir!r}")
if not isinstance(run_dir, str) or "\n" in data_dir + run_dir:
    sys.exit(f"install.sh: {path}: run_dir {run_dir!r} is not a path")
print(os.path.normpath(data_dir))
print(run_dir and os.path.normpath(os.path.join(data_dir, run_dir)))
EOF
}

# 0. the data and run directories: from an existing configuration, else DATA_DIR
RUN_DIR=""
if [ -e "$CONFIG" ]; then
  paths=$(config_paths "$CONFIG") || exit 1
  configured=$(printf '%s\n' "$paths" | sed -n 1p)
  RUN_DIR=$(printf '%s\n' "$paths" | sed -n 2p)
  if [ -n "$DATA_DIR_GIVEN" ] && [ "$DATA_DIR" != "$configured" ]; then
    die "DATA_DIR=$DATA_DIR but $CONFIG says data_dir = \"$configured\": change one to match (nothing was changed)"
  fi
  DATA_DIR=$configured
fi
case "$DATA_DIR" in /*) ;; *) die "DATA_DIR must be an absolute path, got $DATA_DIR" ;; esac
for path in "$PREFIX" "$CONFIG_DIR" "$DATA_DIR" "$RUN_DIR"; do
  case "$path" in
    *[[:space:]]* | *'"'* | *"'"* | *\\* | *[[:cntrl:]]*)
      die "the unit cannot name $path: no white space, quotes or backslashes in its paths" ;;
  esac
done

# 1. user and group
if getent passwd "$SERVICE_USER" >/dev/null; then
  say "user $SERVICE_USER exists"
else
  if getent group "$SERVICE_USER" >/dev/null; then
    group_option=(--gid "$SERVICE_USER")
  else
    group_option=(--user-group)
  fi
  useradd --system "${group_option[@]}" --home-dir "$DATA_DIR" --no-create-home \
    --shell /usr/sbin/nologin --comment "hpbroker log broker" "$SERVICE_USER"
  say "created system user $SERVICE_USER"
fi
SERVICE_GROUP=$(id -gn "$SERVICE_USER")

# 2. data directory, when absent
if [ -d "$DATA_DIR" ]; then
  say "keeping data directory $DATA_DIR (owner and mode as they are)"
else
  install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_GROUP" "$DATA_DIR"
  say "created data directory $DATA_DIR"
fi

# 3. configuration, only when absent
install -d -m 0755 "$CONFIG_DIR"
if [ -e "$CONFIG" ]; then
  say "keeping $CONFIG"
else
  py "$SOURCE_DIR/deploy/hpbroker.toml" "$WORK/hpbroker.toml" "$DATA_DIR" <<'EOF'
import json, sys
template, out, data_dir = sys.argv[1:]
text = open(template, encoding="utf-8").read()
old = 'data_dir = "/var/lib/hpbroker"'
assert text.count(old) == 1, f"{template} no longer holds {old!r}"
# A JSON string without ASCII escapes is a TOML basic string.
open(out, "w", encoding="utf-8").write(text.replace(old, f"data_dir = {json.dumps(data_dir, ensure_ascii=False)}"))
EOF
  install -m 0640 -o root -g "$SERVICE_GROUP" "$WORK/hpbroker.toml" "$CONFIG"
  say "wrote $CONFIG"
fi

# 4. the package, in its own virtualenv, built from a copy of the tracked files
if [ "$INSTALL_PACKAGE" = no ]; then
  say "leaving $PREFIX as it is (INSTALL_PACKAGE=no)"
else
  mkdir "$WORK/source"
  if git -C "$SOURCE_DIR" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked files and new ones not ignored: never build outputs (build/, *.egg-info, *.so, *.c).
    (cd "$SOURCE_DIR" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
      if [ -e "$file" ]; then printf '%s\0' "$file"; fi; done | tar --null -T - -cf -) | tar -C "$WORK/source" -xf -
  else
    tar -C "$SOURCE_DIR" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./data \
      --exclude='*.egg-info' --exclude='*.so' -cf - . | tar -C "$WORK/source" -xf -
  fi
  if [ ! -x "$PREFIX/bin/python" ]; then
    "$PYTHON" -m venv "$PREFIX"
    "$PREFIX/bin/python" -m pip install -q --upgrade pip
  fi
  # The build tools live in the virtualenv (no isolated build environment to download each time),
  # so that a later run builds offline.
  if ! "$PREFIX/bin/python" -c 'import Cython, setuptools, wheel' 2>/dev/null; then
    "$PREFIX/bin/python" -m pip install -q "setuptools>=68" wheel "cython>=3.0"
  fi
  "$PREFIX/bin/python" -m pip install -q --no-build-isolation --upgrade "$WORK/source"
  say "installed $("$PREFIX/bin/hpbroker" version) in $PREFIX"
fi
[ -x "$PREFIX/bin/hpbroker" ] || die "$PREFIX/bin/hpbroker is missing: install the package (INSTALL_PACKAGE=yes)"

# 5. the unit, its paths and user matching this installation
install -d -m 0755 "$UNIT_DIR"
py "$SOURCE_DIR/deploy/hpbroker.service" "$WORK/hpbroker.service" "$PREFIX" "$CONFIG" "$DATA_DIR" "$RUN_DIR" \
   "$SERVICE_USER" "$SERVICE_GROUP" <<'EOF'
import os, sys
template, out, prefix, config, data_dir, run_dir, user, group = sys.argv[1:]


def unit_path(path, dollar=False):
    """A path as a unit file value: % starts a specifier, $ (in ExecStart) a variable."""
    path = path.replace("%", "%%")
    return path.replace("$", "$$") if dollar else path


def inside(path, directory):
    return os.path.commonpath([path, directory]) == directory


lines = []
for line in open(template, encoding="utf-8").read().splitlines():
    key = line.partition("=")[0]
    if key == "ExecStart":
        line = (f"ExecStart={unit_path(os.path.join(prefix, 'bin', 'hpbroker'), True)} serve "
                f"--config {unit_path(config, True)}")
    elif key in ("WorkingDirectory", "ReadWritePaths"):
        line = f"{key}={unit_path(data_dir)}"
        if key == "ReadWritePaths" and run_dir and not inside(run_dir, data_dir) and not inside(run_dir, "/run"):
            line += f" {unit_path(run_dir)}"
    elif key == "RuntimeDirectory" and run_dir and inside(run_dir, "/run") and run_dir != "/run":
        line = f"RuntimeDirectory={unit_path(os.path.relpath(run_dir, '/run'))}"
    elif key in ("User", "Group"):
        line = f"{key}={user if key == 'User' else group}"
    lines.append(line)
open(out, "w", encoding="utf-8").write("\n".join(lines) + "\n")
EOF
if [ -n "$RUN_DIR" ] && [ ! -d "$RUN_DIR" ] && [ "${RUN_DIR#/run/}" = "$RUN_DIR" ]; then
  install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_GROUP" "$RUN_DIR"
  say "created run directory $RUN_DIR"
fi
install -m 0644 "$WORK/hpbroker.service" "$UNIT_DIR/hpbroker.service"
say "installed $UNIT_DIR/hpbroker.service (data in $DATA_DIR)"

# 6. tell systemd
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  say "systemd reloaded; start with: systemctl enable --now hpbroker"
  if systemctl is-active --quiet hpbroker; then
    say "hpbroker is running the previous version until: systemctl restart hpbroker"
  fi
else
  say "systemd is not running here: no daemon-reload"
fi
