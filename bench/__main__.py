"""``python -m bench run|compare|list …``: see ``bench.cli``."""

from bench.cli import main

if __name__ == "__main__":
    main()
