"""The sharded checkpoint's safe reader: torch.distributed.checkpoint (DCP) made to run no code a directory names.

A sharded checkpoint (train.py --parallel=fsdp) is a directory: each process's shards of the weights and
optimizer state, a .metadata pickle that indexes them, and meta.pt with the other fields. DCP's own reader
unpickles .metadata and the byte items with pickle; here .metadata builds only DCP's metadata classes, a
byte item only plain data, and every file read is a regular file inside the directory. Saving, and loading
into a model, are checkpoint.py's.
"""
import contextlib
import functools
import os
import pickle
import warnings

import torch

from nanogpt.errors import UserError
from nanogpt.files import open_regular
from nanogpt.pickles import load_error, read_pickle, torch_load



def optimizer_list(optimizer):
    """What torch.distributed.checkpoint.state_dict takes: the optimizers an optim.Optimizers holds, or the one."""
    return list(optimizer.optimizers.values()) if hasattr(optimizer, "optimizers") else optimizer


def sharded_shapes(directory):
    """{name: (size, dtype)} of the model weights a DCP directory holds, from its metadata. A weight
    declared as anything but a tensor (pickled bytes, which DCP would unpickle) is refused."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp_reader(directory)
    try:
        metadata = reader.read_metadata()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{directory}: its DCP metadata (.metadata) is missing or damaged ({type(e).__name__}); "
                        f"restore the directory from a backup or train again") from None
    damaged = UserError(f"{directory}: its DCP metadata (.metadata) is damaged (a weight's size or dtype is not one); "
                        f"restore the directory from a backup or train again")
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict):
        raise damaged
    shapes = {}
    for key, entry in entries.items():
        if isinstance(key, str) and key.startswith("model."):
            if not isinstance(entry, TensorStorageMetadata):
                raise not_a_tensor(directory, key, entry)
            size, dtype = entry.size, getattr(entry.properties, "dtype", None)
            if not (isinstance(size, torch.Size) and all(n >= 0 for n in size) and isinstance(dtype, torch.dtype)):
                raise damaged  # the pickle builds only allowed classes, but any values in them
            shapes[key[len("model."):]] = (size, dtype)
    return shapes


def not_a_tensor(directory, key, entry):
    return UserError(f"refusing to load {directory}: its .metadata declares {key} as a "
                     f"{type(entry).__name__}, not a tensor, which DCP would unpickle (and so could run code); "
                     f"restore the directory from a backup or train again")


# what a DCP directory's .metadata (a pickle) may build: DCP's metadata classes, sizes, paths, and (by
# the torch module's name) dtypes; anything else could run code
DCP_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
}


def dcp_metadata_class(module, name):
    """True for the classes DCP's metadata is built of (RestrictedUnpickler's allow)."""
    return name in DCP_METADATA_GLOBALS.get(module, ()) or (
        module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))


def dcp_reader(directory):
    """torch.distributed.checkpoint's reader of directory, reading .metadata with pickles.read_pickle (DCP's
    own reader unpickles it with pickle, which runs any code the file names) and only regular files
    inside directory."""
    return safe_dcp_classes()[0](directory)


@functools.cache
def safe_dcp_classes():
    """(reader, planner): DCP's FileSystemReader and DefaultLoadPlanner, made to run no code a directory names."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class RegularFiles(FileSystem):
        """Reads only regular files directly inside the checkpoint's directory (never a FIFO, which would block
        forever, nor a path .metadata names elsewhere)."""

        def __init__(self, directory):
            self.directory = os.path.realpath(directory)

        @contextlib.contextmanager
        def create_stream(self, path, mode):
            if mode != "rb" or os.path.dirname(os.path.realpath(path)) != self.directory:
                raise UserError(f"refusing to read {path}: it is not a file of the checkpoint {self.directory}")
            with open_regular(path, mode) as f:
                yield f

    class SafeReader(FileSystemReader):
        def __init__(self, directory):
            super().__init__(directory)
            self.fs = RegularFiles(directory)

        def read_metadata(self, *args, **kwargs):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                try:
                    metadata = read_pickle(f, path, "restore the directory from a backup or train again",
                                           dcp_metadata_class)
                except pickle.UnpicklingError as e:
                    raise UserError(f"refusing to load {path}: it holds objects other than checkpoint metadata "
                                    f"({e}), which could run code; only load checkpoints you trust") from None
            if not isinstance(metadata, Metadata):
                raise UserError(f"{path} holds a {type(metadata).__name__}, not DCP metadata; restore the "
                                f"directory from a backup or train again")
            for info in (metadata.storage_data or {}).values():
                if getattr(info, "transform_descriptors", None):  # DCP's zstd: a small file, any amount of memory
                    raise UserError(f"refusing to load {path}: its shards are to be decoded by "
                                    f"{list(info.transform_descriptors)}, which no save here writes and which can "
                                    f"expand a small file into any amount of memory; only load checkpoints you trust")
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        """Reads the items DCP stores as pickled bytes (the optimizer's param_groups: numbers, strings, tuples)
        with torch's weights-only unpickler, where DCP's own planner runs full pickle; and none where the
        state to fill holds a tensor: a .metadata declaring a weight as bytes is refused."""

        def __init__(self, directory):
            super().__init__()
            self.directory = directory

        def create_local_plan(self):
            plan = super().create_local_plan()
            for item in plan.items:
                fqn = item.dest_index.fqn
                if item.type == LoadItemType.BYTE_IO and isinstance(self.state_dict.get(fqn), torch.Tensor):
                    raise not_a_tensor(self.directory, fqn, self.metadata.state_dict_metadata[fqn])
            return plan

        def load_bytes(self, read_item, value):
            fqn = read_item.dest_index.fqn
            try:
                obj = torch_load(value, f"{fqn} in {self.directory}",
                                 "restore the directory from a backup or train again")
            except UserError:
                raise
            except Exception as e:
                raise UserError(f"refusing to load {fqn} from {self.directory}: it is not plain data ({load_error(e)}), "
                                f"and a pickle of anything else could run code; only load checkpoints you trust") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafeReader, SafePlanner


def dcp_load(state, directory):
    """Fill state's tensors, in place, from directory's shards (any number of them, any sharding). Each
    process reads for itself (no_dist): nothing read from the files travels between processes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    reader, planner = safe_dcp_classes()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process")
            dcp.load(state, checkpoint_id=directory, storage_reader=reader(directory), planner=planner(directory),
                     no_dist=True)
    except UserError:
        raise
    except (Exception, CheckpointException) as e:
        failures = getattr(e, "failures", {}).values()
        refused = [f[0] for f in failures if isinstance(f, tuple) and isinstance(f[0], UserError)]
        if refused:
            raise refused[0] from None
        text = "\n".join(str(f[0] if isinstance(f, tuple) else f) for f in failures) or str(e)
        if "refusing to" in text:  # ours, from inside DCP's metadata read, which wraps it in an AssertionError
            raise UserError(text[text.index("refusing to"):].splitlines()[0]) from None
        if "GLOBAL" in text:  # the weights-only unpickler met a class or function to import
            raise UserError(f"refusing to load {directory}: a shard holds objects other than tensors and plain data, "
                            f"which could run code; only load checkpoints you trust") from None
        lines = [line for line in load_error(e).splitlines() if line.strip()] or [type(e).__name__]
        raise UserError(f"{directory}: a shard is missing or damaged ({lines[-1].strip()}); restore the directory "
                        f"from a backup or train again") from None
