"""``python -m vigil.bench.pipeline``: see :mod:`vigil.bench.pipeline.cli`."""

from vigil.bench.pipeline.cli import main

if __name__ == "__main__":
    main()
