"""A chat template that writes today's date (Llama 3.x style) is a finding, placed exactly."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from engine import chat_template
from engine.tokenizer import HFRenderer
from gateway.config import ModelSettings
from gateway.lint.detect import Detector
from gateway.lint.linter import Linter
from gateway.lint.service import LintService
from gateway.lint.template import ClockProbe, read_template
from gateway.lint.tokens import HFEncoder, TokenMap
from gateway.prompt.hashers import HasherSet

from .corpus import NOW

# Modeled on the Llama 3.x date header, in the Qwen tokenizer's ChatML markup.
DATED_TEMPLATE = """{%- if not date_string is defined -%}
{%- if strftime_now is defined -%}{%- set date_string = strftime_now("%d %b %Y") -%}
{%- else -%}{%- set date_string = "26 Jul 2024" -%}{%- endif -%}
{%- endif -%}
<|im_start|>system
Cutting Knowledge Date: December 2023
Today Date: {{ date_string }}

{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|im_end|>
{% for message in messages %}{% if message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

BODY = {"messages": [{"role": "system", "content": "You are a careful assistant. " * 8},
                     {"role": "user", "content": "What day is it?"}]}


@pytest.fixture(scope="module")
def dated_dir(tmp_path_factory: pytest.TempPathFactory, qwen_dir: str) -> str:
    folder = tmp_path_factory.mktemp("dated-tokenizer")
    for item in Path(qwen_dir).iterdir():
        shutil.copy(item, folder / item.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = DATED_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def dated(dated_dir: str) -> Linter:
    return Linter("dated", HFRenderer(dated_dir), TokenMap(HFEncoder(dated_dir)),
                  read_template(dated_dir), Detector(), ClockProbe(), clock=lambda: NOW)


def frozen_template_clock(monkeypatch: pytest.MonkeyPatch, today: dt.datetime) -> None:
    """Inject the clock chat templates read (``strftime_now``)."""
    monkeypatch.setattr(chat_template, "now", lambda: today)


# The first of a month (its "01" shares a token with many other dates: the
# case that once made this test fail on every 1st), month and year ends.
@pytest.mark.parametrize("today", [dt.datetime(2026, 12, 1, 0, 0, 1),
                                   dt.datetime(2026, 11, 30, 15, 25, 7),
                                   dt.datetime(2027, 12, 31, 23, 59, 59),
                                   dt.datetime(2028, 2, 29, 12, 0, 0)])
def test_template_date_is_a_warning_at_its_tokens(dated: Linter, today: dt.datetime,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    frozen_template_clock(monkeypatch, today)
    linter = dated
    report = linter.lint(BODY, 16)
    finding = next(f for f in report.findings if f.kind == "template_dynamic")
    assert finding.path == "chat_template" and finding.severity == "warning"
    assert finding.text == today.strftime("%d %b %Y")
    assert "date_string" in finding.suggestion
    # Placed on the real tokens: the first one a date differing in every
    # character (the next day would not: "01" and "02" share a token) changes.
    assert linter.renderer is not None
    rendered = linter.renderer.render_chat(BODY)
    assert rendered[finding.start:finding.end] == finding.text
    ids = linter.renderer.text_token_ids(rendered, add_special_tokens=False)
    other = linter.renderer.text_token_ids(rendered.replace(finding.text, "99 Zzz 8888"),
                                           add_special_tokens=False)
    changed = next(i for i, (a, b) in enumerate(zip(ids, other)) if a != b)
    assert finding.token_start == changed
    assert report.cacheable_prefix_tokens == changed - changed % 16
    assert report.cacheable_prefix_tokens_if_fixed > report.cacheable_prefix_tokens


def test_pinned_date_is_not_a_finding(dated: Linter) -> None:
    report = dated.lint({**BODY, "chat_template_kwargs": {"date_string": "26 Jul 2024"}}, 16)
    assert not [f for f in report.findings if f.kind == "template_dynamic"]
    assert report.cacheable_prefix_tokens == report.cacheable_prefix_tokens_if_fixed


def test_live_traffic_counts_the_template_date(dated_dir: str) -> None:
    models = [ModelSettings(name="dated", tokenizer=dated_dir)]
    service = LintService(HasherSet(models), models, clock=lambda: NOW)
    assert service.check_now("dated", BODY, None) == 1
    assert service.check_now("dated", {**BODY, "chat_template_kwargs": {
        "date_string": "26 Jul 2024"}}, None) == 0
    assert [s.kind for s in service.top_findings()] == ["template_dynamic"]
