"""A Horovod user's pytest session, run inside every rank (see `session.py`)."""
