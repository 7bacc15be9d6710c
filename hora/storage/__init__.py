"""Where hora keeps files: one parser of places (path, `file:` URI, pyarrow URI), one set of
refusals, one pyarrow wrapper. Checkpoints, the estimator's store and the data door use it."""

from hora.storage._directory import ArrowDirectory as ArrowDirectory
from hora.storage._directory import Directory as Directory
from hora.storage._directory import LocalDirectory as LocalDirectory
from hora.storage._directory import open_directory as open_directory
from hora.storage._location import TEMP_SUFFIX as TEMP_SUFFIX
from hora.storage._location import Location as Location
from hora.storage._location import is_temp as is_temp
from hora.storage._location import move_into_place as move_into_place
from hora.storage._location import temp_name as temp_name

__all__ = [
    "TEMP_SUFFIX",
    "ArrowDirectory",
    "Directory",
    "LocalDirectory",
    "Location",
    "is_temp",
    "move_into_place",
    "open_directory",
    "temp_name",
]
