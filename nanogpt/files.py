"""Opening files in directories a user may have been handed (an out_dir, a dataset, a checkpoint), and finding
those directories: a name as given, else beside the repository (find_folder).

Reading: only a regular file is read; a FIFO (whose open or read blocks forever), a device or a
directory in its place is a UserError naming it. Writing: a file in such a directory is opened
without following a symbolic link, and only where it is a regular file of one name (no other hard
link), so a link planted there cannot redirect a write to a file elsewhere. Every reader and writer
of those directories opens through open_regular and open_to_write.
"""
import os
import stat

from nanogpt import REPOSITORY
from nanogpt.errors import UserError
from nanogpt.values import how_many

NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO's open returns at once instead of waiting for a writer
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def find_folder(path, under="", holding=()):
    """The first folder of: path as given, under/path (both from the working directory), under/path beside the
    repository; where holding names files, the first that holds one of them. None if there is none."""
    for candidate in dict.fromkeys((path, os.path.join(under, path), os.path.join(REPOSITORY, under, path))):
        if os.path.isdir(candidate) and (not holding or any(os.path.exists(os.path.join(candidate, name))
                                                            for name in holding)):
            return candidate
    return None


def folders_near(path, under="", holding=()):
    """{name: path as a user would type it} of the folders that hold one of `holding`, where find_folder(path, under)
    looks: in under/ here, in under/ beside the repository, and beside path itself (what a typo was meant to be)."""
    near = {}
    parent = os.path.dirname(os.path.normpath(path))
    # (one beside the repository by its name alone: under/name is found from its own directory only)
    for base, shown in ((under, under), (os.path.join(REPOSITORY, under), ""), (parent or ".", parent)):
        if os.path.isdir(base):
            for name in sorted(os.listdir(base)):
                if any(os.path.exists(os.path.join(base, name, held)) for held in holding):
                    near.setdefault(name, os.path.join(shown, name))
    return near


def kind_of(mode):
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "of another kind"


def not_regular(path, mode):
    return UserError(f"{path} is not a regular file (it is {kind_of(mode)}): refusing to read it; put the file "
                     f"itself there")


def open_regular(path, mode="rb", encoding=None, errors=None):
    """path opened for reading where it is a regular file (after links); else a UserError naming it.
    OSErrors of the open itself (no such file, no permission) are raised as they are."""
    fd = os.open(path, os.O_RDONLY | NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode, encoding=encoding, errors=errors)


def read_regular(path):
    """The bytes of a regular file (open_regular's rule)."""
    with open_regular(path) as f:
        return f.read()


def read_named_text(path, what, limit=None):
    """The UTF-8 text of a file a user names (what: how messages name it, e.g. "--start=FILE:p.txt"): read only
    where it is a regular file (open_regular's rule: /dev/zero or a FIFO would never end), of at most limit bytes;
    else a UserError saying what is wrong. Universal newlines, as open() reads text; a byte-order mark is dropped."""
    try:
        with open_regular(path) as f:
            data = f.read(-1 if limit is None else limit + 1)
    except UserError as e:
        raise UserError(f"{what}: {e}") from None
    except OSError as e:
        raise UserError(f"{what}: cannot read it ({e.strerror or e})") from None
    if limit is not None and len(data) > limit:
        raise UserError(f"{what} is over {limit:,} bytes; give a shorter file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} is not UTF-8 text (bad byte at offset {e.start}); save it as UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def check_regular(path):
    """Raise open_regular's UserError where path is not a regular file: for readers that take a path
    (safetensors, transformers). A missing file is left to them."""
    try:
        open_regular(path).close()
    except FileNotFoundError:
        pass


def open_fd_to_write(path, append=False, truncate=True, perms=0o644):
    """An fd of path for writing, created if absent, never through a symbolic link, never a file that is
    not regular or that has another name (hard link) elsewhere: a UserError names it. Truncated (unless
    append or not truncate) only once it is known to be such a file."""
    flags = os.O_RDWR | os.O_CREAT | NOFOLLOW | NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, perms)
    except OSError as e:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP (EMLINK on some systems)
            raise UserError(f"refusing to write {path}: it is a symbolic link (to {os.readlink(path)}), which "
                            f"would redirect the write; remove the link") from None
        raise OSError(e.errno, e.strerror, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"refusing to write {path}: it is not a regular file (it is {kind_of(st.st_mode)}); "
                            f"remove it")
        if st.st_nlink > 1:
            raise UserError(f"refusing to write {path}: it has {how_many(st.st_nlink - 1, 'other name')} (a hard "
                            f"link), so the write would change a file elsewhere; remove it")
        os.set_blocking(fd, True)
        if truncate and not append:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_to_write(path, mode="w", encoding=None, truncate=True):
    """open_fd_to_write's file as a file object: mode "w"/"wb" (truncated), "a"/"ab" (appended), "a+"
    (read and append)."""
    append = mode.startswith("a")
    fd = open_fd_to_write(path, append=append, truncate=truncate)
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    return os.fdopen(fd, mode, encoding=encoding)  # an fd: no second open, so no second chance to follow a link


def write_text_atomically(path, text):
    """path holds text, written to path.tmp (open_to_write's rule) and renamed over it: a reader sees the
    old file or the new one, and a failure leaves no .tmp behind."""
    tmp = path + ".tmp"
    f = open_to_write(tmp)
    try:
        with f:
            f.write(text)
        os.replace(tmp, path)  # a rename replaces a link at path, never follows it
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
