"""find_leaks.py: run in a task's sandbox as the agent (`python3 -I`), after baseline, by `agentrl tasks check
--leaks` (agentrl.swe.leaks). It looks where an agent would look for the answer and prints, as one JSON list,
each place that holds it.

stdin, JSON: {"workdir": "/testbed", "fixes": [{"path": "pkg/mod.py", "blob": "<git blob id of the fixed
file>", "lines": ["<a line the fix adds>", ...]}, ...]}. A file or blob holds a fix when it is the fixed file
byte for byte, or when it has every line the fix adds (an installed copy of another release, a patch file,
a backup); a fix that only deletes is found by its exact bytes alone.

Where it looks: every git repository on the file system (a .git, a submodule's git dir, a bare clone), all
its objects reachable or not, each found blob named by what reaches it (HEAD's history, a ref, a reflog,
nothing); every file named like a fixed file or a leftover (*.orig, *.rej, *.bak, *~, *.patch, *.diff);
members of archives (wheels, eggs, zips, tarballs, conda packages) named like a fixed file; any zip in a
cache directory (pip's http cache keeps wheels under hashed names). Only what the agent can read counts.
Standard library only, Python 3.6 and later: it runs on the image's python3.
"""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile

SKIP = ("/proc", "/sys", "/dev", "/run")
LEFTOVER = (".orig", ".rej", ".bak", "~", ".patch", ".diff", ".swp")
ARCHIVES = (".whl", ".zip", ".egg", ".jar", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz",
            ".conda")
CACHES = {".cache", "cache", "pip", "uv", "pkgs", "http", "http-v2", "wheels"}
MAX_FILE = 64 << 20
MAX_BLOB = 4 << 20
GIT = ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"]


class Fix:
    def __init__(self, d):
        self.path = d["path"]
        self.name = os.path.basename(self.path)
        self.blob = d["blob"]
        self.lines = [line.encode() for line in d["lines"]]

    def held_by(self, data):
        """'the fixed file' (its bytes), 'the fix's lines' (all it adds), or None."""
        if self.blob == git_blob_id(data):
            return "the fixed file"
        if self.lines and all(line in data for line in self.lines):
            return "every line the fix adds"
        return None


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def found(out, fix, place, how):
    out.append({"file": fix.path, "place": place, "how": how})


def check_bytes(out, fixes, data, place):
    for fix in fixes:
        how = fix.held_by(data)
        if how:
            found(out, fix, place, how)


def read(path, limit=MAX_FILE):
    try:
        if os.path.getsize(path) > limit:
            return None
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def is_archive(name):
    return name.endswith(ARCHIVES)


def in_cache(directory):
    """A package cache (pip's http cache keeps wheels under hashed names, uv's and conda's too), not a
    __pycache__."""
    return bool(CACHES.intersection(directory.split("/")))


def check_archive(out, fixes, path):
    names = {f.name for f in fixes}
    try:
        if os.path.getsize(path) > 4 * MAX_FILE:
            return
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    base = info.filename.rsplit("/", 1)[-1]
                    if base in names and info.file_size <= MAX_FILE:
                        check_bytes(out, fixes, z.read(info), f"{path} (member {info.filename})")
                    elif is_archive(base) and info.file_size <= MAX_FILE:   # a wheel inside a conda package
                        inner = z.read(info)
                        check_inner(out, fixes, inner, f"{path} (member {info.filename})")
        elif name_is_tar(path) and tarfile.is_tarfile(path):
            with tarfile.open(path) as t:
                for m in t:
                    member = t.extractfile(m) if m.isfile() and m.size <= MAX_FILE else None
                    if member is not None and m.name.rsplit("/", 1)[-1] in names:
                        check_bytes(out, fixes, member.read(), f"{path} (member {m.name})")
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError, RuntimeError, ValueError):
        pass


def name_is_tar(path):
    return path.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz"))


def check_inner(out, fixes, data, place):
    import io
    names = {f.name for f in fixes}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                if info.filename.rsplit("/", 1)[-1] in names:
                    check_bytes(out, fixes, z.read(info), f"{place}/{info.filename}")
    except (zipfile.BadZipFile, OSError, ValueError):
        pass


def is_git_dir(path):
    return os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(os.path.join(path, "objects"))


def git(git_dir, *args, **kw):
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        env.pop(name, None)
    p = subprocess.run(GIT + ["--git-dir=" + git_dir] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, env=env, **kw)
    return p.stdout if p.returncode == 0 else None


def object_ids(git_dir, *args):
    listed = git(git_dir, "rev-list", "--objects", *args)
    return set() if listed is None else {line.split(b" ", 1)[0].decode() for line in listed.splitlines()}


def where_in_git(git_dir, blob):
    """What reaches `blob` in the repository: HEAD's history, which refs, a reflog, or nothing."""
    if blob in object_ids(git_dir, "HEAD"):
        return "in HEAD's history"
    refs = (git(git_dir, "for-each-ref", "--format=%(refname)") or b"").decode().split()
    holding = [r for r in refs[:200] if blob in object_ids(git_dir, r, "--not", "HEAD")]
    if holding:
        return "on " + ", ".join(holding[:8]) + (f" and {len(holding) - 8} more" if len(holding) > 8 else "")
    if blob in object_ids(git_dir, "--reflog", "--not", "--all", "HEAD"):
        return "in a reflog"
    return "an unreachable object (loose or in a pack): no ref or reflog reaches it"


def check_git(out, fixes, git_dir):
    listing = git(git_dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype) %(objectsize)")
    if listing is None:
        return
    blobs = []
    for line in listing.decode().splitlines():
        oid, kind, size = line.split()
        if kind == "blob" and int(size) <= MAX_BLOB:
            blobs.append(oid)
    if not blobs:
        return
    p = subprocess.Popen(GIT + ["--git-dir=" + git_dir, "cat-file", "--batch"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    send, receive = p.stdin, p.stdout
    assert send is not None and receive is not None
    hits = []
    try:
        for oid in blobs:
            send.write(oid.encode() + b"\n")
            send.flush()
            header = receive.readline().split()
            if len(header) != 3:
                continue
            data = receive.read(int(header[2]))
            receive.read(1)
            for fix in fixes:
                how = fix.held_by(data)
                if how:
                    hits.append((fix, oid, how))
    finally:
        send.close()
        p.wait()
    for fix, oid, how in hits:
        found(out, fix, f"git {git_dir}: blob {oid[:12]} {where_in_git(git_dir, oid)}", how)


def main():
    req = json.load(sys.stdin)
    fixes = [Fix(d) for d in req["fixes"]]
    names = {f.name for f in fixes}
    workdir = req["workdir"].rstrip("/")
    own = {os.path.join(workdir, f.path) for f in fixes}
    out: list = []
    for top, dirs, files in os.walk("/", onerror=lambda e: None):
        if top in SKIP:
            del dirs[:]
            continue
        for d in list(dirs):
            path = os.path.join(top, d)
            if os.path.islink(path):
                continue
            if is_git_dir(path):
                check_git(out, fixes, path)
                # its submodules' git dirs are git dirs of their own, under modules/
                modules = os.path.join(path, "modules")
                for mtop, mdirs, _ in os.walk(modules, onerror=lambda e: None):
                    for m in list(mdirs):
                        if is_git_dir(os.path.join(mtop, m)):
                            check_git(out, fixes, os.path.join(mtop, m))
                            mdirs.remove(m)
                dirs.remove(d)
        for name in files:
            path = os.path.join(top, name)
            if os.path.islink(path) or path in own:
                continue
            if name in names or name.endswith(LEFTOVER) and any(n in name for n in names):
                data = read(path)
                if data is not None:
                    check_bytes(out, fixes, data, path)
            elif is_archive(name) or in_cache(top):
                check_archive(out, fixes, path)
            elif name.endswith((".patch", ".diff", ".rej")):
                data = read(path)
                if data is not None:
                    check_bytes(out, fixes, data, path)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
