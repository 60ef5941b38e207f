"""Grading past one machine: a fixed split of the submissions into shards, and the merge of the shards' gradebooks.

``grade --shard i/N`` grades only the submissions of shard ``i`` (counted from 0) of ``N``: a submission's shard
is the SHA-256 of ``STUDENT/FILE_NAME`` modulo ``N``. Every task of a job array computes the same split without
talking to the others: it does not depend on the order in which the file system lists the files, nor on where
the class folder is mounted, and a late submission moves no other submission to another shard.

Each shard writes ``shard.json`` beside its gradebook: which shard of how many, the class folders and layout it
was given, the submissions it was assigned, and whether it finished. ``gradebook merge`` reads these records and
refuses to merge shards of different splits, a shard given twice, a missing or unfinished shard, or a submission
graded in two shards; the merged gradebook is then the one a single run over all submissions writes (the
gradebook's order does not depend on who graded what, see ``course.instructor.grading.gradebook``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from course.instructor.grading.gradebook import Gradebook, GradebookError, atomic_write, in_order, read_rows
from course.instructor.grading.submissions import Submission

__all__ = ["RECORD", "MERGED", "Shard", "shard_index", "check_out_for", "write_record", "merge"]

RECORD = "shard.json"  # in a shard's gradebook folder
MERGED = "merged.json"  # in a merged gradebook's folder: which shards it came from
_SHARD = re.compile(r"(\d+)/(\d+)")


def shard_index(sub: Submission, count: int) -> int:
    """The shard (0 .. ``count`` - 1) of a submission: SHA-256 of ``student/file name``, modulo ``count``."""
    key = f"{sub.student}/{sub.path.name}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % count


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``0 <= index < count``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"1/4"`` -> Shard(1, 4); ``ValueError`` naming ``--shard`` and the allowed range otherwise."""
        match = _SHARD.fullmatch(text.strip())
        if not match or int(match.group(2)) < 1 or int(match.group(1)) >= int(match.group(2)):
            raise ValueError(f"--shard must be INDEX/COUNT with COUNT >= 1 and 0 <= INDEX < COUNT (e.g. 0/4 for the "
                             f"first of four shards), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, sub: Submission) -> bool:
        return shard_index(sub, self.count) == self.index


def _read_json(path: Path, what: str) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GradebookError(f"{what} {path.parent}: {path.name} cannot be read ({e})") from None
    if not isinstance(data, dict):
        raise GradebookError(f"{what} {path.parent}: {path.name} is not a record of this course's grader")
    return data


def _record(folder: Path, what: str) -> dict | None:
    record = _read_json(Path(folder) / RECORD, what)
    keys = {"index": int, "count": int, "paths": list, "layout": str, "submissions": list, "complete": bool}
    if record is not None and not all(isinstance(record.get(k), t) for k, t in keys.items()):
        raise GradebookError(f"{what} {folder}: {RECORD} is not a shard record of this version")
    return record


def _name(record: dict) -> str:
    return f"{record['index']}/{record['count']}"


def check_out_for(folder: Path, shard: Shard | None) -> None:
    """Refuse (``GradebookError``) an ``--out`` whose gradebook belongs to another shard, or to no shard
    when ``shard`` is given: resuming there would mix the submissions of two splits."""
    folder = Path(folder)
    record = _record(folder, "--out") if folder.is_dir() else None
    if shard is None and record is not None:
        raise GradebookError(f"--out {folder} holds the gradebook of shard {_name(record)}: grade it with --shard "
                             f"{_name(record)}, or choose another --out")
    if shard is not None and record is not None and (record["index"], record["count"]) != (shard.index, shard.count):
        raise GradebookError(f"--out {folder} holds the gradebook of shard {_name(record)}, not {shard}: "
                             "give every shard its own --out")
    if shard is not None and record is None and (folder / "gradebook.json").exists():
        raise GradebookError(f"--out {folder} holds a gradebook that is not a shard's: give shard {shard} "
                             "its own --out")


def write_record(folder: Path, shard: Shard, paths: list[str], layout: str, submissions: list[Submission],
                 complete: bool) -> None:
    """Write the shard's record beside its gradebook (atomically)."""
    record = {"shard": str(shard), "index": shard.index, "count": shard.count, "paths": [str(p) for p in paths],
              "layout": layout, "submissions": [str(s.path) for s in submissions], "complete": complete}
    atomic_write(Path(folder) / RECORD, json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def _check_shards(folders: list[Path], records: list[dict], rows: list[list[dict]]) -> None:
    """``GradebookError`` unless the shards are exactly 0..N-1 of one split, each finished, none overlapping."""
    where = {i: f"shard {_name(r)} ({f})" for i, (f, r) in enumerate(zip(folders, records))}
    first = records[0]
    for i, r in enumerate(records):
        if (r["count"], r["paths"], r["layout"]) != (first["count"], first["paths"], first["layout"]):
            raise GradebookError(f"{where[i]} and {where[0]} come from different splits (count, class folders or "
                                 "layout differ): grade every shard with the same command but for --shard")
    by_index: dict[int, int] = {}
    for i, r in enumerate(records):
        if r["index"] in by_index:
            raise GradebookError(f"{folders[by_index[r['index']]]} and {folders[i]} both hold shard {_name(r)}: "
                                 "give each shard's folder once")
        by_index[r["index"]] = i
    missing = [f"{k}/{first['count']}" for k in range(first["count"]) if k not in by_index]
    if missing:
        raise GradebookError(f"shard {', '.join(missing)} missing: merge needs all {first['count']} shards' folders")
    for i, r in enumerate(records):
        graded = {row["submission"] for row in rows[i]}
        left = [s for s in r["submissions"] if s not in graded]
        if not r["complete"] or left:
            raise GradebookError(f"{where[i]} did not finish ({len(r['submissions']) - len(left)} of "
                                 f"{len(r['submissions'])} submissions graded): run its task again, then merge")
    owner: dict[str, int] = {}
    for i in range(len(records)):
        for submission in sorted({row["submission"] for row in rows[i]}):
            if owner.setdefault(submission, i) != i:
                raise GradebookError(f"{submission} is graded in {where[owner[submission]]} and in {where[i]}: "
                                     "each submission must be in one shard only")


def merge(folders: list[str | Path], out: str | Path) -> Gradebook:
    """Merge the gradebooks of every shard of one split into ``out`` (``gradebook.json``, ``gradebook.csv`` and
    ``merged.json``, which names the shards). Refuses, before writing anything, shards that do not add up and an
    ``out`` that holds a shard or a gradebook that a merge did not write."""
    folders, out = [Path(f) for f in folders], Path(out)
    for f in folders:
        if not f.is_dir():
            raise GradebookError(f"shard folder {f} does not exist")
        if f.resolve() == out.resolve():
            raise GradebookError(f"--out {out} is one of the shards' folders: merge into another folder")
    records = []
    for f in folders:
        record = _record(f, "shard folder")
        if record is None:
            raise GradebookError(f"shard folder {f} has no {RECORD}: it was not graded with --shard INDEX/COUNT")
        records.append(record)
    rows = [read_rows(f, "shard folder") for f in folders]
    _check_shards(folders, records, rows)
    if out.is_dir() and (_record(out, "--out") is not None
                         or ((out / "gradebook.json").exists() and not (out / MERGED).exists())):
        raise GradebookError(f"--out {out} holds a gradebook that a merge did not write: choose another --out")
    book = Gradebook(out, regrade=True)
    book.rows = in_order([row for shard_rows in rows for row in shard_rows])
    book.write()
    merged = {"count": records[0]["count"], "paths": records[0]["paths"], "layout": records[0]["layout"],
              "shards": {_name(r): str(f) for f, r in sorted(zip(folders, records), key=lambda fr: fr[1]["index"])}}
    atomic_write(out / MERGED, json.dumps(merged, indent=1, ensure_ascii=False) + "\n")
    return book
