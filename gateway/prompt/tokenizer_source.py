"""Where a served model's tokenizer comes from, when nobody said.

The gateway renders and hashes each prompt with the model's own tokenizer
and chat template; routing quality depends on having them. For each served
model, in order:

1. ``config``: a folder configured for the model (``models[].tokenizer``,
   ``--model NAME --tokenizer PATH``, or ``--tokenizer PATH`` alone when the
   replicas serve one model).
2. ``replica-root``: the ``root`` the replica reports in ``/v1/models``
   (vLLM reports the model's path), when it is a local folder with tokenizer
   files: a gateway on the replicas' host, or sharing their model volume.
3. ``hf-cache``: the local Hugging Face cache under that root, or under the
   served model's name (``Qwen/Qwen2.5-72B-Instruct``), offline only.
4. ``bytes``: the byte renderer (``engine.tokenizer.ByteRenderer``). It
   still routes by prefix — message boundaries cut pieces, blocks are
   hashed over bytes — but predicted token counts are estimates, and the
   ``precise`` policy cannot match the replicas' KV events with it.

:func:`find_tokenizer` only decides; loading is the caller's (it is slow,
so the caller runs it in a worker thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True, slots=True)
class TokenizerChoice:
    source: str
    """``config``, ``replica-root``, ``hf-cache`` or ``bytes``."""
    path: str | None = None
    """The tokenizer folder; None for ``bytes``."""
    note: str = ""
    """Why, in words, for the start-up log (no secrets: paths and names only)."""

    @property
    def real(self) -> bool:
        return self.path is not None


def has_tokenizer_files(folder: str) -> bool:
    return os.path.isdir(folder) and any(
        os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES)


def configured_folder_problem(folder: str) -> str | None:
    """Why a configured tokenizer folder cannot be used, or None if it can.

    A folder someone configured that is missing is a mistake to stop on, not
    a reason to route on bytes (which only a warning would say)."""
    if not os.path.exists(folder):
        return f"tokenizer folder {folder} does not exist"
    if not os.path.isdir(folder):
        return f"tokenizer {folder} is not a folder"
    if not has_tokenizer_files(folder):
        return (f"tokenizer folder {folder} is not a tokenizer: it has none of "
                f"{', '.join(TOKENIZER_FILES)}")
    return None


def hf_cache_folder(name: str) -> str | None:
    """The local Hugging Face cache's snapshot of repository ``name``, if it holds one."""
    if not name or os.path.isabs(name) or name.count("/") > 1:
        return None
    try:
        folder = snapshot_download(repo_id=name, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    return folder if has_tokenizer_files(folder) else None


def find_tokenizer(model: str, configured: str | None, root: str | None) -> TokenizerChoice:
    """The first source that has a tokenizer for ``model`` (see the module doc)."""
    if configured:
        return TokenizerChoice("config", configured, f"configured folder {configured}")
    if root and has_tokenizer_files(root):
        return TokenizerChoice("replica-root", root, f"the replica's model folder {root}")
    for name in dict.fromkeys(n for n in (root, model) if n):
        folder = hf_cache_folder(name)
        if folder is not None:
            return TokenizerChoice("hf-cache", folder, f"the Hugging Face cache of {name}")
    tried = f"root {root!r} is not a local folder with tokenizer files" if root else \
        "no replica reported a root"
    names = list(dict.fromkeys(n for n in (root, model) if n)) or [model]
    looked = f"neither {names[0]!r} nor {names[1]!r} is" if len(names) > 1 else \
        f"{names[0]!r} is not"
    return TokenizerChoice("bytes", None,
                           f"{tried}, and {looked} in the local Hugging Face cache")
