"""The prompt linter: what in a prompt breaks prefix caching, and where.

One request (``linter.Linter``): every text field of a chat request (message
contents, tool descriptions and parameters, tool-call arguments) is scanned by
the ``detect.Detector`` (typed pattern families, validated by parsing), the
request's structure is checked (``structure``: Unicode, tool JSON, cache
salt), the prompt is rendered with the model's chat template to find what the
template itself injects (``template``), and every finding is placed on the
prompt's tokens (``tokens``). Findings in the stable prefix (system prompt,
tools, earlier turns) are warnings; in the final user turn they cost nothing.

Many requests (``batch``, ``variance``): requests are grouped by model,
tenant and template shape, and the spans that really vary between them are
found by aligning their stable prefixes. The gateway does the same online
(``service.LintService``), memory-bounded, and watches each group's stable
prefix for sudden shortening (``drift``).

Nothing here runs at import time; the gateway's start-up builds the service
(``gateway.server.parts.build_lint``).
"""
