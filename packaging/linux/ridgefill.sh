#!/bin/sh
# /usr/bin/ridgefill: starts RidgeFill Desktop, installed under /opt/ridgefill.
# Resolved relative to this script so that an unpacked root (dpkg -x into a folder) works too.
here=$(dirname "$(readlink -f "$0")")
exec "$here/../../opt/ridgefill/ridgefill" "$@"
