#!/usr/bin/env bash
# Builds the Linux packages from this checkout:
#   dist/ridgefill/                               the one-folder app (PyInstaller)
#   dist/ridgefill-<version>-linux-<arch>.tar.gz  that folder, packed
#   dist/ridgefill_<version>_<debarch>.deb        installs /opt/ridgefill, /usr/bin/ridgefill,
#                                                 a desktop entry and icons (dpkg-deb)
# Usage: packaging/build_linux.sh   (PY=python interpreter with the app's deps and PyInstaller;
#        default .venv/bin/python; REUSE_APP=1 packs an existing dist/ridgefill without
#        running PyInstaller again). Prints sizes and times at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
DIST=$ROOT/dist
BUILD=$ROOT/build
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
ARCH=$(uname -m)
t_start=$(date +%s)

echo "== icons"
"$PY" packaging/make_icon.py "$BUILD/icons"

echo "== PyInstaller (one folder)"
t0=$(date +%s)
if [ -n "${REUSE_APP:-}" ] && [ -x "$DIST/ridgefill/ridgefill" ]; then
    echo "REUSE_APP set: packing the existing $DIST/ridgefill"
else
    RIDGEFILL_ICON_DIR="$BUILD/icons" "$PY" -m PyInstaller --noconfirm --log-level WARN \
        --distpath "$DIST" --workpath "$BUILD/pyinstaller" packaging/ridgefill.spec
fi
APPDIR=$DIST/ridgefill
[ -x "$APPDIR/ridgefill" ] || { echo "PyInstaller produced no $APPDIR/ridgefill" >&2; exit 1; }
# torch's libraries carry full symbol tables (~70 MB of libtorch_cpu's 415 MB); strip them the way
# Debian's dh_strip does (--strip-unneeded keeps the dynamic symbols the loader needs).
if command -v strip >/dev/null; then
    strip --strip-unneeded "$APPDIR"/_internal/torch/lib/*.so*
fi
t_pyi=$(( $(date +%s) - t0 ))

echo "== .tar.gz"
t0=$(date +%s)
TARBALL=$DIST/ridgefill-$VERSION-linux-$ARCH.tar.gz
tar -C "$DIST" -cf - ridgefill | gzip -6 > "$TARBALL"
t_tar=$(( $(date +%s) - t0 ))

echo "== .deb"
t0=$(date +%s)
if ! command -v dpkg-deb >/dev/null; then
    echo "dpkg-deb not found: skipping the .deb (install dpkg)" >&2
    DEB=""
else
    DEBARCH=$(dpkg --print-architecture)
    STAGE=$BUILD/deb/ridgefill_${VERSION}_$DEBARCH
    rm -rf "$STAGE"
    mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
             "$STAGE/usr/share/doc/ridgefill"
    cp -a "$APPDIR" "$STAGE/opt/ridgefill"
    install -m 0755 packaging/linux/ridgefill.sh "$STAGE/usr/bin/ridgefill"
    install -m 0644 packaging/linux/ridgefill.desktop "$STAGE/usr/share/applications/ridgefill.desktop"
    install -m 0644 packaging/linux/copyright "$STAGE/usr/share/doc/ridgefill/copyright"
    for size in 16 24 32 48 64 128 256 512; do
        dir=$STAGE/usr/share/icons/hicolor/${size}x${size}/apps
        mkdir -p "$dir"
        install -m 0644 "$BUILD/icons/ridgefill-$size.png" "$dir/ridgefill.png"
    done
    # Depends: what the bundle's ELF files need from the system, as Debian's dpkg-shlibdeps sees it
    # (libraries inside the bundle are private: -l says where). Optional Qt plugins whose system
    # libraries this build host lacks (Wayland, xcb GL integrations) are left to the lists below.
    DEPENDS="libc6"
    # Qt's X11 platform plugin and its helpers, opened at run time (dlopen), not NEEDED by the app.
    X11_DEPENDS="libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libxcb-image0, libxcb-render-util0, libxcb-randr0, libxcb-shape0, libxcb-xkb1, libxkbcommon-x11-0, libegl1, libfontconfig1, libdbus-1-3"
    RECOMMENDS="libwayland-client0, libwayland-cursor0, libwayland-egl1"
    if command -v dpkg-shlibdeps >/dev/null; then
        SHL=$BUILD/deb/shlibdeps
        rm -rf "$SHL" && mkdir -p "$SHL/debian"
        printf 'Source: ridgefill\n\nPackage: ridgefill\nArchitecture: any\n' > "$SHL/debian/control"
        mapfile -t elfs < <(find "$STAGE/opt" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c \
            'for f; do head -c4 "$f" | grep -q ELF && echo "$f"; done' _ {} +)
        mapfile -t libdirs < <(printf '%s\n' "${elfs[@]}" | xargs -n1 dirname | sort -u)
        libpath=$(IFS=:; echo "${libdirs[*]}")
        resolved=()
        : > "$SHL/skipped.txt"
        for f in "${elfs[@]}"; do
            if [[ $(LD_LIBRARY_PATH=$libpath ldd "$f" 2>/dev/null) == *"not found"* ]]; then
                echo "$f" >> "$SHL/skipped.txt"
            else
                resolved+=("$f")
            fi
        done
        args=()
        for d in "${libdirs[@]}"; do args+=("-l$d"); done
        if out=$(cd "$SHL" && dpkg-shlibdeps -O --ignore-missing-info --warnings=0 "${args[@]}" \
                 -e "${resolved[@]}" 2>"$SHL/stderr.txt"); then
            DEPENDS=$(echo "$out" | sed -n 's/^shlibs:Depends=//p')
        else
            echo "dpkg-shlibdeps failed (see $SHL/stderr.txt); Depends: $DEPENDS" >&2
        fi
        echo "dpkg-shlibdeps: ${#resolved[@]} files analysed, $(wc -l < "$SHL/skipped.txt") skipped (see $SHL/skipped.txt)"
    fi
    DEPENDS=${DEPENDS:-libc6}
    for dep in ${X11_DEPENDS//,/ }; do  # add those dpkg-shlibdeps did not already name
        [[ ", $DEPENDS," == *", $dep "* || ", $DEPENDS," == *", $dep,"* ]] || DEPENDS="$DEPENDS, $dep"
    done
    SIZE_KB=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
    sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$DEBARCH/" -e "s/@SIZE_KB@/$SIZE_KB/" \
        -e "s/@DEPENDS@/$DEPENDS/" -e "s/@RECOMMENDS@/$RECOMMENDS/" packaging/linux/control.in > "$STAGE/DEBIAN/control"
    DEB=$DIST/ridgefill_${VERSION}_$DEBARCH.deb
    # gzip: xz over ~1 GB of libraries takes many minutes on a small machine for little gain.
    dpkg-deb --root-owner-group -Zgzip -z6 --build "$STAGE" "$DEB" >/dev/null
    dpkg-deb --field "$DEB" Package Version Architecture Installed-Size Depends Recommends
fi
t_deb=$(( $(date +%s) - t0 ))

echo "== sizes and times"
printf '  %-34s %s\n' "one folder ($APPDIR)" "$(du -sh "$APPDIR" | cut -f1)"
printf '  %-34s %s\n' "$(basename "$TARBALL")" "$(du -h "$TARBALL" | cut -f1)"
[ -n "$DEB" ] && printf '  %-34s %s\n' "$(basename "$DEB")" "$(du -h "$DEB" | cut -f1)"
printf '  %-34s %ss (PyInstaller %ss, tar.gz %ss, deb %ss)\n' "build time" \
    "$(( $(date +%s) - t_start ))" "$t_pyi" "$t_tar" "$t_deb"
