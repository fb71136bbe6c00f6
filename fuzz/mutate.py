"""Seeded mutations of real runs, for the fuzz test (tests/test_fuzz.py) and the long fuzz run
(fuzz/run.py).

Every case is a pure function of ``(seed, index)``: :func:`make_case` picks a category and a
mutation with ``random.Random(f"{seed}:{index}")`` and returns the whole mutated run folder as
bytes, so a failing case is reproduced from its replay id alone.

The inputs are the project's own real captures: the four rank files of sample_traces/1f1b
(Kineto) and sample_traces/nsys_1f1b (an Nsight Systems SQLite export). Nothing here writes
to them; :func:`write_case` writes a case into a folder of the caller's choosing.

Each case says what its answer may do (:attr:`Case.expect`):

- ``same``: the mutation must not change the answer (reordered events, pretty-printed JSON,
  another gzip framing, unknown fields, a stray non-trace file, another file name);
- ``flagged``: the input is detectably wrong (a null timestamp, a lost rank file); an answer
  that differs from the unmutated run's must carry a warning the unmutated run lacks;
- ``any``: valid but different data (deleted events, a changed name): only crashes, hangs,
  multi-line errors and raw control characters count.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
KINETO_RUN = SAMPLES / "1f1b"
NSYS_RUN = SAMPLES / "nsys_1f1b"
NSYS_REPORT = "nsys_report.sqlite"

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# Values that are the wrong type or out of range for nearly every field of a trace. Strings
# are JSON tokens written verbatim into the document (NaN and Infinity are not JSON, but
# Python's json writes them and some readers accept them).
BAD_JSON_VALUES = (
    "null",
    "true",
    "false",
    "0",
    "-1",
    '"2"',
    '"text"',
    '""',
    "[]",
    '["x"]',
    "{}",
    '{"a": 1}',
    str(2**64),
    str(INT64_MIN),
    str(INT64_MAX),
    "1e30",
    "-1e30",
    "1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "-0.0",
    "0.5",
    '"\\ud800"',
)
# Strings that must never reach a terminal, a JUnit file or a Markdown file raw.
HOSTILE_STRINGS = (
    "\x1b[31mred\x1b[0m",
    "\x1b]0;pwned\x07",
    "\x1b[2J\x1b[H",
    "bell\x07",
    "csi\x9b31m",
    "nul\x00byte",
    "`rm -rf ~`",
    "| a | b |",
    "<script>alert(1)</script>",
    "]]><x/>",
    "&amp;&lt;",
    "cr\roverwrite",
    "two\nlines",
    "tab\there",
    "del\x7f",
    "bidi\u202eevil",
    "lone\ud800surrogate",
    "x" * 5000,
    "*bold* _it_ [link](http://x)",
    "<!-- -->",
    "\u0085nel",
    "${HOME}$(id)",
)
# The same, for file names (no NUL or slash on a filesystem; no lone surrogate in a path).
HOSTILE_FILE_PARTS = ("\x1b[31m", "\x07", "\x9b2J", "`x`", "|", "<b>", "\r", "\n", "\u202e", " ")
DEEP_LEVELS = (1_000, 100_000)
STRAY_NON_TRACE = {
    "train.log": b"step 1 loss 2.7\n",
    "notes.txt": b"run on vm\n",
    "loss.csv": b"step,loss\n1,2.7\n",
    ".DS_Store": bytes(range(256)),
    "events.out.tfevents.1": b"\x00\x01junk",
}


@dataclass(frozen=True)
class Case:
    """One fuzz case: a run folder (file name -> content) and how its answer may differ."""

    seed: int
    index: int
    category: str
    detail: str  # what was done, one line
    base: str  # "kineto" or "nsys": the unmutated run this one is compared to
    files: dict[str, bytes | None]  # None: a folder of that name
    expect: str  # "same", "flagged" or "any" (see the module docstring)
    target: str | None = None  # the file the mutation touched: an error should name it
    options: tuple[str, ...] = ()  # extra command-line options
    names: tuple[str, ...] = ()  # other strings that identify the culprit
    folder_suffix: str = ""  # ends the run folder's name (a hostile folder name reaches every output)
    replay_id: str = ""  # what fuzz/run.py --replay takes: SEED:INDEX, or SEED:INDEX:CATEGORY when forced


def write_case(case: Case, folder: Path) -> Path:
    """Write the case's run folder (created; must not exist) and return it."""
    folder.mkdir(parents=True)
    for name, content in case.files.items():
        if content is None:
            (folder / name).mkdir()
        else:
            (folder / name).write_bytes(content)
    return folder


# -- the unmutated inputs (read once per process) ---------------------------------------------


@functools.lru_cache(maxsize=None)
def kineto_files() -> dict[str, bytes]:
    """The 1f1b run as it is on disk."""
    return {p.name: p.read_bytes() for p in sorted(KINETO_RUN.iterdir()) if p.is_file()}


@functools.lru_cache(maxsize=None)
def kineto_documents() -> dict[str, dict]:
    """Each rank file of the 1f1b run, decoded (treat as read-only: mutators copy what they touch)."""
    return {
        name: json.loads(gzip.decompress(data)) for name, data in kineto_files().items() if name.endswith(".json.gz")
    }


@functools.lru_cache(maxsize=None)
def nsys_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(NSYS_RUN.iterdir()) if p.is_file()}


@functools.lru_cache(maxsize=None)
def nsys_columns() -> dict[str, list[str]]:
    """Each table of the nsys report that has rows, and its columns."""
    db = _open_sqlite(nsys_files()[NSYS_REPORT])
    tables = {}
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        if db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]:
            tables[table] = [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]
    db.close()
    return tables


def _open_sqlite(data: bytes) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.deserialize(data)
    return db


# -- encoding a mutated Kineto document -------------------------------------------------------


def _encode(doc: dict, raw: dict[str, str] | None = None, indent: int | None = None) -> bytes:
    """JSON bytes of ``doc``; each string value equal to a key of ``raw`` is replaced by that
    key's text verbatim (how tokens json.dumps cannot write, such as 100,000-deep nesting or
    1e400, get into a document)."""
    text = json.dumps(doc, indent=indent)
    for placeholder, token in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), token)
    return text.encode("utf-8", "surrogatepass")


def _gzip(data: bytes, level: int = 1) -> bytes:
    return gzip.compress(data, compresslevel=level, mtime=0)


def _shallow(doc: dict) -> dict:
    """A copy of a rank document whose header and event list may be changed freely (the
    events themselves are shared: copy one before changing it)."""
    out = dict(doc)
    out["traceEvents"] = list(doc["traceEvents"])
    if isinstance(doc.get("distributedInfo"), dict):
        out["distributedInfo"] = json.loads(json.dumps(doc["distributedInfo"]))
    return out


def _kineto_case(
    rng: random.Random, category: str, detail: str, expect: str, victim: str, content: bytes, **extra
) -> dict:
    files = dict(kineto_files())
    files[victim] = content
    return dict(category=category, detail=detail, base="kineto", files=files, expect=expect, target=victim, **extra)


def _pick_rank_file(rng: random.Random) -> str:
    return rng.choice(sorted(kineto_documents()))


def _event_indices(doc: dict, rng: random.Random, ph: str | None = None) -> int:
    events = doc["traceEvents"]
    while True:
        i = rng.randrange(len(events))
        if ph is None or events[i].get("ph") == ph:
            return i


def _token(rng: random.Random) -> str:
    return rng.choice(BAD_JSON_VALUES)


# -- (a) Kineto structure ---------------------------------------------------------------------

HEADER_PATHS = (
    ("traceEvents",),
    ("distributedInfo",),
    ("distributedInfo", "rank"),
    ("distributedInfo", "world_size"),
    ("distributedInfo", "backend"),
    ("distributedInfo", "pg_config"),
    ("distributedInfo", "pg_count"),
    ("baseTimeNanoseconds",),
    ("schemaVersion",),
    ("displayTimeUnit",),
    ("host_name",),
    ("record_shapes",),
    ("deviceProperties",),
    ("traceName",),
    ("trace_id",),
)
EVENT_KEYS = ("ts", "dur", "ph", "name", "pid", "tid", "cat", "args", "id")
ARG_KEYS = ("Concrete Inputs", "Input Dims", "Input type", "Sequence number", "External id", "Fwd thread id")


def kineto_header(rng: random.Random) -> dict:
    """Delete or retype one header value (traceEvents null, world_size "2", pg_config ["x"], ...)."""
    victim = _pick_rank_file(rng)
    doc = _shallow(kineto_documents()[victim])
    path = rng.choice(HEADER_PATHS)
    holder = doc
    for key in path[:-1]:
        holder = holder[key]
    if rng.random() < 0.2:
        holder.pop(path[-1], None)
        detail = f"{victim}: deleted header {'.'.join(path)}"
        expect = "any" if path[-1] in ("traceName", "trace_id", "deviceProperties", "schemaVersion") else "flagged"
        return _kineto_case(rng, "kineto-header", detail, expect, victim, _gzip(_encode(doc)))
    token = _token(rng)
    holder[path[-1]] = "__FUZZ_TOKEN__"
    detail = f"{victim}: header {'.'.join(path)} = {token}"
    return _kineto_case(rng, "kineto-header", detail, "flagged", victim, _gzip(_encode(doc, {"__FUZZ_TOKEN__": token})))


def kineto_event(rng: random.Random) -> dict:
    """Delete or retype one field of one to a few events (ts -Infinity, tid a list, ...)."""
    victim = _pick_rank_file(rng)
    doc = _shallow(kineto_documents()[victim])
    events = doc["traceEvents"]
    key = rng.choice(EVENT_KEYS + ("args",))
    token = _token(rng)
    n = rng.choice((1, 1, 1, 3, 50))
    touched = []
    for _ in range(n):
        i = _event_indices(doc, rng, ph=rng.choice(("X", "X", "X", None)))
        event = json.loads(json.dumps(events[i]))
        if key == "args" and isinstance(event.get("args"), dict) and rng.random() < 0.6:
            arg = rng.choice(ARG_KEYS)
            event["args"][arg] = "__FUZZ_TOKEN__"
            where = f"args[{arg!r}]"
        elif rng.random() < 0.15:
            event.pop(key, None)
            where = f"deleted {key}"
        else:
            event[key] = "__FUZZ_TOKEN__"
            where = key
        events[i] = event
        touched.append(i)
    detail = f"{victim}: {n} event(s) (first #{touched[0]}) {where} = {token}"
    return _kineto_case(
        rng,
        "kineto-event",
        detail,
        _event_expectation(key, where, token),
        victim,
        _gzip(_encode(doc, {"__FUZZ_TOKEN__": token})),
    )


def _event_expectation(key: str, where: str, token: str) -> str:
    """A category, name, process, thread or argument that is still a plausible value (any
    string, an int64, or absent) makes another trace, not a damaged one: its answer may
    differ without a warning. Times, and values of no plausible type, are damage."""
    if key not in ("cat", "name", "pid", "tid", "args"):
        return "flagged"
    if where.startswith("deleted"):
        return "any"
    try:
        value = json.loads(token)
    except ValueError:
        return "flagged"
    plausible = isinstance(value, str) or (type(value) is int and INT64_MIN <= value <= INT64_MAX)
    return "any" if plausible else "flagged"


def kineto_events(rng: random.Random) -> dict:
    """Whole events: duplicated, deleted, truncated list, ts/dur sign swapped, unknown ph,
    int64-min ts among float ts."""
    victim = _pick_rank_file(rng)
    doc = _shallow(kineto_documents()[victim])
    events = doc["traceEvents"]
    how = rng.choice(("duplicate", "delete", "truncate", "negate", "unknown-ph", "int-ts", "empty", "swap-ts-dur"))
    expect = "any"
    if how == "duplicate":
        i = _event_indices(doc, rng)
        events[i:i] = [events[i]] * rng.choice((1, 2, 100))
    elif how == "delete":
        for _ in range(rng.choice((1, 10, 500))):
            del events[rng.randrange(len(events))]
    elif how == "truncate":
        del events[rng.randrange(len(events)) :]
    elif how == "negate":
        for _ in range(rng.choice((1, 5))):
            i = _event_indices(doc, rng, ph="X")
            event = dict(events[i])
            key = rng.choice(("ts", "dur"))
            event[key] = -event[key]
            events[i] = event
        expect = "flagged"
    elif how == "swap-ts-dur":
        i = _event_indices(doc, rng, ph="X")
        event = dict(events[i])
        event["ts"], event["dur"] = event["dur"], event["ts"]
        events[i] = event
    elif how == "unknown-ph":
        i = _event_indices(doc, rng, ph="X")
        events[i] = dict(events[i], ph=rng.choice(("Z", "", "XX", "x", "\x1b")))
    elif how == "int-ts":
        i = _event_indices(doc, rng, ph="X")
        events[i] = dict(events[i], ts=rng.choice((INT64_MIN, INT64_MAX, 0, -1, 2**53 + 1)))
        expect = "flagged"
    elif how == "empty":
        events.clear()
        expect = "flagged"
    detail = f"{victim}: events {how}"
    return _kineto_case(rng, "kineto-events", detail, expect, victim, _gzip(_encode(doc)))


def kineto_strings(rng: random.Random) -> dict:
    """A hostile string in a name, a host name, a label, a metadata value or a file name."""
    hostile = rng.choice(HOSTILE_STRINGS)
    where = rng.choice(
        (
            "host_name",
            "backend",
            "pg_desc",
            "event name",
            "PP label",
            "thread name",
            "process name",
            "traceName",
            "arg",
            "file name",
            "folder name",
        )
    )
    victim = _pick_rank_file(rng)
    if where == "folder name":
        part = rng.choice(HOSTILE_FILE_PARTS)
        return dict(
            category="kineto-strings",
            detail=f"run folder name ends {part!r}",
            base="kineto",
            files=dict(kineto_files()),
            expect="same",
            folder_suffix=part,
        )
    if where == "file name":
        part = rng.choice(HOSTILE_FILE_PARTS)
        rank = victim.split(".")[0]
        new_name = f"{rank}{part}.json.gz" if rng.random() < 0.5 else f"{part}{rank}.json.gz"
        files = dict(kineto_files())
        files[new_name] = files.pop(victim)
        return dict(
            category="kineto-strings",
            detail=f"{victim} renamed {new_name!r}",
            base="kineto",
            files=files,
            expect="same",
            target=new_name,
            names=(ascii(new_name)[1:-1],),
        )
    doc = _shallow(kineto_documents()[victim])
    events = doc["traceEvents"]
    expect = "any"
    if where in ("host_name", "traceName"):
        doc[where] = hostile
    elif where in ("backend", "pg_desc"):
        info = doc["distributedInfo"]
        if where == "backend":
            info["backend"] = hostile
        else:
            info["pg_config"][0]["pg_desc"] = hostile
    elif where in ("thread name", "process name"):
        meta = [i for i, e in enumerate(events) if e.get("ph") == "M"]
        i = rng.choice(meta)
        events[i] = dict(events[i], args={"name": hostile})
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": events[i]["pid"],
                "tid": events[i]["pid"],
                "args": {"name": hostile},
            }
        )
    elif where == "arg":
        i = _event_indices(doc, rng, ph="X")
        events[i] = dict(events[i], args=dict(events[i].get("args", {}), **{"Concrete Inputs": [hostile] * 4}))
    else:
        for _ in range(rng.choice((1, 5))):
            i = _event_indices(doc, rng, ph="X")
            name = hostile if where == "event name" else f"PP:0F{rng.randrange(8)}{hostile}"
            events[i] = dict(events[i], name=name)
    detail = f"{victim}: {where} = {hostile[:40]!r}"
    return _kineto_case(rng, "kineto-strings", detail, expect, victim, _gzip(_encode(doc)))


def kineto_deep(rng: random.Random) -> dict:
    """Deeply nested arrays or objects in the header or in an event."""
    victim = _pick_rank_file(rng)
    doc = _shallow(kineto_documents()[victim])
    depth = rng.choice(DEEP_LEVELS)
    opener, closer = rng.choice((("[", "]"), ('{"a":', "}")))
    deep = opener * depth + "1" + closer * depth
    where = rng.choice(("first header key", "distributedInfo", "extra header key", "event args"))
    if where == "first header key":
        doc = {"fuzz_deep": "__FUZZ_DEEP__", **doc}
    elif where == "distributedInfo":
        doc["distributedInfo"] = "__FUZZ_DEEP__"
    elif where == "extra header key":
        doc["fuzz_deep"] = "__FUZZ_DEEP__"
    else:
        i = _event_indices(doc, rng, ph="X")
        doc["traceEvents"][i] = dict(doc["traceEvents"][i], args={"deep": "__FUZZ_DEEP__"})
    detail = f"{victim}: {depth}-deep {opener} in {where}"
    return _kineto_case(rng, "kineto-deep", detail, "flagged", victim, _gzip(_encode(doc, {"__FUZZ_DEEP__": deep})))


def kineto_same(rng: random.Random) -> dict:
    """Changes that must leave the answer as it was."""
    victim = _pick_rank_file(rng)
    doc = _shallow(kineto_documents()[victim])
    events = doc["traceEvents"]
    how = rng.choice(
        (
            "shuffle events",
            "reverse events",
            "pretty-print",
            "header order",
            "gzip level 9",
            "gzip multi-member",
            "gzip with name",
            "plain json",
            "unknown fields",
            "unknown metadata",
            "unknown ph",
            "torch file name",
        )
    )
    name = victim
    if how == "shuffle events":
        rng.shuffle(events)
    elif how == "reverse events":
        events.reverse()
    elif how == "header order":
        doc = {"traceEvents": events, **{k: v for k, v in reversed(list(doc.items())) if k != "traceEvents"}}
    elif how == "unknown fields":
        doc["fuzz_extra"] = {"nested": [1, 2, {"x": None}], "note": "unknown header field"}
        for _ in range(100):
            i = rng.randrange(len(events))
            events[i] = dict(events[i], fuzz_field=rng.choice((None, 1, "x", [1], {"y": 2})))
    elif how == "unknown metadata":
        pid = events[0]["pid"]
        for k in range(rng.choice((1, 20))):
            events.insert(
                rng.randrange(len(events)),
                {"ph": "M", "name": f"fuzz_meta_{k}", "pid": pid, "tid": pid, "ts": events[0]["ts"], "args": {"v": k}},
            )
    elif how == "unknown ph":
        pid = events[0]["pid"]
        for k in range(rng.choice((1, 20))):
            events.insert(
                rng.randrange(len(events)),
                {
                    "ph": rng.choice(("C", "i", "n", "O", "R")),
                    "name": f"fuzz{k}",
                    "pid": pid,
                    "tid": pid,
                    "ts": events[0]["ts"],
                    "args": {"v": k},
                },
            )
    text = _encode(doc, indent=rng.choice((1, 2, "\t")) if how == "pretty-print" else None)
    if how == "gzip level 9":
        content = _gzip(text, 9)
    elif how == "gzip multi-member":
        cut = rng.randrange(1, len(text))
        content = _gzip(text[:cut]) + _gzip(text[cut:])
    elif how == "gzip with name":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="rank.json", mode="wb", fileobj=buf, mtime=1_700_000_000) as fh:
            fh.write(text)
        content = buf.getvalue()
    elif how == "plain json":
        content, name = text, victim.removesuffix(".gz")
    else:
        content = _gzip(text)
    if how == "torch file name":
        name = f"vm_{rng.randrange(10**5)}.{rng.randrange(10**9)}.pt.trace.json.gz"
    files = dict(kineto_files())
    del files[victim]
    files[name] = content
    return dict(
        category="kineto-same",
        detail=f"{victim}: {how}" + (f" as {name}" if name != victim else ""),
        base="kineto",
        files=files,
        expect="same",
        target=name,
    )


# -- (b) bytes --------------------------------------------------------------------------------

BYTE_INSERTS = (b"\x00", b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"]", b"}", b",", b'"', b"\\", b"\x1b[2J", b"\n" * 3)


def _damage(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "flip":
        out = bytearray(data)
        for _ in range(rng.choice((1, 2, 20))):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if how == "truncate":
        return data[: rng.choice((0, 1, 10, rng.randrange(len(data))))]
    if how == "insert":
        at = rng.randrange(len(data))
        return data[:at] + rng.choice(BYTE_INSERTS) + data[at:]
    if how == "splice":
        a = rng.randrange(len(data))
        return data[:a] + data[a + rng.randrange(1, 5000) :]
    if how == "repeat":
        a = rng.randrange(len(data))
        return data[:a] + data[a : a + rng.randrange(1, 5000)] * 2 + data[a:]
    raise ValueError(how)


def bytes_gzip(rng: random.Random) -> dict:
    """Bit flips, truncation, insertions in a .json.gz file's compressed bytes."""
    victim = _pick_rank_file(rng)
    how = rng.choice(("flip", "truncate", "insert", "splice", "repeat", "trailer"))
    data = kineto_files()[victim]
    if how == "trailer":  # the CRC/length trailer of the gzip member
        out = bytearray(data)
        out[-rng.randrange(1, 9)] ^= 0xFF
        damaged = bytes(out)
    else:
        damaged = _damage(data, how, rng)
    return _kineto_case(rng, "bytes-gzip", f"{victim}: gzip bytes {how}", "flagged", victim, damaged)


def bytes_json(rng: random.Random) -> dict:
    """The same in the JSON text (then gzipped again, or written plain)."""
    victim = _pick_rank_file(rng)
    how = rng.choice(("flip", "truncate", "insert", "splice", "repeat"))
    text = gzip.decompress(kineto_files()[victim])
    damaged = _damage(text, how, rng)
    plain = rng.random() < 0.3
    name = victim.removesuffix(".gz") if plain else victim
    files = dict(kineto_files())
    del files[victim]
    files[name] = damaged if plain else _gzip(damaged)
    # A flipped digit is a valid, different value: only truncation must be noticed.
    expect = "flagged" if how == "truncate" else "any"
    return dict(
        category="bytes-json",
        detail=f"{victim}: JSON bytes {how}" + (" (plain)" if plain else ""),
        base="kineto",
        files=files,
        expect=expect,
        target=name,
    )


# -- (c) Nsight Systems SQLite ----------------------------------------------------------------

NSYS_BAD_VALUES = (
    INT64_MAX,
    INT64_MIN,
    -1,
    0,
    2**53 + 1,
    1e30,
    float("nan"),
    "text",
    "",
    "12",
    None,
    b"\x00\xff",
    *HOSTILE_STRINGS[:8],
)


def _nsys_case(rng: random.Random, category: str, detail: str, expect: str, db: sqlite3.Connection) -> dict:
    db.commit()
    files = dict(nsys_files())
    files[NSYS_REPORT] = db.serialize()
    db.close()
    return dict(category=category, detail=detail, base="nsys", files=files, expect=expect, target=NSYS_REPORT)


def nsys_cells(rng: random.Random) -> dict:
    """UPDATE cells to INT64_MAX, negative, text in numeric columns, NULL, hostile text."""
    tables = nsys_columns()
    db = _open_sqlite(nsys_files()[NSYS_REPORT])
    while True:
        table = rng.choice(
            (
                "NVTX_EVENTS",
                "NVTX_EVENTS",
                "StringIds",
                "TARGET_INFO_SESSION_START_TIME",
                "EXPORT_META_DATA",
                rng.choice(sorted(tables)),
            )
        )
        column = rng.choice(tables[table])
        value = rng.choice(NSYS_BAD_VALUES)
        rows = rng.choice((1, 1, 5, "all"))
        rowids = [r for (r,) in db.execute(f'SELECT rowid FROM "{table}" ORDER BY rowid')]
        chosen = rowids if rows == "all" else rng.sample(rowids, min(rows, len(rowids)))
        try:
            db.executemany(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', [(value, r) for r in chosen])
            break
        except sqlite3.IntegrityError:  # an INTEGER PRIMARY KEY takes no text and no repeats: pick again
            db.rollback()
    detail = f"{table}.{column} = {value!r:.40} in {rows} row(s)"
    # Other text in a text column (a name, a label) is other data, not damage anyone can see.
    declared = {name: kind.upper() for _, name, kind, *_ in db.execute(f'PRAGMA table_info("{table}")')}
    # Text in a text column (SQLite stores an int there as text too) is another name; a
    # small integer where a time or id belongs (-1, 0: within a day of the capture) is
    # another plausible value. Neither is damage anyone can see.
    plausible = ("TEXT" in declared.get(column, "") and isinstance(value, (str, int))) or (
        type(value) is int and abs(value) < 24 * 3600 * 10**9
    )
    expect = "any" if plausible else "flagged"
    return _nsys_case(rng, "nsys-cells", detail, expect, db)


def nsys_schema(rng: random.Random) -> dict:
    """DROP a table or a column; rename a table."""
    tables = nsys_columns()
    table = rng.choice(
        ("NVTX_EVENTS", "StringIds", "TARGET_INFO_SESSION_START_TIME", "EXPORT_META_DATA", rng.choice(sorted(tables)))
    )
    db = _open_sqlite(nsys_files()[NSYS_REPORT])
    how = rng.choice(("drop table", "drop column", "rename table", "empty table"))
    # SQLite drops no key, unique or indexed column: those tables lose the whole table instead.
    droppable = [row[1] for row in db.execute(f'PRAGMA table_info("{table}")') if not row[5]]
    if how == "drop column" and len(droppable) > 1:
        column = rng.choice(droppable)
        try:
            db.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
            how = f"drop column {column}"
        except sqlite3.OperationalError:
            db.execute(f'DROP TABLE "{table}"')
            how = f"drop table (column {column} cannot be dropped)"
    elif how == "rename table":
        db.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_old"')
    elif how == "empty table":
        db.execute(f'DELETE FROM "{table}"')
    else:
        db.execute(f'DROP TABLE "{table}"')
        how = "drop table"
    return _nsys_case(rng, "nsys-schema", f"{table}: {how}", "flagged", db)


def nsys_same(rng: random.Random) -> dict:
    """An unknown table or column, or VACUUM: the answer must not change."""
    db = _open_sqlite(nsys_files()[NSYS_REPORT])
    how = rng.choice(("unknown table", "unknown column", "vacuum"))
    if how == "unknown table":
        db.execute("CREATE TABLE FUZZ_EXTRA (id INTEGER, value TEXT)")
        db.execute("INSERT INTO FUZZ_EXTRA VALUES (1, 'x')")
    elif how == "unknown column":
        db.execute('ALTER TABLE NVTX_EVENTS ADD COLUMN "fuzzExtra" INTEGER DEFAULT 7')
    else:
        db.commit()
        db.execute("VACUUM")
    return _nsys_case(rng, "nsys-same", how, "same", db)


def nsys_bytes(rng: random.Random) -> dict:
    """Bit flips or truncation in the SQLite file itself."""
    how = rng.choice(("flip", "truncate", "insert"))
    files = dict(nsys_files())
    files[NSYS_REPORT] = _damage(files[NSYS_REPORT], how, rng)
    return dict(
        category="nsys-bytes", detail=f"sqlite bytes {how}", base="nsys", files=files, expect="any", target=NSYS_REPORT
    )


# -- (d) the run folder -----------------------------------------------------------------------


def folder(rng: random.Random) -> dict:
    """A rank file missing, a rank twice, an empty or stray trace file, a folder where a file was."""
    files = dict(kineto_files())
    victim = _pick_rank_file(rng)
    how = rng.choice(
        (
            "remove rank",
            "remove rank",
            "duplicate rank",
            "zero-byte file",
            "stray json",
            "directory named like a trace",
            "only capture.json",
            "stray sqlite",
        )
    )
    target = victim
    if how == "remove rank":
        del files[victim]
        target = None
    elif how == "duplicate rank":
        target = f"rank{len(files) - 1}.json.gz"
        files[target] = files[victim]
    elif how == "zero-byte file":
        files[victim] = b""
    elif how == "stray json":
        target = rng.choice(("metrics.json", "config.json", "results.json"))
        files[target] = rng.choice((b'{"loss": 2.7}', b"[1, 2, 3]", b"null", b""))
    elif how == "stray sqlite":
        target = "other.sqlite"
        files[target] = b"SQLite format 3\x00" + bytes(100)
    elif how == "directory named like a trace":
        target = "rank9.json.gz"
        files[target] = None
    else:
        files = {"capture.json": files["capture.json"]}
        target = None
    return dict(
        category="folder",
        detail=f"{how} ({victim})" if how in ("remove rank", "duplicate rank", "zero-byte file") else how,
        base="kineto",
        files=files,
        expect="flagged",
        target=target,
    )


def folder_same(rng: random.Random) -> dict:
    """A stray non-trace file beside the traces: the answer must not change."""
    files = dict(kineto_files())
    name = rng.choice(sorted(STRAY_NON_TRACE))
    files[name] = STRAY_NON_TRACE[name]
    return dict(category="folder-same", detail=f"stray {name}", base="kineto", files=files, expect="same", target=name)


# -- (e) capture.json -------------------------------------------------------------------------

CAPTURE_KEYS = (
    "schedule",
    "p",
    "v",
    "m",
    "stage_to_rank",
    "steps",
    "placement",
    "files",
    "command",
    "torch_version",
    "compute",
    "faults",
    "n_stages",
)


def capture(rng: random.Random) -> dict:
    """capture.json with bad UTF-8, a bad number, a list, a string, a retyped or hostile value."""
    files = dict(kineto_files())
    original = files["capture.json"]
    how = rng.choice(
        (
            "bad utf-8",
            "bad number",
            "list",
            "string",
            "null",
            "truncate",
            "retype",
            "hostile",
            "delete key",
            "deep",
            "empty",
        )
    )
    if how == "bad utf-8":
        at = rng.randrange(len(original))
        files["capture.json"] = original[:at] + rng.choice((b"\xff", b"\xed\xa0\x80", b"\xc3")) + original[at:]
    elif how == "bad number":
        files["capture.json"] = original.replace(
            b'"p": 4', rng.choice((b'"p": 4e', b'"p": 1e999', b'"p": 04', b'"p": NaN', b'"p": 0x4'))
        )
    elif how == "list":
        files["capture.json"] = b"[" + original + b"]"
    elif how == "string":
        files["capture.json"] = json.dumps(original.decode()).encode()
    elif how == "null":
        files["capture.json"] = b"null"
    elif how == "truncate":
        files["capture.json"] = original[: rng.randrange(len(original))]
    elif how == "empty":
        files["capture.json"] = b""
    elif how == "deep":
        depth = rng.choice(DEEP_LEVELS)
        files["capture.json"] = b"[" * depth + b"]" * depth
    else:
        doc = json.loads(original)
        key = rng.choice(CAPTURE_KEYS)
        if how == "delete key":
            doc.pop(key, None)
            token = None
        elif how == "hostile":
            token = json.dumps(rng.choice(HOSTILE_STRINGS))
            doc[key] = "__FUZZ_TOKEN__"
        else:
            token = _token(rng)
            doc[key] = "__FUZZ_TOKEN__"
        files["capture.json"] = _encode(doc, {"__FUZZ_TOKEN__": token} if token else None)
        how = f"{how} {key}" + (f" = {token[:40]}" if token else "")
    return dict(
        category="capture",
        detail=f"capture.json: {how}",
        base="kineto",
        files=files,
        expect="flagged",
        target="capture.json",
    )


# -- command-line options ---------------------------------------------------------------------

BAD_OPTIONS = (
    ("--rank-from", "("),
    ("--rank-from", "(a)(b)"),
    ("--rank-from", ""),
    ("--rank-from", "rank"),
    ("--rank-from", r"rank(\d+)"),
    ("--rank-from", r"(\d)(\d)?"),
    ("--rank-from", "(?P<x"),
    ("--rank-from", r"(.*)"),
    ("--rank-from", "[z-a]"),
    ("--rank-from", "\x1b[31m("),
    ("--rank-map", "x"),
    ("--rank-map", "1="),
    ("--rank-map", "=1"),
    ("--rank-map", "1=2=3"),
    ("--rank-map", f"{2**70}=0"),
    ("--rank-map", "1=-1"),
    ("--rank-map", ",,,"),
    ("--jobs", "0"),
    ("--jobs", "-1"),
    ("--cache-dir", "/dev/null"),
    ("--cache-dir", "/dev/null/sub"),
    ("--cache-dir", ""),
    ("--cache-dir", "{out}/\x1b[31mcache"),
    ("--cache-dir", "{run}"),
    ("--cache-dir", "{run}/rank0.json.gz"),
)
# In option values, {run} is the case's run folder and {out} a scratch folder beside it.


def options(rng: random.Random) -> dict:
    """A bad or odd value for a loading option, on the unmutated run."""
    option, value = rng.choice(BAD_OPTIONS)
    return dict(
        category="options",
        detail=f"{option} {value!r}",
        base="kineto",
        files=dict(kineto_files()),
        expect="any",
        target=None,
        options=(option, value),
        names=(option,),
    )


# -- picking a case ---------------------------------------------------------------------------

# category -> (mutator, weight): weights spend the cases where the input space is widest.
MUTATORS = {
    "kineto-header": (kineto_header, 12),
    "kineto-event": (kineto_event, 14),
    "kineto-events": (kineto_events, 8),
    "kineto-strings": (kineto_strings, 10),
    "kineto-deep": (kineto_deep, 3),
    "kineto-same": (kineto_same, 10),
    "bytes-gzip": (bytes_gzip, 6),
    "bytes-json": (bytes_json, 7),
    "nsys-cells": (nsys_cells, 10),
    "nsys-schema": (nsys_schema, 4),
    "nsys-same": (nsys_same, 2),
    "nsys-bytes": (nsys_bytes, 3),
    "folder": (folder, 5),
    "folder-same": (folder_same, 2),
    "capture": (capture, 5),
    "options": (options, 3),
}
CATEGORIES = tuple(MUTATORS)


def make_case(seed: int, index: int, category: str | None = None) -> Case:
    """The case ``index`` of the run with ``seed`` (a category forced, for the test's draws)."""
    rng = random.Random(f"{seed}:{index}")
    forced = category is not None
    if category is None:
        names = list(MUTATORS)
        category = rng.choices(names, weights=[MUTATORS[n][1] for n in names])[0]
    replay_id = f"{seed}:{index}:{category}" if forced else f"{seed}:{index}"
    fields = MUTATORS[category][0](rng)
    return Case(seed=seed, index=index, replay_id=replay_id, **fields)


def unmutated_case(base: str) -> Case:
    """The run every case of this base is compared to."""
    files = kineto_files() if base == "kineto" else nsys_files()
    return Case(
        seed=0, index=-1, category="unmutated", detail=f"unmutated {base}", base=base, files=dict(files), expect="same"
    )
