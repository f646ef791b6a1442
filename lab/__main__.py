"""`python -m lab COMMAND`: the lab's commands, run from a checkout (lab/cli.py)."""
import sys


def main(argv: list[str] | None = None) -> int:
    import os

    from lab.cli import run_cli

    os.umask(0o077)  # as the app: what a run writes under the user folders is private

    return run_cli(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
