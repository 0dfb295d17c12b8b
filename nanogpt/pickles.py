"""Pickled files read without trusting their sizes: pickles (a dataset's meta.pkl, a sharded checkpoint's
.metadata) and torch's zipped pickles (ckpt.pt, meta.pt).

Python's unpickler believes the sizes a pickle declares: a memo slot of 2**27 (LONG_BINPUT, 9 bytes in
all) grows its memo table to 2 GiB before anything else is read, and a frame or string may declare more
bytes than the file holds. load_pickle scans the opcodes first (pickletools reads the bytes and builds
nothing): a pickler numbers its memo 0, 1, 2, ..., so each slot must be below the count of opcodes before
it, and each declared length must fit in the bytes left. What unpickling then builds grows with the
opcodes, at most MAX_PICKLE_BYTES of them.

torch.load inflates each record of a checkpoint's zip to the size its directory declares before any check
of what the tensors claim; torch_load checks the zip's records against the file first.
"""
import contextlib
import io
import pickle
import pickletools
import struct
import warnings
import zipfile

from nanogpt.errors import UserError
from nanogpt.files import open_regular

# the largest pickle read: a sharded checkpoint's .metadata grows with tensors x processes, a few MB for GPT-2 XL
MAX_PICKLE_BYTES = 1 << 28
MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")


def unbacked_size(data):
    """The first size in a pickle's bytes that the bytes cannot back, in words; None where there is none.
    ValueError where the bytes are no pickle (pickletools' reason)."""
    try:
        for count, (op, arg, pos) in enumerate(pickletools.genops(data)):
            if op.name in MEMO_PUTS and not 0 <= arg < count:
                return f"memo slot {arg} at byte {pos}, after {count} opcodes"
            if op.name == "FRAME" and arg > len(data) - pos - 9:  # 9: the opcode and its 8-byte length
                return f"a frame of {arg:,} bytes at byte {pos}, with {len(data) - pos - 9:,} left"
    except ValueError as e:
        if "remain" in str(e):  # "expected 1099511627775 bytes in a bytes8, but only 1 remain"
            return " ".join(str(e).split())
        raise
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """Builds plain data and the classes allow(module, name) admits; any other class or function is refused."""

    def __init__(self, file, allow):
        super().__init__(file)
        self.allow = allow

    def find_class(self, module, name):
        if self.allow(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def load_pickle(data, path, remedy, allow=lambda module, name: False):
    """The object a pickle's bytes build, after its sizes are checked against its bytes (a UserError ending
    in remedy where they are not); only the classes allow admits. pickle.UnpicklingError for the rest."""
    if len(data) > MAX_PICKLE_BYTES:
        raise UserError(f"refusing to load {path}: {len(data):,} bytes, beyond the {MAX_PICKLE_BYTES:,} of a "
                        f"pickle this project reads; {remedy}")
    try:
        why = unbacked_size(data)
    except ValueError as e:  # never unpickled: the scan must have seen every opcode the unpickler would run
        raise UserError(f"{path} is not a readable pickle ({' '.join(str(e).split())}); {remedy}") from None
    if why is not None:
        raise UserError(f"refusing to load {path}: its sizes are not backed by its bytes ({why}); the file is "
                        f"damaged or made to exhaust memory; {remedy}")
    return RestrictedUnpickler(io.BytesIO(data), allow).load()


def read_pickle(f, path, remedy, allow=lambda module, name: False):
    """load_pickle of an open file's bytes, reading no more than a pickle may hold."""
    return load_pickle(f.read(MAX_PICKLE_BYTES + 1), path, remedy, allow)


# torch.save writes its records stored, each as many bytes as it declares; what a checkpoint's records inflate
# to, in all, may be at most this many times the file's size (room for a record compressed by another tool)
MAX_INFLATION = 2
LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip's local file header, before the record's name and extra
ZIP_START = b"PK\x03\x04"  # torch.load reads a file as a zip where it starts so; else as an old pickle


def check_zip(f, path, remedy="restore it from a backup or train again"):
    """Where f (a seekable file, at its start) is a zip, its directory's sizes against the file, reading no
    record: the directory is where its end record says (torch's reader and Python's then see the same one),
    each record's local header agrees with it and its bytes lie inside the file, a stored record is as long
    as it declares, and all records inflate to at most MAX_INFLATION times the file's size. A UserError ending
    in remedy where not; zipfile.BadZipFile where f is no zip at all."""
    start, size = f.tell(), f.seek(0, io.SEEK_END)
    try:
        f.seek(start)
        if f.read(4) != ZIP_START:
            return
        if directory_moved(f):
            raise zipfile.BadZipFile("its central directory is not where its end record says")
        records = zipfile.ZipFile(f).infolist()
        for info in records:
            why = unbacked_record(f, info, size)
            if why is not None:
                raise UserError(f"refusing to load {path}: its zip record {info.filename} {why}; the file is "
                                f"damaged or made to exhaust memory; {remedy}")
        inflated = sum(info.file_size for info in records)
        if inflated > MAX_INFLATION * size:
            raise UserError(f"refusing to load {path}: its zip records inflate to {inflated:,} bytes from a file of "
                            f"{size:,} (torch writes them uncompressed); the file is damaged or made to exhaust "
                            f"memory; {remedy}")
    finally:
        f.seek(start)


def directory_moved(f):
    """True where a zip's central directory does not end where its end records begin. Python's zipfile then
    shifts every offset to match, and torch's reader does not: the two would read different directories."""
    end = zipfile._EndRecData(f)  # the end record as written, before zipfile shifts its offsets
    if end is None:
        return True
    gap = end[zipfile._ECD_LOCATION] - end[zipfile._ECD_SIZE] - end[zipfile._ECD_OFFSET]
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:  # torch's: zip64's end records come first
        gap -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    return gap != 0


def unbacked_record(f, info, size):
    """What is wrong with one record's sizes, in words; None where nothing is."""
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        return f"is stored uncompressed in {info.compress_size:,} bytes but declares {info.file_size:,}"
    f.seek(info.header_offset)
    header = f.read(LOCAL_HEADER.size)
    if len(header) < LOCAL_HEADER.size:
        return f"has its header at byte {info.header_offset:,}, past the file's end ({size:,})"
    signature, _, _, method, *_, name_length, extra_length = LOCAL_HEADER.unpack(header)
    if signature != 0x04034B50 or method != info.compress_type:
        return f"has a local header that disagrees with the zip's directory (at byte {info.header_offset:,})"
    data_end = info.header_offset + LOCAL_HEADER.size + name_length + extra_length + info.compress_size
    if data_end > size:
        return f"declares {info.compress_size:,} bytes ending at byte {data_end:,}, past the file's end ({size:,})"
    return None


def torch_load(source, path, remedy="restore it from a backup or train again", **kwargs):
    """torch.load(source, weights_only=True, **kwargs) once source (a file's path, or a seekable file at its
    start) passes check_zip; torch's notes on what it reads (an old pickle protocol) are never the user's."""
    import torch
    with open_regular(source) if isinstance(source, str) else contextlib.nullcontext(source) as f:
        check_zip(f, path, remedy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(source, weights_only=True, **kwargs)


def load_error(e):
    """Why torch.load failed, in one line: torch's reason without its advice to retry with weights_only=False,
    which would run whatever code the file names."""
    text = str(e)
    if "WeightsUnpickler error:" in text:  # the reason follows torch's advice
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip() and "weights_only" not in line]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
