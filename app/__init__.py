"""Entry points and wiring: the GUI, the headless CLI, settings, user paths, logging."""
