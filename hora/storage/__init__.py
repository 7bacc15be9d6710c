"""Where hora keeps files: one face, `Location`, for a local path, a `file:` URI or a pyarrow URI.

It parses and refuses places with one set of words, lists, reads, removes, and writes every
file through one atomic writer (temp file, fsync, rename, fsync of the directory on a local
disk). Checkpoints, elastic commits, the estimator's store and the data door use it.
"""

from hora.storage._atomic import TEMP_SUFFIX as TEMP_SUFFIX
from hora.storage._atomic import is_temp as is_temp
from hora.storage._atomic import temp_name as temp_name
from hora.storage._location import Location as Location
from hora.storage._location import NotWritableError as NotWritableError

__all__ = ["TEMP_SUFFIX", "Location", "NotWritableError", "is_temp", "temp_name"]
