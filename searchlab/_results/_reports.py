"""Every training and validation report of an experiment, read from Tune's ``result.json``.

Each step is linear in the number of reports. The files are read in chunks of about 64 MiB (the
next one in a thread while this one is parsed), without the trial config that Tune repeats on
every line, and parsed by pyarrow's JSON reader (C++). A chunk pyarrow cannot read exactly as
the standard library would (a line cut short by a crash, a value whose type changes between
reports) is retried file by file, and such a file is read line by line with ``json``. Superseded
reports are found with grouped running minimums.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["FIXED_COLUMNS", "GROUPS", "ResultFile", "mark_superseded", "read_reports"]

GROUPS = ("training", "validation")
FIXED_COLUMNS = ("trial_id", "group", "batches", "epochs", "timestamp", "elapsed_s", "superseded")
# Keys of a report that are not metrics: Tune's own, and the columns searchlab builds.
_NOT_METRICS = frozenset(
    {
        "timestamp",
        "training_iteration",
        "time_this_iter_s",
        "time_total_s",
        "pid",
        "hostname",
        "node_ip",
        "config",
        "date",
        "done",
        "trial_id",
        "should_checkpoint",
        "checkpoint_dir_name",
        "iterations_since_restore",
        "time_since_restore",
        "experiment_tag",
        "group",
        "batches",
        "epochs",
        "elapsed_s",  # columns searchlab adds
        "superseded",
    }
)
_READ = ("group", "batches", "epochs", "timestamp")  # the non-metric keys a frame keeps
_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class ResultFile:
    """The ``result.json`` of one trial: the first of ``paths`` that can be read."""

    trial_id: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class _Piece:
    trial_id: str
    start: int  # the piece's whole lines, each ending in a newline, are buffer[start:end]
    end: int
    lines: int


@dataclass(frozen=True)
class _Parsed:
    frame: pd.DataFrame  # the kept reports; ``_piece``: the index of their file in the chunk
    first: dict[str, int]  # each metric's first row with a value (not null; NaN is a value)


@dataclass(frozen=True)
class _Chunk:
    data: memoryview  # the buffer; the pieces lie one after the other in it
    pieces: list[_Piece]


def read_reports(files: Sequence[ResultFile]) -> pd.DataFrame:
    """The training and validation reports of ``files``, in file order, with ``superseded``.

    Columns: ``trial_id, group, batches, epochs, timestamp, elapsed_s``, the metrics in the order
    they first hold a value, and ``superseded``.
    """
    frames: list[pd.DataFrame] = []
    first: dict[str, int] = {}
    trial_ids: list[str] = []
    rows = 0
    for chunk in _prefetched(_chunks(files)):
        for parsed in _parse(chunk):
            parsed.frame["_piece"] += len(trial_ids)
            frames.append(parsed.frame)
            for name, row in parsed.first.items():
                first.setdefault(name, rows + row)
            rows += len(parsed.frame)
        trial_ids.extend(piece.trial_id for piece in chunk.pieces)
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return pd.DataFrame(columns=list(FIXED_COLUMNS))
    return _assemble(pd.concat(frames, ignore_index=True), trial_ids, first)


def _parse(chunk: _Chunk) -> list[_Parsed]:
    """The chunk's reports. A chunk pyarrow cannot read is retried file by file, so that a
    damaged file costs only its own lines."""
    parsed = _parse_fast(chunk)
    if parsed is not None:
        return [parsed]
    if len(chunk.pieces) == 1:
        return [_parse_slow(chunk)]
    out = []
    for index, piece in enumerate(chunk.pieces):
        single = _Chunk(chunk.data, [piece])
        parsed = _parse_fast(single)
        parsed = _parse_slow(single) if parsed is None else parsed
        parsed.frame["_piece"] += index
        out.append(parsed)
    return out


def _prefetched(chunks: Iterator[_Chunk]) -> Iterator[_Chunk]:
    """``chunks``, the next one read in a thread while the caller parses this one."""
    with ThreadPoolExecutor(max_workers=1) as reader:
        future = reader.submit(next, chunks, None)
        while (chunk := future.result()) is not None:
            future = reader.submit(next, chunks, None)
            yield chunk


def _chunks(files: Sequence[ResultFile]) -> Iterator[_Chunk]:
    """The files' whole lines, read into buffers of about ``_CHUNK_BYTES``.

    Two buffers take turns: one is filled while the caller parses the other (pyarrow copies
    what it parses, so nothing points into a buffer once its chunk is parsed).
    """
    buffers = [bytearray(_CHUNK_BYTES), bytearray(0)]
    turn, used = 0, 0
    pieces: list[_Piece] = []
    for file in files:
        for path in file.paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                if used + size + 1 > len(buffers[turn]) and pieces:
                    yield _Chunk(memoryview(buffers[turn])[:used], pieces)
                    turn, used, pieces = 1 - turn, 0, []
                if size + 1 > len(buffers[turn]):
                    buffers[turn] = bytearray(max(_CHUNK_BYTES, size + 1))
                piece = _read_into(fd, buffers[turn], used, size, file.trial_id)
            finally:
                os.close(fd)
            pieces.append(piece)
            used = piece.end
            break
    if pieces:
        yield _Chunk(memoryview(buffers[turn])[:used], pieces)


def _read_into(fd: int, buffer: bytearray, start: int, size: int, trial_id: str) -> _Piece:
    view = memoryview(buffer)
    stop = start
    while stop < start + size:  # a file still being written may end early
        n = os.readv(fd, [view[stop : start + size]])
        if n == 0:
            break
        stop += n
    end = buffer.rfind(b"\n", start, stop) + 1 or start
    tail = bytes(buffer[end:stop])
    if tail.strip() and _is_object(tail):  # a last report written without its newline
        buffer[stop] = ord("\n")
        end = stop + 1
    body = _without_config(view[start:end].tobytes())
    if len(body) < end - start:
        view[start : start + len(body)] = body
    return _Piece(trial_id, start, start + len(body), body.count(b"\n"))


_CONFIG_KEY = b', "config": '
_DECODER = json.JSONDecoder()


def _without_config(body: bytes) -> bytes:
    """``body`` without the trial config Tune repeats on every line (half of each line).

    The exact bytes of the first line's config value are cut wherever they follow
    ``, "config": ``; that sequence cannot occur inside a JSON string (its quotes would be
    escaped). Results never read the config, so only the parsing gets cheaper.
    """
    parts = body.split(_CONFIG_KEY)
    if len(parts) < 2:
        return body
    try:
        first_line = parts[1][: parts[1].find(b"\n")].decode("ascii")
        _, size = _DECODER.raw_decode(first_line)
    except ValueError:
        return body
    config = parts[1][:size]
    if not config.startswith(b"{"):
        return body  # only an object ends where its bytes end: 5 is a prefix of 55
    out = [parts[0]]
    for part in parts[1:]:
        if part.startswith(config):
            out.append(part[size:])
        else:
            out.extend((_CONFIG_KEY, part))
    return b"".join(out)


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False  # a line cut short by a crash (or still being written)


def _is_kept(key: str) -> bool:
    return key in _READ or (key not in _NOT_METRICS and not key.startswith("searchlab_"))


def _parse_fast(chunk: _Chunk) -> _Parsed | None:
    """The chunk's kept reports via pyarrow, or None where that would differ from ``json``."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pa_json
    except ImportError:  # pragma: no cover - ray[tune] requires pyarrow
        return None
    try:
        data = chunk.data[chunk.pieces[0].start : chunk.pieces[-1].end]
        table = pa_json.read_json(pa.BufferReader(pa.py_buffer(data)))
    except (pa.ArrowException, ValueError):
        return None  # a damaged line, a type that changes (number then string), ...
    lines = [p.lines for p in chunk.pieces]
    if table.num_rows != sum(lines) or "group" not in table.column_names:
        return None  # empty lines; or no report of a group (the slow path sorts that out)
    if not pa.types.is_string(table["group"].type):
        return None
    pieces = np.repeat(np.arange(len(lines)), lines)
    mask = pc.fill_null(pc.is_in(table["group"], pa.array(GROUPS)), False)
    keep = [name for name in table.column_names if _is_kept(name)]
    table = table.select(keep).filter(mask)
    columns: dict[str, Any] = {"_piece": pieces[mask.to_numpy(zero_copy_only=False)]}
    first: dict[str, int] = {}
    for name in keep:
        column = table[name]
        if column.null_count == len(column) and name not in _READ:
            continue  # a key only other groups report (or only ever null)
        if not _exact_type(column.type, column.null_count, pa):
            return None
        columns[name] = column.to_pandas()
        if name not in _READ:
            first[name] = int(np.argmax(column.is_valid().to_numpy(zero_copy_only=False)))
    return _Parsed(pd.DataFrame(columns), first)


def _exact_type(arrow_type: Any, nulls: int, pa: Any) -> bool:
    """Whether pandas gives this column the values and dtype ``json`` + pandas would."""
    if pa.types.is_int64(arrow_type) or pa.types.is_float64(arrow_type):
        return True
    if pa.types.is_string(arrow_type) or pa.types.is_null(arrow_type):
        return True
    return pa.types.is_boolean(arrow_type) and nulls == 0


def _parse_slow(chunk: _Chunk) -> _Parsed:
    rows: list[dict[str, Any]] = []
    pieces: list[int] = []
    first: dict[str, int] = {}
    for index, piece in enumerate(chunk.pieces):
        for line in bytes(chunk.data[piece.start : piece.end]).split(b"\n"):
            try:
                result = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if not isinstance(result, dict) or result.get("group") not in GROUPS:
                continue
            row = {k: v for k, v in result.items() if _is_kept(k)}
            for key, value in row.items():
                if value is not None and key not in _READ:
                    first.setdefault(key, len(rows))
            rows.append(row)
            pieces.append(index)
    frame = pd.DataFrame(rows)
    frame = frame[[c for c in frame.columns if c in first or c in _READ]]
    frame["_piece"] = np.asarray(pieces, dtype=np.int64)
    return _Parsed(frame, first)


def _assemble(frame: pd.DataFrame, trial_ids: list[str], first: dict[str, int]) -> pd.DataFrame:
    piece = frame.pop("_piece").to_numpy()
    ids = np.asarray(trial_ids, dtype=object)
    codes = pd.factorize(ids)[0]
    for name in ("batches", "epochs", "timestamp"):
        if name not in frame:
            frame[name] = np.nan
    seconds = pd.to_numeric(frame.pop("timestamp"), errors="coerce").astype("float64")
    out = pd.DataFrame(
        {
            "trial_id": pd.Series(ids[piece]),
            "group": frame.pop("group"),
            "batches": frame.pop("batches"),
            "epochs": frame.pop("epochs"),
            "timestamp": pd.to_datetime(seconds, unit="s", utc=True),
            "elapsed_s": seconds - seconds.min(),
        }
    )
    # Metrics in the order of their first value, as pandas orders the keys of dict rows.
    position = {name: i for i, name in enumerate(frame.columns)}
    metrics = sorted(position, key=lambda name: (first[name], position[name]))
    out = pd.concat([out, frame[metrics]], axis=1)
    groups = pd.factorize(out["group"])[0]
    batches = pd.to_numeric(out["batches"], errors="coerce").to_numpy(dtype="float64")
    out["superseded"] = mark_superseded(codes[piece], groups, batches)
    return out


def mark_superseded(trials: np.ndarray, groups: np.ndarray, batches: np.ndarray) -> np.ndarray:
    """Which reports a later report of the same trial rolled back (rows in file order).

    A report is superseded when a later report of its trial has fewer batches, or as many in the
    same group: the trial was restored from an earlier checkpoint and redid that work. One
    reverse pass: the minimum batches of the later reports of the trial, and of the trial's
    group.
    """
    n = len(batches)
    if n == 0:
        return np.zeros(0, dtype=bool)
    later = np.where(np.isnan(batches), np.inf, batches)[::-1]
    by_trial = pd.Series(trials[::-1])
    by_group = pd.Series(trials[::-1].astype(np.int64) * (int(groups.max()) + 1) + groups[::-1])
    values = pd.Series(later)
    # The minimum over the reports after each one (exclusive), per trial and per trial+group.
    min_any = values.groupby(by_trial).shift(1, fill_value=np.inf).groupby(by_trial).cummin()
    min_same = values.groupby(by_group).shift(1, fill_value=np.inf).groupby(by_group).cummin()
    own = batches[::-1]
    superseded = (min_any.to_numpy() < own) | (min_same.to_numpy() <= own)
    return superseded[::-1].copy()
