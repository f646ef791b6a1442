"""`python -m app` opens the GUI; `python -m app <command>` runs a headless command."""
import sys


def main(argv: list[str] | None = None) -> int:
    from app.cli import run_cli

    return run_cli(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
