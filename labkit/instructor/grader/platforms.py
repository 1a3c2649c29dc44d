"""A course platform's bulk download, read as it comes: each file mapped to its learner by the platform's naming.

Courses hand work in through a learning platform, whose "download all submissions" names every file its own way.
As nbgrader's ``zip_collect`` does (its ``FileNameCollectorPlugin.named_regexp``), a platform is a regular
expression with named groups over a file's path inside the download: ``learner`` (the platform's identifier, which
its grade import matches on), ``name`` (the learner's name as the platform wrote it), ``late`` (a late marker),
``file`` (the file as the learner handed it in). The patterns are :data:`PLATFORMS`' and can be replaced
(:func:`read_download`'s ``pattern``):

- Canvas, "Download Submissions": ``lastfirst_[LATE_]userid_submissionid_file`` (``doejane_LATE_1234_56789_lab.ipynb``;
  a file handed in again gets ``-1``, ``-2`` before its extension);
- Moodle, "Download all submissions": ``Full Name_participantid_assignsubmission_file_file``, or with "download
  submissions in folders" the same name as a folder holding the file;
- Blackboard, "Download assignment": ``Assignment_username_attempt_YYYY-MM-DD-HH-MM-SS_file`` (the example of
  nbgrader's documentation), each attempt with a ``.txt`` receipt beside it;
- a plain folder: a notebook directly in it belongs to its file's stem, one in a subfolder to the subfolder
  (:func:`labkit.instructor.cluster.classroom.find_submissions`).

A download is a folder or the zip itself. :func:`read_download` stages each placed notebook as
``STAGE/<learner>/<file>`` (the plain-folder layout the class run grades) and returns a :class:`Intake`: the
learners (identifier, name, late, files) the grades go back to (:mod:`labkit.instructor.grader.platform_grades`),
and every file it could not place, with the reason. Nothing of a download is executed or followed (a link is a
file it could not place); a name is only ever a folder name made safe here.

Layer 5 (instructor tools).
"""

from __future__ import annotations

import json
import re
import unicodedata
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from labkit.instructor.grader.reports import printable
from labkit.instructor.wall.kernel_limits import SUBMISSION_BYTES

PLATFORMS = {
    "canvas": r"(?P<name>[^_/]+)_(?:(?P<late>LATE)_)?(?P<learner>\d+)_\d+_(?P<file>[^/]+)",
    "moodle": r"(?P<name>[^/]+?)_(?P<learner>\d+)_assignsubmission_file_?/?(?P<file>[^/]+)",
    "blackboard": r"(?:.*/)?[^/]*?_(?P<learner>[^_/]+)_attempt_(?P<attempt>[0-9]{4}(?:-[0-9]{2}){5})_(?P<file>[^/]+)",
}
KINDS = ("folder", *PLATFORMS)
INTAKE = "intake.json"  # in the grades folder: who the learners are, for the grades written back


@dataclass(frozen=True)
class Learner:
    """One learner of a download, as the platform knows them."""

    learner: str  # the platform's identifier (Canvas user id, Moodle participant id, Blackboard username)
    name: str = ""  # the name the platform wrote in the file's name, if it writes one
    late: bool = False  # the platform marked a file late
    files: tuple[str, ...] = ()  # the files placed, as named in the download


@dataclass(frozen=True)
class Intake:
    """What a download held: its learners and the files it could not place (path -> why)."""

    platform: str
    learners: tuple[Learner, ...]
    not_placed: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Intake:
        learners = tuple(Learner(**{**item, "files": tuple(item.get("files", ()))}) for item in data["learners"])
        return cls(data["platform"], learners, dict(data.get("not_placed", {})))

    def by_learner(self) -> dict[str, Learner]:
        return {learner.learner: learner for learner in self.learners}


def safe_name(text: str) -> str:
    """``text`` as one folder or file name: no path separators, no control or format characters, not hidden.

    >>> safe_name("José Núñez"), safe_name("../..\\\\x"), safe_name(".hidden")
    ('José Núñez', '_._.._x', '_hidden')
    """
    text = unicodedata.normalize("NFC", printable(text))
    text = "".join("_" if c in "/\\\0" or unicodedata.category(c) in ("Cc", "Cf") else c for c in text).strip()
    text = "_" + text[1:] if text.startswith(".") else text
    return text[:120] or "_"


def _members(download: Path) -> list[tuple[str, object]]:
    """(path inside the download, a way to read it) of every file: a zip's members, or a folder's files."""
    if download.is_file():
        if not zipfile.is_zipfile(download):
            raise ValueError(f"download {download} is neither a folder nor a zip file")
        archive = zipfile.ZipFile(download)
        return sorted(((info.filename, (archive, info)) for info in archive.infolist() if not info.is_dir()),
                      key=lambda item: item[0])
    if not download.is_dir():
        raise FileNotFoundError(f"download {download} is not a folder or a zip file")
    return [(path.relative_to(download).as_posix(), path) for path in sorted(download.rglob("*"))
            if path.is_symlink() or path.is_file()]


def _read(source: object) -> bytes:
    if isinstance(source, Path):
        if source.is_symlink():
            raise ValueError("a symbolic link, not a file handed in")
        data = source.open("rb").read(SUBMISSION_BYTES + 1)
    else:
        archive, info = source
        if info.file_size > SUBMISSION_BYTES:
            raise ValueError(f"larger than {SUBMISSION_BYTES // 2**20} MB")
        data = archive.read(info)
    if len(data) > SUBMISSION_BYTES:
        raise ValueError(f"larger than {SUBMISSION_BYTES // 2**20} MB")
    return data


def place(path: str, platform: str, pattern: str | None = None) -> dict[str, str] | None:
    """The named groups of a file's ``path`` in a ``platform`` download (``learner``, ``name``, ``late``,
    ``file``), or None when the naming does not match.

    >>> place("doejane_LATE_1234_56789_00_start_here-1.ipynb", "canvas")["learner"]
    '1234'
    >>> place("José Núñez_88_assignsubmission_file_00_start_here.ipynb", "moodle")["name"]
    'José Núñez'
    """
    if platform == "folder" and pattern is None:
        parts = PurePosixPath(path).parts
        learner = parts[0] if len(parts) > 1 else PurePosixPath(path).stem
        return {"learner": learner, "name": "", "late": "", "file": parts[-1]}
    if platform not in PLATFORMS and pattern is None:
        raise ValueError(f"platform must be one of {', '.join(KINDS)}, got {platform!r}")
    found = re.fullmatch(pattern or PLATFORMS[platform], unicodedata.normalize("NFC", path))
    if found is None:
        return None
    groups = {key: value or "" for key, value in found.groupdict().items()}
    if "learner" not in groups or "file" not in groups:
        raise ValueError(f"pattern must have the named groups learner and file, got {found.re.pattern!r}")
    return groups


def read_download(download: Path, platform: str, stage: Path, pattern: str | None = None) -> Intake:
    """Stage every notebook of ``download`` (a folder or a zip) as ``stage/<learner>/<file>``; the learners and
    the files not placed. A file handed in again (Canvas's ``-1``, a later Blackboard attempt) keeps the last."""
    if platform not in KINDS:
        raise ValueError(f"platform must be one of {', '.join(KINDS)}, got {platform!r}")
    download, stage = Path(download), Path(stage)
    learners: dict[str, dict] = {}
    not_placed: dict[str, str] = {}
    for path, source in _members(download):
        shown = printable(path)
        if any(part.startswith(".") or part == "__MACOSX" for part in PurePosixPath(path).parts):
            continue  # a platform's or an operating system's own files (.DS_Store, __MACOSX)
        found = place(path, platform, pattern)
        if found is None:
            not_placed[shown] = f"its name does not follow {platform}'s naming"
            continue
        if not found["file"].endswith(".ipynb"):
            not_placed[shown] = "not a notebook (.ipynb)"
            continue
        try:
            data = _read(source)
        except (OSError, ValueError) as error:
            not_placed[shown] = str(error)
            continue
        key = safe_name(found["learner"])
        file = safe_name(re.sub(r"-\d+(\.ipynb)$", r"\1", found["file"]) if platform == "canvas" else found["file"])
        target = stage / key / file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        entry = learners.setdefault(key, {"learner": key, "name": printable(found.get("name", "")), "late": False,
                                          "files": []})
        entry["late"] = entry["late"] or bool(found.get("late"))
        entry["files"].append(shown)
    intake = Intake(platform, tuple(Learner(**{**entry, "files": tuple(entry["files"])})
                                    for entry in learners.values()), not_placed)
    if not intake.learners:
        raise ValueError(f"download {download} holds no notebook named as {platform} names them"
                         + (f" (first not placed: {next(iter(not_placed))})" if not_placed else ""))
    return intake


def save_intake(intake: Intake, out: Path) -> Path:
    from labkit.instructor.grader.results import write_atomically

    write_atomically(Path(out) / INTAKE, json.dumps(intake.to_json(), indent=2, ensure_ascii=False))
    return Path(out) / INTAKE


def load_intake(out: Path) -> Intake | None:
    path = Path(out) / INTAKE
    return Intake.from_json(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None
