"""Chats used to check that the gateway renders prompts exactly as vLLM does."""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]},
    },
}

CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "system", "content": "You are helpful."},
                  {"role": "user", "content": "Name a colour."},
                  {"role": "assistant", "content": "Blue."},
                  {"role": "user", "content": "Another one?"}]},
    {"messages": [{"role": "system", "content": "你是一个乐于助人的助手。"},
                  {"role": "user", "content": "今天北京的天气怎么样？请用中文回答。"}]},
    {"messages": [{"role": "user", "content": "日本語で自己紹介してください。絵文字も🙂"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                               {"type": "text", "text": "part two"}]}]},
    {"messages": [{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER_TOOL]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather",
                                                "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
                  {"role": "user", "content": "Thanks. And tomorrow?"}],
     "tools": [WEATHER_TOOL]},
    # Tools as clients write them: no description, keys in another order, strict, no
    # parameters; vLLM rebuilds each (engine.tokenizer.template_tools).
    {"messages": [{"role": "user", "content": "Weather in Oslo?"}],
     "tools": [{"function": {"parameters": WEATHER_TOOL["function"]["parameters"],
                             "name": "get_weather"}, "type": "function"},
               {"type": "function", "function": {"name": "now", "description": "The time.",
                                                 "strict": True}}]},
    {"messages": [{"role": "user", "content": "  leading and trailing spaces  \n\n"}]},
    {"messages": [{"role": "user", "content": "Think briefly."}],
     "chat_template_kwargs": {"enable_thinking": False}},
]

def _call(arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}


_ASKED = {"role": "user", "content": "Weather in Paris?"}
_ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}

VLLM_MESSAGE_CHATS: list[dict[str, Any]] = [
    # What vLLM makes of the messages before its template sees them
    # (engine.tokenizer.conversation): an agent's reasoning between its calls ...
    {"messages": [_ASKED, {"role": "assistant", "content": "", "reasoning": "Call it.",
                           "tool_calls": [_call('{"city": "Paris"}')]}, _ANSWERED],
     "tools": [WEATHER_TOOL]},
    # ... which vLLM does not read under the name some clients send it
    {"messages": [_ASKED, {"role": "assistant", "content": "", "reasoning_content": "Call it.",
                           "tool_calls": [_call('{"city": "Paris"}')]}, _ANSWERED],
     "tools": [WEATHER_TOOL]},
    # arguments that are empty, not JSON, or not an object: {}
    *({"messages": [_ASKED, {"role": "assistant", "content": None,
                             "tool_calls": [_call(arguments)]}, _ANSWERED],
       "tools": [WEATHER_TOOL]} for arguments in ("", "{city: Paris", "[1, 2]")),
    # an empty text part is not read: no blank line where it stood
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": ""},
                                               {"type": "text", "text": "b"}]}]},
    # parts vLLM reads as text: thinking (its "thinking"), a tool reference (its name),
    # a bare string; a text part whose text is null is skipped
    {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "Hmm."},
                                               {"type": "text", "text": "Hi"}]},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "Plan."},
                                                    {"type": "output_text", "text": "Ok."}]},
                  {"role": "user", "content": [{"type": "tool_reference", "name": "search"},
                                               "bare", {"type": "text", "text": None},
                                               {"type": "refusal", "refusal": None},
                                               {"type": "input_text", "text": "go"}]}]},
    # an assistant message echoed back as the API returned it
    {"messages": [_ASKED, {"role": "assistant", "content": "Sunny.", "tool_calls": [],
                           "refusal": None, "annotations": [], "audio": None},
                  {"role": "user", "content": "And tomorrow?"}]},
    # vLLM renders a developer message as a system message when the template has no
    # developer role, merged with the others in front (engine.tokenizer.developer_as_system)
    {"messages": [{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "system", "content": "Sys."}, {"role": "developer", "content": "Dev."},
                  {"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                  {"role": "developer", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]},
                  {"role": "user", "content": "Again"}]},
    {"messages": [{"role": "developer", "content": ""}, {"role": "system", "content": "S"},
                  {"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "developer", "content": "Only a developer, with tools."},
                  {"role": "user", "content": "Weather?"}], "tools": [WEATHER_TOOL]},
    # without a developer message, a late system message stays where it is
    {"messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "x"},
                  {"role": "system", "content": "B"}, {"role": "user", "content": "y"}]},
]


PARTS_TEMPLATE = (  # loops over a message's parts, as multimodal models' templates do
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}"
    "{{ part['text'] | trim }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}"
    "</tool_call>{%- endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""vLLM hands this template every content as a list of parts ("openai" format), which
it trims, where a string would not be (engine.content_format)."""

PARTS_TEMPLATE_CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "system", "content": "  You are terse. \n"},
                  {"role": "user", "content": " Hi  "}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": " one "},
                                               {"type": "text", "text": "two\n"}]}]},
    # merged after vLLM read the messages: a string, untrimmed
    {"messages": [{"role": "system", "content": " S "}, {"role": "user", "content": "q"},
                  {"role": "developer", "content": " D "}, {"role": "user", "content": "q2"}]},
    {"messages": [{"role": "developer", "content": " D "}, {"role": "user", "content": "q"}]},
    # thinking parts are text parts to the template; null text parts are left out
    {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": " t "},
                                               {"type": "text", "text": None},
                                               {"type": "input_text", "text": " u "}]}]},
    # a tool result's parts joined back into a string; a call written out as JSON
    {"messages": [_ASKED, {"role": "assistant", "content": None,
                           "tool_calls": [_call('{"city": "Paris"}')]},
                  {"role": "tool", "tool_call_id": "call_1",
                   "content": [{"type": "text", "text": " a "}, {"type": "text", "text": ""},
                               {"type": "text", "text": "b "}]}],
     "tools": [WEATHER_TOOL]},
]
"""Chats for a replica and a gateway that both render with :data:`PARTS_TEMPLATE`."""
