"""PySide6 widgets and view-models. Everything here reaches the backend through app.engine_service."""
