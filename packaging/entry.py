"""Entry script of the bundled app: the GUI with no arguments, the CLI with a command, `--selftest`."""
import multiprocessing
import sys

if __name__ == "__main__":
    # The GUI's engine runs in a child process started with "spawn": a frozen program must call
    # freeze_support() first so that the child runs the engine instead of a second app.
    multiprocessing.freeze_support()
    from app.__main__ import main

    sys.exit(main())
