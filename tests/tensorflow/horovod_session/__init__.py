"""A Horovod user's TensorFlow and Keras pytest session, run inside every rank (`session.py`)."""
