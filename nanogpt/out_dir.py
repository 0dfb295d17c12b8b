"""An out_dir's files: the forms a checkpoint takes there (ckpt.pt, or ckpt.dcp beside it: the one saved last
wins), what an interrupted save leaves and how the next writer puts it back, and the lock one writer holds.
"""
import os
import shutil
import socket
import time


from nanogpt.errors import UserError
from nanogpt.files import open_to_write
from nanogpt.program import describe_os_error


def write_failure(e):
    """What the machine refused in a failed save, in words; None for other errors. torch's zip writer
    reports a write that failed (disk full) as a RuntimeError, the OSError behind it as its context."""
    if isinstance(e, RuntimeError):
        inner = e.__cause__ or e.__context__
        if isinstance(inner, OSError):
            return describe_os_error(inner)
        if "PytorchStreamWriter" in str(e) or "inline_container" in str(e):
            return f"torch could not write it ({str(e).strip().splitlines()[0]}): is the disk full?"
    return describe_os_error(e) if isinstance(e, OSError) else None


def sharded_path(path):
    """out/ckpt.pt -> out/ckpt.dcp: where the sharded form of a checkpoint lives."""
    return os.path.splitext(path)[0] + ".dcp"


def complete_sharded(path):
    """path's sharded form where it is complete (it has its meta.pt, written last), else None. Only the
    visible name counts: what a save moved aside (.ckpt.dcp.old) is put back by the next writer, which
    holds the lock (remove_partial_saves); a reader never takes it."""
    sharded = sharded_path(path)
    return sharded if os.path.exists(os.path.join(sharded, "meta.pt")) else None  # a FIFO there: read_tensors says so


def moved_aside(path):
    """Where an interrupted sharded save of path left the previous checkpoint (.ckpt.dcp.old)."""
    sharded = sharded_path(path)
    return os.path.join(os.path.dirname(sharded), f".{os.path.basename(sharded)}.old")


def latest_form(path):
    """path, or its sharded directory where that was saved after it (or alone)."""
    sharded = complete_sharded(path)
    if sharded is not None and (not os.path.isfile(path) or
                                os.path.getmtime(os.path.join(sharded, "meta.pt")) > os.path.getmtime(path)):
        return sharded
    return path


def interrupted_save(path):
    """True where path has no visible form but an interrupted sharded save left its previous one aside."""
    return (not os.path.exists(path) and not os.path.exists(sharded_path(path))
            and os.path.isfile(os.path.join(moved_aside(path), "meta.pt")))


def discard(path):
    """Remove a file or directory that a newer save made stale: renamed aside first, so that an interrupted
    removal never leaves a half-deleted checkpoint under its name. Failing to remove it is harmless."""
    aside = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.stale")
    try:
        os.replace(path, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True) if os.path.isdir(aside) else os.remove(aside)


def fsync_dir(directory):
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make renames in it durable
    finally:
        os.close(dir_fd)


def check_can_be_directory(path):
    """A UserError where path, or the nearest of its parents that exists, is not a directory: no directory can be
    made there."""
    at = os.path.abspath(path)
    while not os.path.exists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if not os.path.isdir(at):
        raise UserError(f"cannot write to out_dir {path}: {at} is a file, where a directory would be; choose another "
                        f"--out_dir")


class OutDirLock:
    """An exclusive lock on out_dir for a writer's lifetime (train.py, consolidate.py): a second writer is refused
    in one line naming the holder. The lock dies with its process (flock), so a killed run leaves none
    behind; the file .lock stays, naming the last holder. Only the holder removes stale temporary files of
    saves. Readers (sample.py, eval_only, trace.py, export.py) take no lock and delete nothing.

    A lock is on the file .lock, not on its name: where .lock is deleted or replaced (a cleanup of
    dotfiles), a second writer can lock a new one, so the holder checks before each save that .lock
    still is its file (held)."""

    def __init__(self, out_dir, program="train.py", instead="train into another --out_dir"):
        self.out_dir, self.program, self.instead, self.file = out_dir, program, instead, None
        self.path = os.path.join(out_dir, ".lock")
        check_can_be_directory(out_dir)  # at once: not once a plan, a model and an evaluation have run

    def acquire(self):
        try:
            import fcntl
        except ImportError:  # no flock (Windows): writers are not guarded
            return self
        if self.file is not None:
            return self
        for _ in range(3):  # .lock may be deleted between opening and locking it: then lock the new one
            self.file = self.open_and_lock(fcntl)
            if self.held():
                break
            self.release()
        else:
            raise UserError(f"cannot lock {self.path}: it keeps being deleted; stop what removes it and retry")
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{self.program} (pid {os.getpid()} on {socket.gethostname()}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')})")
        self.file.flush()
        remove_partial_saves(self.out_dir)
        return self

    def open_and_lock(self, fcntl):
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            file = open_to_write(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write to out_dir {self.out_dir}: {e.strerror or e}; choose another "
                            f"--out_dir") from None
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.seek(0)
            holder = file.read().strip() or "another process"
            file.close()
            raise UserError(f"{self.out_dir} is in use by {holder}; wait for it to end (or stop it)"
                            + (f", or {self.instead}" if self.instead else "")) from None
        return file

    def held(self):
        """True while .lock is the file this process locked (or no lock is taken): not deleted, not replaced."""
        if self.file is None:
            return True
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        ours = os.fstat(self.file.fileno())
        return (now.st_ino, now.st_dev) == (ours.st_ino, ours.st_dev)

    def lost(self):
        """The error for a writer whose .lock is no longer its own."""
        return UserError(f"{self.path} was deleted or replaced while this {self.program} held it, so another "
                         f"writer may be using {self.out_dir}; stopping without saving (the last checkpoint is "
                         f"kept): leave .lock in place while a run writes there")

    def release(self):
        if self.file is not None:
            self.file.close()  # closing releases the flock
            self.file = None


def remove_partial_saves(out_dir):
    """Delete what saves that a killed run left half done (only the lock holder may: a live run's
    temporary files look the same): temporary files and directories. A sharded checkpoint moved aside
    goes back in place where its checkpoint has no visible form, is removed where the new one arrived,
    and is left alone beside a single file (which of the two is newer is not certain; the next sharded
    save removes it)."""
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.islink(path) and name.startswith((".ckpt.", ".best.")):
            os.remove(path)  # a save's scratch name is never a link: removed as a link, never followed or put in place
            continue
        if name.startswith((".ckpt.pt.", ".best.pt.")) and name.endswith(".tmp") or name in (".ckpt.pt.stale",
                                                                                            ".best.pt.stale"):
            os.remove(path)
        elif name in (".ckpt.dcp.tmp", ".best.dcp.tmp", ".ckpt.dcp.stale", ".best.dcp.stale"):
            shutil.rmtree(path)
        elif name in (".ckpt.dcp.old", ".best.dcp.old"):
            final = os.path.join(out_dir, name[1:-len(".old")])
            if os.path.exists(final):
                shutil.rmtree(path)
            elif not os.path.exists(os.path.splitext(final)[0] + ".pt"):
                os.replace(path, final)
