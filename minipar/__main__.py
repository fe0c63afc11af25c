"""``python -m minipar ...``: the command line, ``minipar/cli/``."""
from minipar.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
