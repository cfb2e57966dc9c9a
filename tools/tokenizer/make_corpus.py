#!/usr/bin/env python3
"""Writes the tokenizer test inputs into tests/fixtures/tokenizer/.

The inputs are code (this file) so that unusual characters stay readable; the JSON files
it writes are committed, and make_goldens.py turns them into reference outputs.

  corpus.json          strings to encode, one per named case
  variants.json        patches to the Qwen3 tokenizer.json exercising other features
  conversations.json   chat-template inputs (messages, tools, kwargs)
  jinja_features.json  small templates covering each supported Jinja construct
"""
import argparse
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parents[2]


def long_random_word(seed, n, alphabet):
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


CORPUS = {
    "empty": "",
    "single_space": " ",
    "single_newline": "\n",
    "english_prose": (
        "It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness. The committee's 2023 report (pp. 14-17) argued "
        "that \"reasonable people\" would disagree; nevertheless, the vote passed 7-2."
    ),
    "english_caps": "THE QUICK BROWN FOX Jumps Over The LAZY DOG. iPhone eBay McDonald's NASA's",
    "contractions_lower": "i'm you're he's she'd we'll they've can't don't it's y'all o'clock",
    "contractions_upper": "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE CAN'T DON'T IT'S",
    "contractions_mixed": "I'm You'Re He'S sHe'D We'Ll They'vE 'S 'T 'RE 'VE 'M 'LL 'D 's't're've'm'll'd",
    "contractions_unicode": "Iſ 'ſ don’t I’M 'K 'K 'ß l'Ł",
    "code_cpp": (
        "#include <vector>\n\ntemplate <typename T>\nstatic T sum(const std::vector<T>& v) {\n"
        "\tT acc{};\n\tfor (const auto& x : v) acc += x;  // accumulate\n\treturn acc;\n}\n"
        "int main(){return sum<int>({1,2,3})==6?0:1;}\n"
    ),
    "code_python": (
        "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
        "if __name__ == '__main__':\n    print(f\"{fib(30)=}\")  # 832040\n"
    ),
    "code_json": '{"name": "petrel", "version": [1, 2, 3], "ok": true, "nested": {"x": null, "y": -1.5e-3}}',
    "code_shell": "for f in *.txt; do\n  grep -Hn 'TODO' \"$f\" || true\ndone 2>&1 | tee /tmp/log && echo $?",
    "markdown": "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- item *one*\n- item **two**\n\n```python\nx = 1\n```\n",
    "chinese": "自然语言处理是人工智能的一个重要分支。今天天气很好，我们去公园散步吧！",
    "japanese": "吾輩は猫である。名前はまだ無い。カタカナとひらがな、ｶﾀｶﾅ（半角）も。",
    "korean": "안녕하세요, 세계! 한국어 토크나이저 테스트입니다.",
    "korean_jamo_decomposed": "\u1100\u1161\u11a8\u1102\u1161 \u110b\u1161\u11ab\u1102\u1167\u11bc",
    "arabic": "مرحبا بالعالم! هذه جملة عربية مع تشكيل: اَلْعَرَبِيَّةُ لُغَةٌ جَمِيلَةٌ. ١٢٣٤٥",
    "hebrew": "שָׁלוֹם עוֹלָם, זהו מבחן.",
    "cyrillic": "Привет, мир! Съешь же ещё этих мягких французских булок. Ґанок і Їжак, ЁЛКА.",
    "greek": "Γειά σου Κόσμε! ΑΒΓΔ αβγδ ΐΰ",
    "devanagari": "नमस्ते दुनिया। हिन्दी में परीक्षण क्षत्रिय",
    "thai": "สวัสดีชาวโลกภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "vietnamese": "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ",
    "emoji_simple": "I love 🍕 and 🎉! 😀😃😄 ok👍",
    "emoji_zwj": "family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍💋‍👨 tech: 🧑🏽‍💻 rainbow: 🏳️‍🌈 pirate: 🏴‍☠️",
    "emoji_modifiers": "👍🏻👍🏼👍🏽👍🏾👍🏿 ✋🏿 keycaps 1️⃣#️⃣*️⃣ flags 🇯🇵🇺🇸🇪🇺 ☺︎ ☺️",
    "combining_marks": "cafe\u0301 nai\u0308ve Ame\u0301lie A\u030a \u212b \u2126 q\u0307\u0323 o\u0323\u0302 e\u0301\u0301",
    "combining_standalone": "\u0301 \u0301\u0301x \u0308",
    "nfc_singletons": "\u212b\u2126\u212a \u2000\u2001 \u0340\u0341 \u0344",
    "zalgo": "Z\u0351\u036b\u0343\u036a\u0302a\u0357\u0311l\u0352g\u0310o\u0315",
    "digits_long": "12345678901234567890123456789012345678901234567890 000000000 9876543210",
    "digits_formats": "3.14159 1,000,000 1e10 0x1F 2024-01-31 +1 (555) 123-4567 v1.2.3-rc.4",
    "digits_unicode": "١٢٣ ۴۵۶ १२३ １２３ ²³ ½ Ⅻ ① 𝟙𝟚",
    "whitespace_runs": "a  b   c    d     e\n\nf\n\n\ng  \n  h",
    "whitespace_edges": "   leading and trailing   ",
    "whitespace_only": " \t \n \r\n   \t\t",
    "whitespace_unicode": "a\u00a0b\u2003c\u3000d\u202fe\u205ff\u1680g\u2028h\u2029i\u0085j",
    "whitespace_odd": "a\u180eb\u200bc\u200cd\u200de\ufefff\u000bg\u000ch",
    "crlf": "line one\r\nline two\r\n\r\nline three\rline four\n\r\n",
    "tabs": "\tcol1\tcol2\t\tcol3\n\t\t\tdeep\t \tmixed",
    "indentation": "    if (x) {\n        y();\n    }\n\n        \n",
    "specials_embedded": "Hello<|im_end|>world <|endoftext|> end<|im_start|>",
    "specials_chat": "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n",
    "specials_adjacent": "<|im_start|><|im_start|><|im_end|>x<|endoftext|><|endoftext|>",
    "specials_partial": "<|im_start <|im_end| |im_start|> <|IM_START|> < |endoftext| >",
    "specials_tools": "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><tool_response>ok</tool_response>",
    "specials_vision": "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>describe",
    "specials_fim": "<|fim_prefix|>def f():<|fim_suffix|>    return 1<|fim_middle|>",
    "long_word_repeat": "a" * 600,
    "long_word_random": long_random_word(1, 1500, "abcdefghijklmnopqrstuvwxyz"),
    "long_word_mixed": long_random_word(2, 800, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"),
    "long_word_cjk": long_random_word(3, 300, "的一是不了人我在有他这为之大来以个中上们"),
    "long_url": "https://example.com/" + "/".join(["path%02d" % i for i in range(40)]) + "?q=" + "x" * 100,
    "long_punct": "!!!???...---===+++***" * 10 + "~" * 50,
    "punctuation_mix": "Hello, world! (a) [b] {c} <d> \"e\" 'f' `g` a...b a--b a/b a\\b @user #tag $5 100% ^_^ &amp;",
    "control_chars": "a\u0000b\u0001c\u001fd\u007fe\u0080f",
    "math_symbols": "∀x∈ℝ: x²≥0 ∑ᵢ aᵢ ≤ ∞ → λ ∘ ∫₀¹ f(t) dt ≈ π ≠ √2",
    "box_and_misc": "┌─┐│└┘ ★☆ ♠♥ ℃ ™ © ® § ¶ † ‡ • ° ± × ÷",
    "fullwidth_and_ligatures": "ＡＢＣ ａｂｃ ﬁﬂ ﬀ Ǆǅǆ ﹏",
    "astral": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁 🀄 𓀀 \U0010fffd",
    "mixed_scripts": "Hello世界Привет مرحبا123abc😀δοκιμή",
    "repeated_lines": "same line\n" * 8,
}

# Each variant patches the Qwen3 tokenizer.json: "set" replaces the value at a key path,
# "append" adds a value to the list at a key path.
VARIANTS = [
    {
        "name": "gpt2_byte_level",
        "patches": [{"op": "set", "path": ["pre_tokenizer"], "value": {
            "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}],
    },
    {
        "name": "ignore_merges",
        "patches": [{"op": "set", "path": ["model", "ignore_merges"], "value": True}],
    },
    {
        "name": "no_normalizer",
        "patches": [{"op": "set", "path": ["normalizer"], "value": None}],
    },
    {
        "name": "split_behaviors",
        "patches": [{"op": "set", "path": ["pre_tokenizer"], "value": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{P}+"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\n+"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}],
    },
    {
        "name": "added_token_flags",
        "patches": [
            {"op": "append", "path": ["added_tokens"], "value": {
                "id": 151669, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False,
                "normalized": False, "special": True}},
            {"op": "append", "path": ["added_tokens"], "value": {
                "id": 151670, "content": "[WORD]", "single_word": True, "lstrip": False, "rstrip": False,
                "normalized": False, "special": False}},
            {"op": "append", "path": ["added_tokens"], "value": {
                "id": 151671, "content": "<pad>", "single_word": False, "lstrip": False, "rstrip": True,
                "normalized": False, "special": True}},
            {"op": "append", "path": ["added_tokens"], "value": {
                "id": 151672, "content": "cafe\u0301", "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": True, "special": False}},
            {"op": "append", "path": ["added_tokens"], "value": {
                "id": 151673, "content": "<|im_start|>user", "single_word": False, "lstrip": True,
                "rstrip": True, "normalized": False, "special": True}},
        ],
        "extra_corpus": {
            "lstrip": "a <mask> b  \t<mask>c<mask>",
            "single_word": "[WORD] in [WORD]s and a[WORD] or ([WORD]) _[WORD] é[WORD] [WORD]\u0301 [WORD]-x",
            "rstrip": "<pad>   next<pad>\n\nline <pad>",
            "normalized": "un cafe\u0301 et un caf\u00e9, CAFE\u0301, cafe",
            "longest_match": "x  <|im_start|>user \n hi <|im_start|>assistant",
        },
    },
]


def tool(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


WEATHER = tool("get_weather", "Get the current weather in a city.", {
    "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
}, ["city"])
SEARCH = tool("search", "Search the web.", {
    "query": {"type": "string"},
    "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
    "filters": {"type": "object", "properties": {"site": {"type": ["string", "null"]},
                                                 "recent": {"type": "boolean"}}},
    "weights": {"type": "array", "items": {"type": "number"}, "example": [0.5, 1.0, 2.5e-7]},
}, ["query"])


def call(name, arguments, wrapped=True):
    fn = {"name": name, "arguments": arguments}
    return {"type": "function", "function": fn} if wrapped else fn


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER_HI = {"role": "user", "content": "Hi! Who are you?"}
TOOL_TURNS = [
    {"role": "user", "content": "What's the weather in Paris and Tokyo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Tokyo", "unit": "celsius"})]},
    {"role": "tool", "content": "{\"temp\": 18, \"sky\": \"cloudy\"}"},
    {"role": "tool", "content": "{\"temp\": 25, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "Paris: 18 °C, cloudy. Tokyo: 25 °C, clear."},
]

CONVERSATIONS = [
    {"name": "single_user", "messages": [USER_HI], "add_generation_prompt": True},
    {"name": "single_user_no_prompt", "messages": [USER_HI], "add_generation_prompt": False},
    {"name": "system_user", "messages": [SYSTEM, USER_HI], "add_generation_prompt": True},
    {"name": "thinking_off", "messages": [SYSTEM, USER_HI], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": False}},
    {"name": "thinking_on", "messages": [USER_HI], "add_generation_prompt": True,
     "kwargs": {"enable_thinking": True}},
    {"name": "multi_turn", "messages": [
        SYSTEM, {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "11"},
        {"role": "user", "content": "Sum them."}], "add_generation_prompt": True},
    {"name": "reasoning_content_last_turn", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "\nSimple arithmetic: 2+2=4.\n"}],
     "add_generation_prompt": False},
    {"name": "reasoning_content_history", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic."},
        {"role": "user", "content": "And 3+3?"}], "add_generation_prompt": True},
    {"name": "think_tags_in_content", "messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."}],
     "add_generation_prompt": False},
    {"name": "think_tags_history", "messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nFrance.\n</think>\n\nParis."},
        {"role": "user", "content": "And Italy?"}], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"name": "tools_full_exchange", "messages": [SYSTEM] + TOOL_TURNS, "tools": [WEATHER, SEARCH],
     "add_generation_prompt": False},
    {"name": "tools_no_system", "messages": TOOL_TURNS[:4], "tools": [WEATHER], "add_generation_prompt": True},
    {"name": "tool_call_string_arguments", "messages": [
        {"role": "user", "content": "Search for petrels."},
        {"role": "assistant", "content": "Let me search.", "tool_calls": [
            call("search", "{\"query\": \"petrel bird\", \"top_k\": 3}")]},
        {"role": "tool", "content": "Petrels are seabirds."}], "tools": [SEARCH], "add_generation_prompt": True},
    {"name": "tool_call_unwrapped", "messages": [
        {"role": "user", "content": "Search for petrels."},
        {"role": "assistant", "content": "", "tool_calls": [
            call("search", {"query": "petrel", "top_k": 2, "filters": {"site": None, "recent": True},
                            "weights": [1, 0.25, -3.5e-5]}, wrapped=False)]},
        {"role": "tool", "content": "Petrels are seabirds."}], "tools": [SEARCH], "add_generation_prompt": True},
    {"name": "multi_step_tools", "messages": [
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "content": "", "reasoning_content": "Need weather first.",
         "tool_calls": [call("get_weather", {"city": "Oslo"})]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "Checking alternatives.", "reasoning_content": "Rain; search.",
         "tool_calls": [call("search", {"query": "sunny cities"})]},
        {"role": "tool", "content": "Lisbon"}], "tools": [WEATHER, SEARCH], "add_generation_prompt": True},
    {"name": "user_tool_response_content", "messages": [
        {"role": "user", "content": "Look this up."},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "x"})]},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "Got it."}],
     "tools": [SEARCH], "add_generation_prompt": False},
    {"name": "unicode_content", "messages": [
        {"role": "system", "content": "Réponds en français. 日本語も可。"},
        {"role": "user", "content": "Ünïcödé 👨‍👩‍👧 \"quotes\" \\backslash\\ <tags> & \t tab"}],
     "tools": [WEATHER], "add_generation_prompt": True},
    {"name": "whitespace_content", "messages": [
        {"role": "system", "content": "  padded system  \n"},
        {"role": "user", "content": "\n\n  spaced question  \n\n"},
        {"role": "assistant", "content": "\n  answer with spaces  \n"}], "add_generation_prompt": False},
    {"name": "system_not_first", "messages": [
        {"role": "user", "content": "hi"}, {"role": "system", "content": "late system"},
        {"role": "user", "content": "again"}], "add_generation_prompt": True},
    {"name": "assistant_content_null", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Rome"})]},
        {"role": "tool", "content": "sunny"}], "tools": [WEATHER], "add_generation_prompt": True},
    {"name": "multimodal_list_content", "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A petrel."}]},
        {"role": "user", "content": [{"type": "text", "text": "And this?"}, {"type": "video"}]}],
     "add_generation_prompt": True, "kwargs": {"add_vision_id": True}},
    {"name": "no_messages", "messages": [], "add_generation_prompt": True},
    {"name": "only_tool_messages", "messages": [{"role": "tool", "content": "orphan"}],
     "add_generation_prompt": True},
]

# Each feature template renders with the variables in "vars" under Hugging Face's settings.
JINJA_FEATURES = {
    "whitespace_trim_blocks": "{% if true %}\nA\n{% endif %}\nB\n  {% if true %}  C\n  {% endif %}\nD",
    "whitespace_dash": "x  {{- ' y ' -}}  z\n  {%- if true -%}  w  {%- endif -%}\n v {#- c -#} u",
    "whitespace_plus": "a\n  {%+ if true %}b{% endif +%}\nc\n{%+ if 1 %}d{% endif %}",
    "whitespace_comments": "a\n  {# comment #}\nb {# inline #} c\n{#- x #}\nd",
    "whitespace_variable_line": "  {{ 'v' }}\n  {% set q = 1 %}\nend\n",
    "crlf_template": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
    "literals": "{{ 1 }} {{ -2 }} {{ 3.5 }} {{ 1e3 }} {{ 0.1 }} {{ 1e-7 }} {{ 12345678901234567.0 }} {{ true }} "
                "{{ none }} {{ 'a\\tb' }} {{ \"q'\" }} {{ '\\u00e9\\x41\\n' }} {{ [1, 'a', none, true] }} "
                "{{ {'k': 'v', 'n': [1.5]} }} {{ (1, 2) }} {{ 10 / 4 }} {{ 10 // 4 }} {{ -7 // 2 }} {{ -7 % 3 }} "
                "{{ 2 ** 10 }} {{ 7 / 7 }} {{ 'ab' * 3 }} {{ 1 + 2.5 }} {{ 'x' ~ 1 ~ none }} {{ 'O\\'Brien' }}",
    "operators": "{{ 1 < 2 and 2 <= 2 and not 3 > 4 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} "
                 "{{ 1 == 1.0 }} {{ true == 1 }} {{ none is none }} {{ 'b' > 'a' }} {{ [1, 2] == [1, 2] }} "
                 "{{ 1 if false }} {{ 'y' if 0 else 'n' }} {{ (1 or 0) and 'z' }} {{ '' or 'fallback' }} "
                 "{{ -(3 - 5) }} {{ 2 + 3 * 4 - 1 }} {{ 'k' in {'k': 1} }} {{ [1] + [2] }}",
    "strings": "{{ s.startswith('He') }} {{ s.endswith(('x', 'd')) }} {{ s.split(' ') }} {{ s.split() }} "
               "{{ s.split('l', 1) }} {{ s.rsplit('l', 1) }} {{ p.strip() }}|{{ p.lstrip() }}|{{ p.rstrip() }}| "
               "{{ p.strip(' \\n') }} {{ s.strip('Hd') }} {{ s.upper() }} {{ s.lower() }} {{ s.title() }} "
               "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 2) }} {{ s.find('o') }} {{ s.count('l') }} "
               "{{ '-'.join(['a', 'b']) }} {{ s[1] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[::2] }} "
               "{{ u[1:3] }} {{ u|length }} {{ u[::-1] }} {{ s.capitalize() }} {{ 'abc'.isalpha() }} "
               "{{ '123'.isdigit() }} {{ ' '.isspace() }} {{ s.lstrip('Hel') }} {{ s[10:] }} {{ s[-3:-1] }}",
    "filters": "{{ xs|length }} {{ xs|first }} {{ xs|last }} {{ xs|join(', ') }} {{ xs|reverse|list }} "
               "{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ xs|sum }} {{ xs|min }} {{ xs|max }} "
               "{{ undefined_var|default('dflt') }} {{ ''|default('e', true) }} {{ none|d('n') }} "
               "{{ '  t  '|trim }} {{ 'x'|upper }}{{ 'Y'|lower }} {{ 'a b'|replace(' ', '_') }} "
               "{{ '42'|int + 1 }} {{ '2.5'|float }} {{ -3|abs }} {{ 3.14159|round(2) }} {{ 2.5|round }} "
               "{{ 7|string ~ '!' }} {{ 'abc'|list }} {{ 'hello world'|capitalize }} {{ 'hello world'|title }} "
               "{{ d|items|list }} {{ d|dictsort }} {{ xs|unique|list }} {{ 'x'|safe }} {{ [1,2,3]|count }} "
               "{{ 'line1\\nline2'|indent(2) }}|{{ 'line1\\nline2'|indent(2, true) }} {{ 'abc'|wordcount }}",
    "filters_attribute": "{{ people|map(attribute='name')|join('/') }} {{ people|selectattr('admin')|map(attribute='name')|list }} "
                         "{{ people|rejectattr('admin')|list|length }} {{ people|sort(attribute='age')|map(attribute='age')|list }} "
                         "{{ xs|select('odd')|list }} {{ xs|reject('even')|list }} {{ xs|map('string')|join }} "
                         "{{ people|selectattr('age', 'gt', 30)|map(attribute='name')|first }} "
                         "{{ people|selectattr('name', 'equalto', 'Bo')|list|length }}",
    "tojson": "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ [1.0, 2, 'é', none, true, {}]|tojson }}\n"
              "{{ 'quote\" back\\\\ nl\\n tab\\t ctl\\x01 uni\\u2028'|tojson }}\n{{ {'b': 1, 'a': [[], {}]}|tojson(indent=4) }}\n"
              "{{ d|tojson(sort_keys=true) }} {{ 1e100|tojson }} {{ -0.0|tojson }} {{ 3|tojson }}",
    "tests": "{{ x is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none is none }} {{ 's' is string }} "
             "{{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} "
             "{{ {} is mapping }} {{ [] is sequence }} {{ 's' is sequence }} {{ {} is sequence }} {{ 1 is iterable }} "
             "{{ 's' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} "
             "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 'A' is upper }} "
             "{{ 'a' is lower }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 3 is ge 3 }} {{ 1 is in [1] }} "
             "{{ x is not none }} {{ raise_exception is callable }} {{ none is sameas none }} {{ 5 is gt 3 }}",
    "for_loop": "{% for x in xs %}[{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} "
                "{{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ loop.previtem }} {{ loop.nextitem }} "
                "{{ loop.cycle('a', 'b') }}]{% endfor %}",
    "for_filter_else": "{% for x in xs if x > 2 %}{{ x }}:{{ loop.length }},{% else %}none{% endfor %}|"
                       "{% for x in [] %}x{% else %}empty{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|"
                       "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}|"
                       "{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
    "loop_controls": "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
                     "{{ x }}{% endfor %}|{% for i in range(3) %}{% for j in range(3) %}{% if j > i %}{% break %}{% endif %}"
                     "{{ i }}{{ j }} {% endfor %}{% endfor %}",
    "nested_loops": "{% for row in [[1, 2], [3]] %}{% for v in row %}{{ loop.depth }}:{{ v }}{% if not loop.last %},{% endif %}"
                    "{% endfor %}{% if not loop.last %};{% endif %}{% endfor %} {{ range(2, 10, 3)|list }} {{ range(5)|list }}",
    "scoping": "{% set a = 1 %}{% for x in [1] %}{% set a = 2 %}in:{{ a }}{% endfor %} out:{{ a }}"
               "{% if true %}{% set b = 3 %}{% endif %} b:{{ b }}"
               "{% set ns = namespace(n=0, items='') %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %} n:{{ ns.n }}"
               "{% set p, q = 7, 8 %} {{ p }}{{ q }}{% set blk %}inner {{ a }}{% endset %} [{{ blk }}]",
    "macros": "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Ann') }} {{ greet('Bo', punct='?') }} {{ greet(name='Cy') }}"
              "{% macro outer(v) %}<{{ greet(v) }}|{{ x }}>{% endmacro %} {{ outer('Di') }}"
              "{% macro ws() %}\n  {{- 'a' }}\n{% endmacro %}[{{ ws() }}] {{ greet('E')|upper }}",
    "if_elif": "{% for v in [0, 1, 2, 3] %}{% if v == 0 %}zero{% elif v == 1 %}one{% elif v is even %}even{% else %}other"
               "{% endif %} {% endfor %}",
    "dict_access": "{{ d.a }} {{ d['b'] }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d.missing }}| "
                   "{{ d.keys()|list }} {{ d.values()|list }} {{ people[0].name }} {{ people[-1]['age'] }} {{ xs[10] }}|"
                   "{{ d.items()|list }} {{ d|length }} {{ (d.a ~ '') }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-2] }}",
    "raw_block": "{% raw %}{{ not rendered }} {% if %}{% endraw %} after {%- raw %} x {% endraw -%} y",
    "generation_block": "{% for m in xs %}{% generation %}<{{ m }}>{% endgeneration %}{% endfor %}",
    "special_vars": "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages|length }}",
    "print_values": "{{ xs }} {{ d }} {{ people[0] }} {{ 's' }} {{ none }} {{ nope }} {{ ['q\\'s', \"d\\\"q\", 'n\\nl'] }} "
                    "{{ 1.5e300 * 1e10 }} {{ 1/3 }} {{ 2.0 ** 0.5 }} {{ 9007199254740993 }} {{ 2 ** 62 }} {{ 0.0001 }} {{ 0.00001 }}",
}

# Corner cases of whitespace control, scoping, Python value semantics and case mapping.
EDGE_CASES = {
 "lstrip_dash": "a\n    {%- if true %}\n  x\n    {% endif -%}\n  y",
 "comment_trim": "a {# c #}\nb\n  {#- d -#}  \nc",
 "nested_macro_scope": "{% set g = 'G' %}{% macro a(x) %}{{ x }}{{ g }}{% set g = 'L' %}{{ g }}{% endmacro %}{{ a(1) }}{{ g }}",
 "loop_in_macro": "{% macro m(items) %}{% for i in items %}{{ loop.index }}{{ i }}{% endfor %}{% endmacro %}{{ m(['a','b']) }}",
 "set_in_if_in_loop": "{% for i in [1,2] %}{% if i == 1 %}{% set v = 'x' %}{% endif %}[{{ v }}]{% endfor %}",
 "ns_in_loop": "{% set ns = namespace(a=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + [i] %}{% endfor %}{{ ns.a }}",
 "string_escapes": "{{ '\\'\\\"\\\\\\n\\t\\x41\\u00e9\\101' }}|{{ \"a'b\" }}|{{ 'a\\qb' }}",
 "tojson_nested": "{{ {'a': [1, {'b': none}], 'c': 'é\"'} | tojson(indent=2, sort_keys=true) }}",
 "filters_chain": "{{ ' A b '|trim|lower|replace('b', 'c')|upper }}",
 "cond_chain": "{{ 'a' if false else 'b' if false else 'c' }}",
 "compare_chain": "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 != 2 }}",
 "slice_neg": "{{ [1,2,3,4,5][-2:] }} {{ [1,2,3,4,5][:-2:2] }} {{ 'hello'[-3:] }} {{ [1,2,3][5:] }} {{ 'abc'[::-2] }}",
 "float_print": "{{ 1.5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123456789 }} {{ 0.1 * 3 }} {{ -1e-10 }} {{ 2.0 }}",
 "int_ops": "{{ 7 // -2 }} {{ -7 % 2 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 / 3 }}",
 "attr_on_none": "{{ none.x is defined }} {{ none['y'] is defined }}",
 "dict_order_and_get": "{% set d = {'z': 1, 'a': 2} %}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}{{ d.get('q', 'no') }}",
 "join_attribute": "{{ [{'n': 'a'}, {'n': 'b'}]|join(',', attribute='n') }}",
 "is_sequence": "{{ 'x' is string and 'x' is not mapping }} {{ none is not none }}",
 "whitespace_var_dash": "a  {{- 1 -}}  b  {{ 2 }}  c",
 "raw_lstrip": "x\n    {% raw %}  y  {% endraw %}\nz",
 "macro_kw_default_ref": "{% macro f(a, b=a) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, b=3) }}",
 "loop_else_filter": "{% for x in [1,2] if x > 5 %}{{ x }}{% else %}none{% endfor %}",
 "unicode_upper": "{{ 'straße ǆ éa'|upper }} {{ 'ÉCOLE'|lower }} {{ 'hello wORLD'.title() }} {{ 'a-b c(d'|title }}",
 "indent_filter": "{{ 'a\\n\\nb'|indent }}|{{ 'a\\nb'|indent(width='> ', first=true) }}",
 "in_ops": "{{ 'ab' in ['ab'] }} {{ 'a' not in 'xyz' }} {{ 1 in [1.0] }}",
 "block_set_ws": "{% set x %}\n  inner\n{% endset %}[{{ x }}]",
 "strip_chars": "{{ 'xxhixx'.strip('x') }} {{ '<<a>>'.lstrip('<') }} {{ '  a  '.rstrip() }}|",
 "split_max": "{{ 'a b c d'.split(' ', 2) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  '.split() }} {{ ''.split(',') }}",
 "bool_arith": "{{ true + true }} {{ 3 * true }} {{ 'x' * 2 }}",
 "nested_loop_vars": "{% for a in [1,2] %}{% for b in [3] %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
 "items_nested": "{% for k, v in {'a': {'b': 1}}|items %}{{ k }}={{ v|tojson }}{% endfor %}",
 "default_chain": "{{ nope|default(none)|string }} {{ nope is defined }} {{ (nope or 'x') }}",
 "round_variants": "{{ 2.675|round(2) }} {{ 0.5|round }} {{ 1.5|round }} {{ 2.5|round(0, 'ceil') }} {{ 7|round(1) }}",
 "string_concat_num": "{{ 'n=' ~ 1.0 ~ ' ' ~ [1] ~ ' ' ~ {'a': none} }}",
}

JINJA_FEATURES.update({'edge_' + k: v for k, v in EDGE_CASES.items()})

FEATURE_VARS = {
    "s": "Hello World", "p": "  \n padded\t \n", "u": "héllo wörld",
    "xs": [3, 1, 4, 1, 5, 9, 2, 6], "x": "ex",
    "d": {"b": 2, "a": 1, "c": {"n": [1, 2]}, "é": "ü"},
    "people": [{"name": "Ann", "age": 31, "admin": True}, {"name": "Bo", "age": 25, "admin": False},
               {"name": "Cy", "age": 40, "admin": False}],
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": False, "messages": [{"role": "user"}],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/tokenizer"))
    out = pathlib.Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "corpus.json": CORPUS,
        "variants.json": VARIANTS,
        "conversations.json": CONVERSATIONS,
        "jinja_features.json": {"vars": FEATURE_VARS, "templates": JINJA_FEATURES},
    }
    for name, value in files.items():
        text = json.dumps(value, ensure_ascii=False, indent=1) + "\n"
        (out / name).write_text(text, encoding="utf-8")
        print(f"{name}: {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
