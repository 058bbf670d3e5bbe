"""The command-line parser of every ``prefixgate`` command: flags named in full only, and
an unknown flag answered with the nearest known one.

argparse takes any unambiguous prefix of a flag by default: ``prefixgate serve --replicas
URL`` was read as ``--replicas-from URL``, a DNS name that resolves to nothing, and the
gateway started with no replica and no word why. A prefix that is a flag today can become
ambiguous, or mean another flag, when a flag is added: scripts break with a release.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any, NoReturn


class CommandParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            known = [flag for action in self._actions for flag in action.option_strings]
            for word in message.partition(":")[2].split():
                near = difflib.get_close_matches(word.partition("=")[0], known, n=1)
                if word.startswith("--") and near:
                    message += f" (did you mean {near[0]}?)"
                    break
        super().error(message)
