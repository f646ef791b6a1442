"""`python -m app` opens the GUI; `python -m app <command>` runs a headless command."""
import sys


def main(argv: list[str] | None = None) -> int:
    import os

    from app.cli import run_cli

    os.umask(0o077)  # what a library writes under the user folders (downloads, maps, locks) is private too

    return run_cli(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
