#!/usr/bin/env python3
"""Renders the chat templates in tests/fixtures/chat_templates/ with transformers' own Jinja
path (transformers.utils.chat_template_utils.render_jinja_template: its sandboxed environment
with trim_blocks / lstrip_blocks, its tojson, raise_exception and strftime_now) and writes
cases.json, the expected outputs the C++ interpreter is compared with byte for byte.

strftime_now is pinned to 2024-09-26 13:45:00 so the outputs do not depend on the day.
A case whose template raises (e.g. Gemma refusing a system message) records the error text.

Run: python scripts/make_chat_template_goldens.py  (a Python with jinja2 3.1.6 and transformers 5.x)
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
    "google-gemma-3-1b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-4-mini-instruct": ("<|endoftext|>", "<|endoftext|>"),
    "microsoft-phi-4": ("<|endoftext|>", "<|im_end|>"),
    "allenai-OLMo-2-1124-7B-Instruct": ("<|endoftext|>", "<|endoftext|>"),
    "mistralai-Mistral-7B-Instruct-v0.3": ("<s>", "</s>"),
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
PART_TURNS = [
    {"role": "system", "content": [{"type": "text", "text": "Describe images briefly."}]},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]},
    {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    {"role": "user", "content": [{"type": "text", "text": "And its colour?"}]},
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
    if name == "google-gemma-3-1b-it":  # content as a list of parts, as the Gemma 3 processor passes it
        out += [("content_parts_agp", PART_TURNS, None, True, {})]
    if name == "microsoft-Phi-4-mini-instruct":  # Phi-4-mini takes its tools as a string on the system message
        out += [("system_tools_agp", [dict(SYSTEM, tools=json.dumps([t["function"] for t in TOOLS]))] + TURNS[:1],
                 None, True, {})]
    return out


# Small templates exercising one construct each, rendered by the same environment: the
# interpreter's unit goldens (snippets.json). Each is (name, template, variables).
SNIPPETS = [
    ("ws_trim_lstrip", "a\n  {% if true %}\n  b\n  {% endif %}\nc\n", {}),
    ("ws_dash", "a  {{- ' b ' -}}  c {%- if true -%}   d   {%- endif %} e", {}),
    ("ws_plus", "x\n  {%+ if true %}y{% endif +%}\nz", {}),
    ("ws_comment", "a\n  {# note #}\nb {#- x -#} c", {}),
    ("ws_var_no_lstrip", "a\n  {{ 'v' }}\n", {}),
    ("ws_trailing_newline", "line\n", {}),
    ("raw", "{% raw %}{{ not parsed }}{% endraw %}", {}),
    ("literals", "{{ 1 }} {{ 1.5 }} {{ -2 }} {{ 'a' \"b\" }} {{ [1, 'x', none, true] }} {{ {'k': 1, 'j': [2]} }} {{ (1, 2) | list }}", {}),
    ("none_bool_str", "{{ none }}|{{ true }}|{{ x }}|{{ 3.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}", {}),
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ 'ab' * 3 }} {{ [1] + [2] }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ x }}", {}),
    ("compare", "{{ 1 < 2 <= 2 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} {{ [1,2] == [1,2] }}", {}),
    ("logic", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not 0 }} {{ 'a' if false else 'b' }} {{ 'c' if true }}|{{ 'd' if false }}|", {}),
    ("slices", "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-2] }} {{ s[1:3] }} {{ s[::-1] }} {{ xs[5] is defined }}", {"xs": [1, 2, 3, 4], "s": "héllo"}),
    ("attr_item", "{{ d.a }} {{ d['b'].c }} {{ d.missing is defined }} {{ d.get('a') }} {{ d.get('z', 9) }} {{ d.get('z') }}", {"d": {"a": 1, "b": {"c": 2}}}),
    ("loop_vars", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}", {"xs": ["p", "q", "r"]}),
    ("loop_filter_else", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_dict", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | items %}{{ v }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set y = 0 %}{% for x in [1, 2] %}{% set y = y + x %}{{ y }}{% endfor %}|{{ y }}", {}),
    ("namespace", "{% set ns = namespace(n=0, seen=false) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }} {{ ns.seen }}", {}),
    ("set_tuple_block", "{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set t %}inner {{ a }}{% endset %}[{{ t }}]", {}),
    ("macro_call", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }}", {}),
    ("macro_recursive", "{% macro walk(v) %}{% if v is mapping %}{% for k, x in v | items %}{{ k }}:({{ walk(x) }}){% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}{{ walk(d) }}", {"d": {"a": {"b": 1}, "c": 2}}),
    ("call_block", "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside{% endcall %}", {}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("tests", "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ true is true }} {{ false is false }} {{ 2 is eq 2 }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'ab' is lower }} {{ 1 is not string }} {{ y is iterable }} {{ true is number }}", {"x": 1}),
    ("filters_str", "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'MiXed' | lower }}|{{ 'MiXed' | upper }}|{{ 'hello world-foo' | title }}|{{ 'hELLO' | capitalize }}|{{ 'a-b-a' | replace('a', 'o') }}|{{ 'a-b-a' | replace('a', 'o', 1) }}|{{ 'one two  three' | wordcount }}", {}),
    ("filters_seq", "{{ xs | length }} {{ xs | count }} {{ xs | first }} {{ xs | last }} {{ xs | join(', ') }} {{ xs | reverse | list }} {{ xs | sort }} {{ xs | sort(reverse=true) }} {{ [3, 1, 3, 2] | unique | list }} {{ ['B', 'a', 'C'] | sort }} {{ [1, 2, 3] | sum }} {{ [4, 2, 8] | min }} {{ [4, 2, 8] | max }}", {"xs": [3, 1, 2]}),
    ("filters_attr", "{{ ms | map(attribute='role') | list }} {{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('/') }} {{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('tool') | list | length }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ['a', 'b'] | map('upper') | join }}", {"ms": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1", "tool": True}, {"role": "user", "content": "u2"}]}),
    ("filters_num", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 3 | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("filters_default", "{{ x | default('dflt') }} {{ y | d('d2') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ 0 | default('z', boolean=true) }}", {"y": "set"}),
    ("filters_json", "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(sort_keys=true) }}\n{{ 'q\"<&>\u00e9\\n' | tojson }} {{ [] | tojson(indent=2) }} {{ {} | tojson }} {{ 1.0 | tojson }}", {"v": {"b": [1, 2.5, None, True], "a": "x", "c": {"d": []}}}),
    ("filters_misc", "{{ 123 | string ~ 'x' }} {{ {'a': 1} | string }} {{ 'x' | safe }} {{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'l1\n\nl3' | indent(4, blank=true) }} {{ '<a href=\"x\">' | e }} {{ {'b': 1, 'a': 2} | dictsort }} {{ d | list }}", {"d": {"k1": 1, "k2": 2}}),
    ("str_methods", "{{ s.startswith('He') }} {{ s.endswith(('x', 'lo')) }} {{ '  a  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ s.replace('l', 'L') }} {{ s.upper() }} {{ s.lower() }} {{ 'ab cd'.title() }} {{ s.find('l') }} {{ s.count('l') }} {{ '-'.join(['a', 'b']) }}", {"s": "Hello"}),
    ("dict_methods", "{% for k in d.keys() %}{{ k }}{% endfor %} {% for v in d.values() %}{{ v }}{% endfor %} {{ d.items() | list }}", {"d": {"x": 1, "y": [2]}}),
    ("strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}", {}),
    ("raise", "{% if true %}{{ raise_exception('custom failure: ' ~ 42) }}{% endif %}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ range(3) | list }} {{ range(1, 7, 2) | list }}", {}),
    ("repr_nested", "{{ [{'k': \"it's\"}, 'plain', 1.5, none] }}", {}),
    ("unicode", "{{ s | length }} {{ s[0] }} {{ s | upper }} {{ s | reverse }}", {"s": "été"}),
    ("generation", "{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("undefined_plus_error", "{{ 'a' + missing }}", {}),
    ("none_iter_error", "{% for x in n %}{% endfor %}", {"n": None}),
]


def render_snippets():
    out = []
    for name, template, variables in SNIPPETS:
        entry = {"name": name, "template": template, "variables": variables}
        try:
            entry["expected"] = ctu._compile_jinja_template(template).render(**variables)
        except jinja2.exceptions.UndefinedError as e:
            entry["error"] = ""
            entry["python_error"] = f"{type(e).__name__}: {e}"
        except jinja2.exceptions.TemplateError as e:
            entry["error"] = str(e)
        except Exception as e:
            entry["error"] = ""
            entry["python_error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
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
    snippets = render_snippets()
    doc = {"generator": "scripts/make_chat_template_goldens.py",
           "transformers": transformers.__version__, "jinja2": jinja2.__version__,
           "strftime_now": FIXED_NOW.isoformat(), "snippets": snippets}
    (HERE / "snippets.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(snippets)} snippets, {sum('error' in c for c in snippets)} raise")


if __name__ == "__main__":
    main()
