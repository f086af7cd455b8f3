"""``python -m bench.loadgen <scenario> …``: the same as ``python -m bench run``."""

from bench.cli import run_main

if __name__ == "__main__":
    run_main()
