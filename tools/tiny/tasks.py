#!/usr/bin/env python3
"""The exact tasks petrel-tiny is trained on: generator, answer formats and chat rendering.

Pure Python (no third-party packages), so it runs anywhere:

    python3 tools/tiny/tasks.py --show 3                  # a few examples of every task
    python3 tools/tiny/tasks.py --heldout heldout.jsonl   # the 200 held-out problems
    python3 tools/tiny/tasks.py --selftest                # checks every answer format

Tasks (every answer is exactly checkable):
  add      What is 48213 + 9377?        -> "Digits from the right: 09575\\nAnswer: 57590"
  sub      What is 48213 - 9377?        -> "Digits from the right: 63883\\nAnswer: 38836"
  reverse  Reverse the word kolapi.     -> "ipalok"
  sort     Sort 42, 7, 19 from smallest to largest.  -> "7, 19, 42"
  count    How many times does the letter a appear in banana?  -> "3"

Arithmetic: operands have 1 to 6 digits; subtraction problems always have a >= b (the result is
never negative). The model first writes the result's digits from the right (the ones digit
first, the way one adds by hand: each digit then depends only on the two operand digits of its
column and the carry from the column before), then the result itself on a line "Answer: N".
The final line of every response is the answer.
"""
import argparse
import json
import random
import string
import sys

SYSTEM_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD, IM_START, IM_END = SYSTEM_TOKENS

# Share of each task in the training mix and number of each in the held-out set (200 in all).
MIX = {"add": 0.28, "sub": 0.28, "reverse": 0.15, "sort": 0.14, "count": 0.15}
HELDOUT_COUNTS = {"add": 50, "sub": 50, "reverse": 35, "sort": 30, "count": 35}
HELDOUT_SEED = 20260101

# Chat template (Qwen style, no default system message); rendered identically by render_chat().
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def render_chat(messages, add_generation_prompt=True):
    """What CHAT_TEMPLATE renders for `messages` (list of {"role", "content"})."""
    out = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return out + (f"{IM_START}assistant\n" if add_generation_prompt else "")


class Example:
    __slots__ = ("task", "question", "response", "answer", "key")

    def __init__(self, task, question, response, answer, key):
        self.task, self.question, self.response, self.answer, self.key = task, question, response, answer, key

    def to_json(self):
        return {"task": self.task, "question": self.question, "response": self.response, "answer": self.answer}


# ----------------------------------------------------------------------------- arithmetic

def rand_number(rng, digits):
    if digits == 1:
        return rng.randrange(10)
    return rng.randrange(10 ** (digits - 1), 10 ** digits)


def carry_heavy_pair(rng):
    """Operands whose aligned digits often sum to 9 or more: long carry chains (99999 + 1)."""
    la, lb = rng.randint(1, 6), rng.randint(1, 6)
    a = rand_number(rng, la)
    da = str(a).zfill(6)
    db = []
    for i in range(6):
        r = rng.random()
        d = int(da[i])
        if r < 0.45:
            db.append(9 - d)
        elif r < 0.8:
            db.append(rng.randint(max(0, 10 - d), 9) if d > 0 else 9)
        else:
            db.append(rng.randrange(10))
    b = int("".join(map(str, db))[6 - lb:]) if lb > 0 else 0
    return a, b


def close_pair(rng):
    """a >= b with b close to a: results with leading zeros and long borrow chains (1000 - 999)."""
    a = rand_number(rng, rng.randint(1, 6))
    k = rng.randint(0, max(0, len(str(a)) - 1))
    b = a - rng.randrange(0, 10 ** k + 1)
    if b < 0:
        b = rng.randrange(0, a + 1)
    if rng.random() < 0.3 and a >= 10:  # a round number minus something just below it
        a = 10 ** (len(str(a)) - 1) * rng.randint(1, 9)
        b = a - rng.randint(1, min(a, 10 ** rng.randint(0, len(str(a)) - 1)))
    return a, b


def digits_from_the_right(n, width):
    return str(n).zfill(width)[::-1]


ARITH_FORMS = (("What is {a} {op} {b}?", 0.6), ("Calculate {a} {op} {b}.", 0.2), ("{a} {op} {b} = ?", 0.2))


def pick(rng, weighted):
    r, acc = rng.random(), 0.0
    for item, w in weighted:
        acc += w
        if r < acc:
            return item
    return weighted[-1][0]


def arithmetic_response(a, b, op):
    """The response: digits of the result from the right, then the result."""
    if op == "+":
        s = a + b
        width = max(len(str(a)), len(str(b)))
        if len(str(s)) > width:
            width += 1
    else:
        assert a >= b
        s = a - b
        width = len(str(a))  # every column of a, leading zeros included
    return f"Digits from the right: {digits_from_the_right(s, width)}\nAnswer: {s}", str(s)


def make_add(rng):
    if rng.random() < 0.2:
        a, b = carry_heavy_pair(rng)
        if rng.random() < 0.5:
            a, b = b, a
    else:
        a, b = rand_number(rng, rng.randint(1, 6)), rand_number(rng, rng.randint(1, 6))
    q = pick(rng, ARITH_FORMS).format(a=a, op="+", b=b)
    resp, ans = arithmetic_response(a, b, "+")
    return Example("add", q, resp, ans, ("add", a, b))


def make_sub(rng):
    if rng.random() < 0.25:
        a, b = close_pair(rng)
    else:
        a, b = rand_number(rng, rng.randint(1, 6)), rand_number(rng, rng.randint(1, 6))
        if a < b:
            a, b = b, a
    q = pick(rng, ARITH_FORMS).format(a=a, op="-", b=b)
    resp, ans = arithmetic_response(a, b, "-")
    return Example("sub", q, resp, ans, ("sub", a, b))


# ----------------------------------------------------------------------------- letters and lists

LETTERS = string.ascii_lowercase


def rand_word(rng, lo, hi, alphabet=LETTERS):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


REVERSE_FORMS = (("Reverse the word {w}.", 0.6), ("Spell {w} backwards.", 0.4))


def make_reverse(rng):
    w = rand_word(rng, 3, 9)
    q = pick(rng, REVERSE_FORMS).format(w=w)
    return Example("reverse", q, w[::-1], w[::-1], ("reverse", w))


SORT_FORMS = (("Sort {xs} from smallest to largest.", 0.6), ("Sort these numbers: {xs}", 0.4))


def make_sort(rng):
    n = rng.randint(3, 5)
    top = rng.choice((10, 100, 100))
    xs = rng.sample(range(top), n)
    q = pick(rng, SORT_FORMS).format(xs=", ".join(map(str, xs)))
    ans = ", ".join(map(str, sorted(xs)))
    return Example("sort", q, ans, ans, ("sort", tuple(sorted(xs))))


COUNT_FORMS = (("How many times does the letter {c} appear in {w}?", 0.6), ("Count the letter {c} in {w}.", 0.4))


def make_count(rng):
    alphabet = "".join(rng.sample(LETTERS, rng.randint(2, 6)))  # few letters: repeats are common
    w = rand_word(rng, 3, 10, alphabet)
    c = rng.choice(w) if rng.random() < 0.85 else rng.choice([x for x in LETTERS if x not in w])
    q = pick(rng, COUNT_FORMS).format(c=c, w=w)
    n = str(w.count(c))
    return Example("count", q, n, n, ("count", c, w))


MAKERS = {"add": make_add, "sub": make_sub, "reverse": make_reverse, "sort": make_sort, "count": make_count}


# ----------------------------------------------------------------------------- sets

def heldout(seed=HELDOUT_SEED):
    """The 200 held-out problems: fixed, distinct, in task order."""
    rng = random.Random(seed)
    out, keys = [], set()
    for task, n in HELDOUT_COUNTS.items():
        got = 0
        while got < n:
            ex = MAKERS[task](rng)
            if ex.key in keys:
                continue
            keys.add(ex.key)
            out.append(ex)
            got += 1
    return out


def training_stream(seed, exclude_keys):
    """Endless training examples in the MIX proportions, never one of `exclude_keys`."""
    rng = random.Random(seed)
    tasks = list(MIX)
    weights = [MIX[t] for t in tasks]
    while True:
        task = rng.choices(tasks, weights)[0]
        ex = MAKERS[task](rng)
        if ex.key not in exclude_keys:
            yield ex


def conversation(rng, stream, max_turns=3):
    """A chat of 2..max_turns user/assistant turns drawn from `stream`."""
    return [next(stream) for _ in range(rng.randint(2, max_turns))]


# ----------------------------------------------------------------------------- checks

def final_line(response):
    """The answer a response gives: its last line, without an 'Answer: ' label."""
    line = response.strip().split("\n")[-1]
    return line[len("Answer: "):] if line.startswith("Answer: ") else line


def selftest():
    rng = random.Random(0)
    for _ in range(20000):
        for task, make in MAKERS.items():
            ex = make(rng)
            assert final_line(ex.response) == ex.answer, (task, ex.question, ex.response)
            if task in ("add", "sub"):
                parts = ex.question.replace("?", "").replace(".", "").replace("=", "").split()
                nums = [p for p in parts if p.isdigit()]
                a, b = int(nums[0]), int(nums[1])
                want = a + b if task == "add" else a - b
                assert want >= 0 and ex.answer == str(want), ex.question
                rev = ex.response.split("\n")[0].split(": ")[1]
                assert int(rev[::-1]) == want, ex.response
                assert len(str(a)) <= 6 and len(str(b)) <= 6
    ho = heldout()
    assert len(ho) == 200 and len({e.key for e in ho}) == 200
    stream = training_stream(1, {e.key for e in ho})
    assert all(next(stream).key not in {e.key for e in ho} for _ in range(1000))
    print("selftest ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--show", type=int, default=0, help="print N examples of every task")
    ap.add_argument("--heldout", help="write the held-out problems as JSON lines to this file")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        selftest()
    if args.show:
        rng = random.Random(1)
        for task, make in MAKERS.items():
            for _ in range(args.show):
                ex = make(rng)
                print(f"[{task}] {ex.question!r} -> {ex.response!r}")
        print(repr(render_chat([{"role": "user", "content": "What is 48213 + 9377?"}])))
    if args.heldout:
        with open(args.heldout, "w") as f:
            for ex in heldout():
                f.write(json.dumps(ex.to_json()) + "\n")
    if not (args.show or args.heldout or args.selftest):
        ap.print_help()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
