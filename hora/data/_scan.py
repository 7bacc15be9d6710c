"""Whether a DataFrame is a plain scan of Parquet files: its rows are exactly the rows of its
input files, its columns some of the files' columns (perhaps renamed). Then `from_spark` reads
those files in place instead of writing a copy.

Classic sessions: the optimized logical plan (`queryExecution().optimizedPlan()`, no job) must
be a LogicalRelation over a HadoopFsRelation in Parquet, under at most one Project of attribute
references or aliases of them. The optimizer has already folded what changes nothing (a
`select("*")`, projects over projects, a filter that is always true); anything left (a Filter,
a Join, a cast, a UDF, a limit, a cached relation) computes rows or values: not plain.

Connect sessions: the client holds its plan unresolved (`df._plan`); a DataSource in format
"parquet" with paths (no user schema, no predicates), or a named table whose provider the
catalog says is parquet, under Projects of column references, aliases of them and `*`,
`withColumnsRenamed` and `alias`. The names are resolved against the source's columns as the
server reports them, and the result must match `df.columns` exactly.

Either way a column used must not be a partition column (those are not in the files), and the
relation's options must be ones that only choose files. Where the plan cannot be read (a node
or an expression this code does not know, an error), the answer is "not plain": the caller
writes the DataFrame as before, never guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: relation options that only choose which files are read (or how the schema is merged, which
#: the footers are checked against); any other option may change values: not a plain scan
_FILE_OPTIONS = frozenset(
    {"path", "paths", "mergeschema", "pathglobfilter", "recursivefilelookup", "modifiedbefore"}
    | {"modifiedafter"}
)
_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
_FILES = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"
_PARQUET = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"


@dataclass(frozen=True)
class Scan:
    """A plain scan: its input files (as Spark names them, absolute URIs) and, in the
    DataFrame's order, (DataFrame column, file column) for each of its columns."""

    files: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]


def plain_scan(df: Any) -> Scan | str:
    """The DataFrame as a plain scan of Parquet files, or why it is not one (or cannot be told)."""
    try:
        if hasattr(df, "_jdf"):
            found = _classic(df)
        elif hasattr(df, "_plan"):
            found = _connect(df)
        else:
            return f"{type(df).__name__} is not a Spark DataFrame this code reads plans of"
        if isinstance(found, str):
            return found
        columns, partitions = found
        if [name for name, _ in columns] != list(df.columns):
            return f"its columns {list(df.columns)} are not the plan's {[n for n, _ in columns]}"
        if len({name for name, _ in columns}) != len(columns):
            return "it has two columns of one name"
        sources = [source for _, source in columns]
        used = sorted(set(sources) & partitions)
        if used:
            return f"it uses partition columns {used}, which are not in the files"
        files = tuple(sorted(str(f) for f in df.inputFiles()))
    except Exception as e:  # a plan this code does not know how to read: never guess
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return f"its plan could not be read ({type(e).__name__}: {first})"
    if not files:
        return "it has no input files"
    named = partition_like(files, sources)
    if named:
        return f"columns {named} name directories of its files (partition columns, maybe)"
    return Scan(files, tuple(columns))


Found = tuple[list[tuple[str, str]], set[str]]


def _classic(df: Any) -> Found | str:
    plan = df._jdf.queryExecution().optimizedPlan()
    projected = None
    if plan.nodeName() == "Project":
        projected = _seq(plan.projectList())
        plan = plan.child()
    partitions = _classic_relation(plan)
    if isinstance(partitions, str):
        return partitions
    output = {a.exprId().id(): a.name() for a in _seq(plan.output())}
    if projected is None:
        return [(name, name) for name in output.values()], partitions
    columns = []
    for expression in projected:
        kind = expression.getClass().getSimpleName()
        source = expression.child() if kind == "Alias" else expression
        if source.getClass().getSimpleName() != "AttributeReference":
            return f"column {expression.name()!r} is computed ({expression.sql()})"
        if source.exprId().id() not in output:
            return f"column {expression.name()!r} is not one of the files' columns"
        columns.append((expression.name(), output[source.exprId().id()]))
    return columns, partitions


def _classic_relation(plan: Any) -> set[str] | str:
    """The relation's partition columns when it is Parquet files read plainly; else why not."""
    if plan.getClass().getName() != _RELATION:
        if plan.children().size():
            return f"its plan computes rows ({plan.nodeName()})"
        if plan.nodeName() == "InMemoryRelation":
            return "it reads a DataFrame cached in Spark (InMemoryRelation), not files"
        return f"it reads {plan.nodeName()}, not a relation of files"
    relation = plan.relation()
    if relation.getClass().getName() != _FILES:
        return f"it reads {relation.getClass().getSimpleName()}, not files"
    file_format = relation.fileFormat().getClass().getName()
    if file_format != _PARQUET:
        kind = file_format.rsplit(".", 1)[-1]
        if "delta" in file_format.lower():
            return f"it reads a Delta table ({kind}): hora.data.from_delta reads one without Spark"
        return f"it reads {kind} files, not plain Parquet"
    options = _options(relation.options())
    if options:
        return f"it reads with options {options} that may change values"
    return set(relation.partitionSchema().fieldNames())


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _options(options: Any) -> list[str]:
    """The relation's options that are not only about choosing files (a Scala map)."""
    keys = _seq(options.keys().toSeq())
    return sorted(str(k) for k in keys if str(k).lower() not in _FILE_OPTIONS)


def _connect(df: Any) -> Found | str:
    from pyspark.sql.connect.dataframe import DataFrame

    chain = []
    plan = df._plan
    while plan is not None:
        chain.append(plan)
        plan = getattr(plan, "_child", None)
    source = chain.pop()
    kind = type(source).__name__
    if kind == "DataSource":
        partitions = _connect_source(source)
    elif kind == "Read":
        partitions = _connect_table(df.sparkSession, source)
    else:
        return f"its plan starts with {kind}, not a read of files"
    if isinstance(partitions, str):
        return partitions
    columns = [(name, name) for name in DataFrame(source, df.sparkSession).columns]
    for node in reversed(chain):
        step = _connect_step(node, columns)
        if isinstance(step, str):
            return step
        columns = step
    return columns, partitions


def _connect_source(source: Any) -> set[str] | str:
    """No partition columns known (partition_like checks the paths), or why not plain."""
    if (source._format or "").lower() != "parquet":
        return f"it reads format {source._format!r}, not parquet"
    if source._schema or source._predicates or source._is_streaming:
        return "it reads with a schema, predicates or as a stream"
    options = sorted(k for k in (source._options or {}) if k.lower() not in _FILE_OPTIONS)
    if options:
        return f"it reads with options {options} that may change values"
    if not source._paths:
        return "it reads no paths"
    return set()


def _connect_table(session: Any, read: Any) -> set[str] | str:
    """A named table's partition columns when the catalog says it is a Parquet table."""
    if read.options or read._is_streaming:
        return "it reads a table with options or as a stream"
    rows = [
        (str(r[0] or "").strip(), str(r[1] or "").strip())
        for r in session.sql(f"DESCRIBE TABLE EXTENDED {read.table_name}").collect()
    ]
    provider = dict(rows).get("Provider", "").lower()
    if provider != "parquet":
        return f"table {read.table_name} is not a Parquet table (provider {provider or 'none'!r})"
    partitions: set[str] = set()
    names = [name for name, _ in rows]
    if "# Partition Information" in names:
        for name in names[names.index("# Partition Information") + 1 :]:
            if not name or (name.startswith("# ") and name != "# col_name"):
                break
            if name != "# col_name":
                partitions.add(name)
    return partitions


def _connect_step(node: Any, columns: list[tuple[str, str]]) -> list[tuple[str, str]] | str:
    """The columns after one Connect plan node, or why it is not a plain projection."""
    kind = type(node).__name__
    if kind == "SubqueryAlias":
        return columns
    if kind == "WithColumnsRenamed":
        renames = dict(node._colsMap)
        return [(renames.get(name, name), source) for name, source in columns]
    if kind != "Project":
        return f"its plan computes rows ({kind})"
    by_name = dict(columns)
    out: list[tuple[str, str]] = []
    for column in node._columns:
        expression = column._expr
        what = type(expression).__name__
        if what == "UnresolvedStar" and expression._unparsed_target is None:
            out += columns
            continue
        name = None
        if what == "ColumnAlias" and len(expression._alias) == 1 and not expression._metadata:
            name, expression = expression._alias[0], expression._child
            what = type(expression).__name__
        if what != "ColumnReference" or expression._is_metadata_column:
            return f"a column is computed ({column._expr})"
        reference = _identifier(expression._unparsed_identifier)
        if reference not in by_name:
            return f"column {expression._unparsed_identifier!r} is not one of the files' columns"
        out.append((name or reference, by_name[reference]))
    return out


def _identifier(text: str) -> str | None:
    """A one-part column name (`a`, or a backquoted `a.b`); None for a nested or qualified one."""
    if len(text) > 1 and text.startswith("`") and text.endswith("`"):
        inner = text[1:-1]
        return None if "`" in inner.replace("``", "") else inner.replace("``", "`")
    return None if "." in text or "`" in text else text


def partition_like(files: Sequence[str], columns: Sequence[str]) -> list[str]:
    """Used columns named like a `name=value` directory of some file's path: Spark may take
    their values from the path (partition discovery), not from the file."""
    names = {c.lower() for c in columns}
    found = set()
    for f in files:
        for part in f.split("/")[:-1]:
            key = part.split("=", 1)[0].lower() if "=" in part else None
            if key in names:
                found.add(key)
    return sorted(found)
