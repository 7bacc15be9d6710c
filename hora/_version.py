"""hora's version, at the bottom of the house: the package, `hora --version` and the Spark
engine's check of its executors all report this one."""

__version__ = "0.1.0"
