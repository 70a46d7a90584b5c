"""``python -m vigil.cli``."""

from vigil.cli import main

if __name__ == "__main__":
    main()
