"""Reading a Harbor task directory that may be hostile: only regular files inside it, within limits.

What is read from a task ends up in a root sandbox and in the prompt data. A file must resolve
inside the task directory (a symlink that stays inside is fine), must be a regular file (never a
FIFO or a device, which could hang or never end) and at most MAX_FILE_BYTES, with MAX_TASK_BYTES
for all of a task's files together.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .task import MAX_FILE_BYTES

# MAX_FILE_BYTES (16 MiB, agentrl.swe.task) per file; this much for all the
# files of one task together (its JSONL line carries them all).
MAX_TASK_BYTES = 64 * 2**20


class HarborTaskError(ValueError):
    """A task directory that cannot be converted; the message starts with the offending path."""

    def __init__(self, path: Path, problem: str):
        self.path = Path(path)
        super().__init__(f"{path}: {problem}")


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class TaskTree:
    """The files of one task directory, read safely; the only way harbor.py reads a task.

    Refused, each as a HarborTaskError naming the file and what to do: a path
    that resolves outside the task directory (a symlink out, or through a
    symlinked directory), anything but a regular file (checked before it is
    opened, and opened O_NONBLOCK, so a FIFO cannot hang the conversion), a
    file over MAX_FILE_BYTES (at most that + 1 bytes are ever read), and a task
    whose files add up to more than MAX_TASK_BYTES.
    """

    def __init__(self, task_dir: Path, max_file_bytes: int | None = None, max_task_bytes: int | None = None):
        self.dir = Path(task_dir)
        self.real = os.path.realpath(self.dir)
        self.max_file_bytes = MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
        self.max_task_bytes = MAX_TASK_BYTES if max_task_bytes is None else max_task_bytes
        self.total = 0

    def _inside(self, real: str) -> bool:
        return os.path.commonpath([real, self.real]) == self.real

    def resolve(self, path: Path) -> str | None:
        """The real path of `path`, None when nothing is there; refused when it leaves the task."""
        path = Path(path)
        if not os.path.lexists(path):
            return None
        real = os.path.realpath(path)
        if self._inside(real):
            return real
        if os.path.islink(path):
            target = os.readlink(path)
            shown = target if target == real else f"{target} ({real})"
            what = "its files" if os.path.isdir(real) else "the file"
            raise HarborTaskError(path, f"is a symlink to {shown}, outside the task directory {self.dir}: "
                                        f"copy {what} into the task instead")
        raise HarborTaskError(path, f"resolves to {real}, outside the task directory {self.dir} (through a "
                                    "symlinked directory): copy the files into the task instead")

    def exists(self, path: Path) -> bool:
        return self.resolve(path) is not None

    def is_dir(self, path: Path) -> bool:
        real = self.resolve(path)
        return real is not None and os.path.isdir(real)

    def read_bytes(self, path: Path) -> bytes:
        path = Path(path)
        real = self.resolve(path)
        if real is None:
            raise HarborTaskError(path, "is missing")
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise HarborTaskError(path, f"is a symlink to {os.readlink(path)}, which does not exist: "
                                        "remove it or put the file there") from None
        except OSError as e:
            raise HarborTaskError(path, f"cannot be read ({e.strerror})") from None
        self._check_regular(path, st)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise HarborTaskError(path, f"cannot be read ({e.strerror})") from None
        try:
            st2 = os.fstat(fd)
            self._check_regular(path, st2)
            if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
                raise HarborTaskError(path, "changed while it was being read: convert the task again")
            chunks, left = [], self.max_file_bytes + 1
            while left > 0:
                chunk = os.read(fd, min(left, 2**20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as e:
            raise HarborTaskError(path, f"cannot be read ({e.strerror})") from None
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._check_size(path, len(data))
        self.total += len(data)
        if self.total > self.max_task_bytes:
            raise HarborTaskError(path, f"brings the task's files past {_mib(self.max_task_bytes)}, the limit "
                                        "for one task: make the task smaller (a repository this big belongs "
                                        "in an image, named by [environment] docker_image)")
        return data

    def _check_regular(self, path: Path, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise HarborTaskError(path, f"is {_kind(st.st_mode)}, not a regular file: replace it with "
                                        "a regular file (or remove it)")
        self._check_size(path, st.st_size)

    def _check_size(self, path: Path, size: int) -> None:
        if size > self.max_file_bytes:
            raise HarborTaskError(path, f"is {size} bytes, over the {_mib(self.max_file_bytes)} limit for one "
                                        "file of a task: make it smaller, or put it in the task's image")

    def read_text(self, path: Path) -> str:
        """The file's exact text: strict UTF-8, no newline translation."""
        raw = self.read_bytes(path)
        try:
            return raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise HarborTaskError(path, f"is not UTF-8 (bad byte at offset {e.start})") from None

    def files_under(self, directory: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
        """Every regular file under `directory` (relative posix path -> bytes); no bytecode caches.

        Symlinked directories are followed only while they stay inside the task,
        and each real directory is walked once: a symlink back up (a loop) or a
        second way into the same directory is refused, so the walk is as big
        as the tree on disk.
        """
        directory = Path(directory)
        real = self.resolve(directory)
        if real is None or not os.path.isdir(real):
            raise HarborTaskError(directory, "is not a directory")
        out: dict[str, bytes] = {}
        walked: dict[str, Path] = {}

        def walk(d: Path, real_d: str, rel: str) -> None:
            if real_d in walked:
                raise HarborTaskError(d, f"is the same directory as {walked[real_d]} (through a symlink, which "
                                         "may make a loop): replace the symlink with the files it should hold")
            walked[real_d] = d
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                raise HarborTaskError(d, f"cannot be listed ({e.strerror})") from None
            for entry in entries:
                p, r = d / entry.name, f"{rel}{entry.name}"
                if entry.name == "__pycache__":
                    continue
                if entry.is_symlink():
                    resolved = self.resolve(p)  # refuses a symlink out of the task
                    if resolved is None:        # removed since it was listed
                        raise HarborTaskError(p, "is missing")
                    real_e, is_dir = resolved, os.path.isdir(resolved)
                else:
                    real_e, is_dir = os.path.join(real_d, entry.name), entry.is_dir(follow_symlinks=False)
                if is_dir:
                    walk(p, real_e, r + "/")
                elif r not in skip:
                    out[r] = self.read_bytes(p)

        walk(directory, real, "")
        return out
