"""The app's user folders (data, cache, logs, config).

Defined once, in backend/user_paths.py (platformdirs and the RIDGEFILL_* variables), because the backend
needs the cache and never imports `app`; the app and the UI import them from here.
"""
from backend.user_paths import cache_dir, config_dir, data_dir, log_dir

__all__ = ["cache_dir", "config_dir", "data_dir", "log_dir"]
