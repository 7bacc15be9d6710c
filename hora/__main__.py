"""`python -m hora run -np N script.py`."""

import sys

from hora.cli import main

sys.exit(main())
