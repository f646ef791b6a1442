"""PySide6 widgets and view-models. The engine is reached through app.engine_client; slow disk and hub work runs through ui.background."""
