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
#   2. the data directory /var/lib/hpbroker, owned by hpbroker, mode 0750
#   3. /etc/hpbroker/hpbroker.toml from deploy/hpbroker.toml, only when absent: local settings
#      are never overwritten (docs/CONFIGURATION.md describes every one)
#   4. a virtualenv in /opt/hpbroker holding this source tree, installed with pip (which builds
#      the compiled extensions: a C compiler and Python headers are needed, and PyPI for the
#      dependencies)
#   5. /etc/systemd/system/hpbroker.service from deploy/hpbroker.service (always replaced: put
#      local changes in a drop-in, `systemctl edit hpbroker`)
#   6. `systemctl daemon-reload`, when systemd runs; a running broker keeps running the old
#      version until `systemctl restart hpbroker`
#
# Environment, for other layouts (the unit and the configuration are rewritten to match):
#   PREFIX=/opt/hpbroker  CONFIG_DIR=/etc/hpbroker  DATA_DIR=/var/lib/hpbroker
#   UNIT_DIR=/etc/systemd/system  SERVICE_USER=hpbroker  PYTHON=python3 (3.11 or later)
#   INSTALL_PACKAGE=no: leave the virtualenv as it is (re-install the unit and configuration only)
set -euo pipefail

SOURCE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${PREFIX:-/opt/hpbroker}
CONFIG_DIR=${CONFIG_DIR:-/etc/hpbroker}
DATA_DIR=${DATA_DIR:-/var/lib/hpbroker}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
SERVICE_USER=${SERVICE_USER:-hpbroker}
PYTHON=${PYTHON:-python3}
INSTALL_PACKAGE=${INSTALL_PACKAGE:-yes}

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a Python 3.11 or later"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is older than 3.11; set PYTHON to a newer one"

# 1. user and group
if getent passwd "$SERVICE_USER" >/dev/null; then
  say "user $SERVICE_USER exists"
else
  useradd --system --user-group --home-dir "$DATA_DIR" --no-create-home \
    --shell /usr/sbin/nologin --comment "hpbroker log broker" "$SERVICE_USER"
  say "created system user $SERVICE_USER"
fi
SERVICE_GROUP=$(id -gn "$SERVICE_USER")

# 2. data directory
install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_GROUP" "$DATA_DIR"
say "data directory $DATA_DIR"

# 3. configuration, only when absent
install -d -m 0755 "$CONFIG_DIR"
if [ -e "$CONFIG_DIR/hpbroker.toml" ]; then
  say "keeping $CONFIG_DIR/hpbroker.toml"
else
  tmp=$(mktemp)
  sed "s#\"/var/lib/hpbroker\"#\"$DATA_DIR\"#" "$SOURCE_DIR/deploy/hpbroker.toml" >"$tmp"
  install -m 0640 -o root -g "$SERVICE_GROUP" "$tmp" "$CONFIG_DIR/hpbroker.toml"
  rm -f "$tmp"
  say "wrote $CONFIG_DIR/hpbroker.toml"
fi

# 4. the package, in its own virtualenv
if [ "$INSTALL_PACKAGE" = no ]; then
  say "leaving $PREFIX as it is (INSTALL_PACKAGE=no)"
else
  [ -x "$PREFIX/bin/python" ] || "$PYTHON" -m venv "$PREFIX"
  "$PREFIX/bin/python" -m pip install -q --upgrade pip
  "$PREFIX/bin/python" -m pip install -q --upgrade "$SOURCE_DIR"
  say "installed $("$PREFIX/bin/hpbroker" version) in $PREFIX"
fi
[ -x "$PREFIX/bin/hpbroker" ] || die "$PREFIX/bin/hpbroker is missing: install the package (INSTALL_PACKAGE=yes)"

# 5. the unit, its paths and user matching this installation
install -d -m 0755 "$UNIT_DIR"
tmp=$(mktemp)
sed -e "s#/opt/hpbroker/#$PREFIX/#g" -e "s#/etc/hpbroker/#$CONFIG_DIR/#g" -e "s#/var/lib/hpbroker#$DATA_DIR#g" \
    -e "s#^User=.*#User=$SERVICE_USER#" -e "s#^Group=.*#Group=$SERVICE_GROUP#" \
    "$SOURCE_DIR/deploy/hpbroker.service" >"$tmp"
install -m 0644 "$tmp" "$UNIT_DIR/hpbroker.service"
rm -f "$tmp"
say "installed $UNIT_DIR/hpbroker.service"

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
