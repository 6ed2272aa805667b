#!/usr/bin/env python3
"""Renders the chat templates in tests/fixtures/chat_templates/ with transformers' own Jinja
path (transformers.utils.chat_template_utils.render_jinja_template: its sandboxed environment
with trim_blocks / lstrip_blocks, its tojson, raise_exception and strftime_now) and writes
cases.json, the expected outputs the C++ interpreter is compared with byte for byte.

strftime_now is pinned to 2024-09-26 13:45:00 so the outputs do not depend on the day.
A case whose template raises (e.g. Gemma refusing a system message) records the error text.

Run: /work/venv-hf/bin/python scripts/make_chat_template_goldens.py  (jinja2 3.1.6, transformers 5.x)
"""
import datetime as _dt
import json
import pathlib

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

FIXED_NOW = _dt.datetime(2024, 9, 26, 13, 45, 0)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = _FixedDatetime  # strftime_now reads the module's datetime at call time

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat_templates"

# The special tokens each model's tokenizer passes to its template (bos_token, eos_token).
SPECIAL = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B": (None, "<|im_end|>"),
    "Qwen-QwQ-32B": (None, "<|im_end|>"),
    "HuggingFaceTB-SmolLM2-135M-Instruct": ("<|im_start|>", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. \"Paris\" or 'Zürich'."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "description": "second <summand> & more"}},
            "required": ["a", "b"]}}},
]

SYSTEM = {"role": "system", "content": "You are a terse assistant.\nAnswer in one line."}
TURNS = [
    {"role": "user", "content": "Hello! What is 2 + 2?"},
    {"role": "assistant", "content": "  2 + 2 = 4.  "},
    {"role": "user", "content": "And in French? «quatre» — \"tab\"\there"},
]
TOOL_TURNS = [
    {"role": "user", "content": "What's the weather in Paris, and 1.5 + 2?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
        {"id": "call67890", "type": "function",
         "function": {"name": "add", "arguments": {"a": 1.5, "b": 2}}}]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    {"role": "tool", "tool_call_id": "call67890", "name": "add", "content": "3.5"},
    {"role": "assistant", "content": "It is 21 °C and clear in Paris; 1.5 + 2 = 3.5."},
]
SINGLE_TOOL_TURNS = [  # Llama 3.x refuses more than one call per message
    TOOL_TURNS[0],
    {"role": "assistant", "tool_calls": [TOOL_TURNS[1]["tool_calls"][0]]},
    TOOL_TURNS[2],
    TOOL_TURNS[4],
]
THINK_TURNS = [
    {"role": "user", "content": "Is 17 prime?"},
    {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisor between 2 and 4."},
    {"role": "user", "content": "Is 21?"},
    {"role": "assistant", "content": "<think>\n21 = 3 * 7.\n</think>\n\nNo, 21 = 3 x 7."},
]


def cases_for(name):
    out = [
        ("system_agp", [SYSTEM] + TURNS, None, True, {}),
        ("system_no_agp", [SYSTEM] + TURNS + [{"role": "assistant", "content": "En français : quatre."}], None, False, {}),
        ("no_system", TURNS + [{"role": "assistant", "content": "Quatre."}], None, False, {}),
        ("single_user_agp", TURNS[:1], None, True, {}),
        ("tools", [SYSTEM] + TOOL_TURNS, TOOLS, False, {}),
        ("tools_single", SINGLE_TOOL_TURNS, TOOLS, False, {}),
        ("tools_agp", TOOL_TURNS[:1], TOOLS, True, {}),
        ("reasoning", THINK_TURNS, None, False, {}),
    ]
    if name in ("Qwen-Qwen3-0.6B",):
        out += [
            ("thinking_off_agp", [SYSTEM] + TURNS, None, True, {"enable_thinking": False}),
            ("thinking_on_agp", [SYSTEM] + TURNS, None, True, {"enable_thinking": True}),
            ("thinking_off_tools", [SYSTEM] + TOOL_TURNS, TOOLS, False, {"enable_thinking": False}),
        ]
    if name == "openai-gpt-oss-120b":
        out += [("reasoning_high_agp", [SYSTEM] + TURNS, TOOLS, True, {"reasoning_effort": "high"})]
    return out


def main():
    cases = []
    for path in sorted(HERE.glob("*.jinja")):
        name = path.stem
        template = path.read_text(encoding="utf-8")
        bos, eos = SPECIAL[name]
        for case, messages, tools, agp, extra in cases_for(name):
            variables = {"bos_token": bos, "eos_token": eos, **extra}
            entry = {"template": path.name, "case": case, "messages": messages, "tools": tools,
                     "add_generation_prompt": agp, "variables": variables}
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[json.loads(json.dumps(messages))], tools=tools, chat_template=template,
                    add_generation_prompt=agp, **variables)
                entry["expected"] = rendered[0]
            except jinja2.exceptions.UndefinedError as e:  # e.g. "+" on a missing key: C++ must refuse too
                entry["error"] = ""
                entry["python_error"] = f"{type(e).__name__}: {e}"
            except jinja2.exceptions.TemplateError as e:  # raise_exception(msg): C++ must say msg
                entry["error"] = str(e)
            except Exception as e:  # a Python error inside the template: C++ must refuse too
                entry["error"] = ""
                entry["python_error"] = f"{type(e).__name__}: {e}"
            cases.append(entry)
    doc = {"generator": "scripts/make_chat_template_goldens.py",
           "transformers": transformers.__version__, "jinja2": jinja2.__version__,
           "strftime_now": FIXED_NOW.isoformat(), "cases": cases}
    (HERE / "cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} raise")


if __name__ == "__main__":
    main()
