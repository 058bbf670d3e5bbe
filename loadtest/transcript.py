"""What one conversation sends, turn by turn (the history rules of ``workloads.base``).

A :class:`Transcript` holds one conversation's state between its turns.
:meth:`Transcript.call` builds a turn's request — chat ``messages`` (with
the conversation's ``tools``) or a completions ``prompt`` — and
:meth:`Transcript.answered` folds in the answer the server gave, so that
the next turn carries:

* ``messages`` history: every earlier user message and the real answer to
  it, as chat messages;
* ``flattened`` history (and every completions conversation): ONE text,
  turn ``k - 1``'s text, the real answer and turn ``k``'s user text joined
  by :data:`SEPARATOR`; sent as one user message, or as the ``prompt``
  after the system text and a separator;
* ``scripted`` history: every turn's ``script`` so far; answers are dropped.

The system text is given at send time: the load generator puts the clock
line in front of it for ``system_clock`` conversations.
"""

from __future__ import annotations

from typing import Any

from loadtest.client import ChatCall
from loadtest.workloads.base import Conversation, Turn

SEPARATOR = "\n\n"


class Transcript:
    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.history: list[dict[str, Any]] = []
        """Chat messages of the earlier turns (``messages`` / ``scripted``)."""
        self.text: str | None = None
        """``flattened``: the last turn's text and its answer."""
        self._sent: list[dict[str, Any]] = []
        self._sent_text = ""

    @property
    def flattened(self) -> bool:
        c = self.conversation
        return c.history == "flattened" or c.endpoint == "completions"

    def call(self, index: int, turn: Turn, system: str | None, ignore_eos: bool) -> ChatCall:
        """The request of turn ``index`` (call :meth:`answered` before the next one)."""
        c = self.conversation
        if c.history == "scripted":
            self._sent = list(turn.script)
        elif self.flattened:
            self._sent_text = turn.user if self.text is None else self.text + SEPARATOR + turn.user
            self._sent = [{"role": "user", "content": self._sent_text}]
        else:
            self._sent = [{"role": "user", "content": turn.user}]
        if c.endpoint == "completions":
            prompt = self._sent_text if system is None else system + SEPARATOR + self._sent_text
            return ChatCall(c.id, c.group, index, (), turn.max_tokens, ignore_eos, prompt=prompt)
        head = [] if system is None else [{"role": "system", "content": system}]
        return ChatCall(c.id, c.group, index, tuple(head + self.history + self._sent),
                        turn.max_tokens, ignore_eos, tools=c.tools,
                        tool_choice=c.tool_choice if c.tools else None)

    def answered(self, answer: str) -> None:
        """Fold the answer to the last :meth:`call` into the next turn's request."""
        c = self.conversation
        if c.history == "scripted":
            self.history += self._sent
        elif self.flattened:
            self.text = self._sent_text + SEPARATOR + answer
        else:
            self.history += [*self._sent, {"role": "assistant", "content": answer}]
