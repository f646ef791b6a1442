"""PySide6.QtGui as PyInstaller's own hook collects it, less Qt's GTK 3 theme plugin.

That plugin links GTK 3, so the bundle would carry GTK, ATK, cairo, pango and gdk-pixbuf copies and
the .deb would depend on them; Qt's own style looks the same for this app. Filtering here, before
the binary dependency analysis, keeps its libraries out too.
"""
from PyInstaller.utils.hooks.qt import add_qt6_dependencies

hiddenimports, binaries, datas = add_qt6_dependencies(__file__)
binaries = [(src, dest) for src, dest in binaries if "libqgtk3" not in src]
