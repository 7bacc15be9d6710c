"""`python -m hora run -np N script.py`."""

import sys

from hora.cli import main

if __name__ == "__main__":  # importing it (the layout test does) runs nothing
    sys.exit(main())
