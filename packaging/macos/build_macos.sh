#!/usr/bin/env bash
# macOS recipe: dist/RidgeFill.app and dist/RidgeFill-<version>.dmg.
# NOT BUILT on this project's machines (Linux only); written for a macOS build host
# (macOS 12+, Xcode command line tools for iconutil/codesign/hdiutil, Python 3.11).
#
#   python3.11 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[package]'
#   packaging/macos/build_macos.sh
#
# Signing: ad hoc by default (runs on the build Mac; Gatekeeper warns elsewhere). For
# distribution set CODESIGN_ID="Developer ID Application: ..." and notarize the .dmg:
#   xcrun notarytool submit dist/RidgeFill-<version>.dmg --keychain-profile <profile> --wait
#   xcrun stapler staple dist/RidgeFill-<version>.dmg
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
ICONS=build/icons

"$PY" packaging/make_icon.py "$ICONS"
# .icns from the PNGs: iconutil wants an .iconset with 1x and 2x sizes.
SET=build/RidgeFill.iconset
rm -rf "$SET" && mkdir -p "$SET"
for s in 16 32 128 256 512; do
    cp "$ICONS/ridgefill-$s.png" "$SET/icon_${s}x${s}.png"
    d=$((s * 2)); [ -f "$ICONS/ridgefill-$d.png" ] && cp "$ICONS/ridgefill-$d.png" "$SET/icon_${s}x${s}@2x.png"
done
iconutil -c icns "$SET" -o "$ICONS/ridgefill.icns"

RIDGEFILL_ICON_DIR="$ICONS" "$PY" -m PyInstaller --noconfirm packaging/ridgefill.spec
APP=dist/RidgeFill.app

if [ -n "${CODESIGN_ID:-}" ]; then  # hardened runtime, required for notarization
    codesign --force --deep --options runtime --entitlements packaging/macos/entitlements.plist \
        --sign "$CODESIGN_ID" "$APP"
else
    codesign --force --deep --sign - "$APP"
fi
# The windowed program still has a terminal's stdout when started from one:
"$APP/Contents/MacOS/RidgeFill" --selftest

# The disk image: the app and a link to /Applications to drag it onto.
STAGE=build/dmg
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
DMG=dist/RidgeFill-$VERSION.dmg
rm -f "$DMG"
hdiutil create -volname "RidgeFill Desktop" -srcfolder "$STAGE" -ov -format UDZO "$DMG"
[ -z "${CODESIGN_ID:-}" ] || codesign --sign "$CODESIGN_ID" "$DMG"
du -sh "$APP" "$DMG"
