"""``shared-prefix-completions``: ``shared-prefix`` sent to ``/v1/completions``.

The same apps, questions, order, lengths and pacing as ``shared-prefix``
(:mod:`.shared_prefix`, same parameters and defaults: 64 groups x 16
prompts, 2048 / 128 / 256 tokens), but each request is a text completion:
``prompt`` is the app's system text, a blank line and the question
(``endpoint="completions"``, see :mod:`loadtest.transcript`), with no chat
template around it. It shows whether a router sees the shared prefix of a
completions request as it does a chat one's, and gives the same cache shape
without template tokens.
"""

from __future__ import annotations

import dataclasses

from loadtest.workloads import shared_prefix
from loadtest.workloads.base import Workload
from loadtest.workloads.shared_prefix import SharedPrefixParams


def build(params: SharedPrefixParams) -> Workload:
    chat = shared_prefix.build(params)
    conversations = tuple(dataclasses.replace(c, endpoint="completions")
                          for c in chat.conversations)
    return dataclasses.replace(chat, name="shared-prefix-completions",
                               conversations=conversations)
