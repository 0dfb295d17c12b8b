"""What a Hugging Face model directory holds, read without trusting it: config.json's fields with the JSON
types its reader needs, and the names and shapes in its safetensors headers (no tensor is loaded). GPT-2's,
Llama's and Qwen3's readers check a config.json against its weights with them before building anything."""
import json
import os

from nanogpt.errors import UserError
from nanogpt.files import check_regular, read_regular


def read_config(directory, types, positive=()):
    """directory's config.json as a dict ({} where there is none: the reader says so), each field of types
    of its type (bool only where named; transformers refuses an integer where it reads a float, so we do), and
    the fields in positive at least 1 where given. JSON nested thousands deep stops Python's parser with a
    RecursionError: a UserError too."""
    path = os.path.join(directory, "config.json")
    try:
        config = json.loads(read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, RecursionError) as e:
        reason = "nested too deep" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        raise UserError(f"{path} is not valid JSON ({reason}); download or export the model again") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} holds a JSON {type(config).__name__}, expected an object; download or export the "
                        f"model again")
    for key, allowed in types.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        value = config.get(key)
        if key in config and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise UserError(f"{path}: {key} is {value!r}, expected {' or '.join(t.__name__ for t in allowed)}; "
                            f"download or export the model again")
    for key in positive:
        if isinstance(config.get(key), int) and config[key] < 1:
            raise UserError(f"{path}: {key} is {config[key]}, expected at least 1; download or export the model "
                            f"again")
    return config


def header_shapes(directory):
    """{name: shape} of every tensor in directory's *.safetensors files, from their headers alone (safetensors
    checks that each tensor's bytes are in its file)."""
    from safetensors import safe_open
    shapes = {}
    for file in sorted(f for f in os.listdir(directory) if f.endswith(".safetensors")):
        path = os.path.join(directory, file)
        try:
            check_regular(path)  # a FIFO would block safetensors' open forever
            with safe_open(path, "pt") as f:
                shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
        except UserError:
            raise
        except Exception as e:  # safetensors' own error type: a header that is not one
            raise UserError(f"{path} is not a readable safetensors file ({' '.join(str(e).split())}); download "
                            f"or export it again") from None
    return shapes
