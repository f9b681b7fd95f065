#!/usr/bin/env python3
"""Generates the shipped agent suite (tools/bench/data/agent_tasks.json) for `pulse bench agent`:
the hand-written tasks (agent_tasks_base.json) plus tasks made from templates with a fixed seed,
in the categories the field's benchmarks use (BFCL): simple, multiple (one tool among 24),
parallel, parallel_multiple, irrelevance (no call), multi_turn (a call that needs an earlier
call's result), missing_params (the model must ask), long_output (a tool output past 16k tokens)
and error_recovery (a call that fails once); and repository tasks whose checks the model never
sees (hidden tests, as SWE-bench does).

  gen_agent_suite.py                 rewrite tools/bench/data/agent_tasks.json (deterministic)
  gen_agent_suite.py --check         exit 1 if that file is not what this script generates
  gen_agent_suite.py --oracle FILE [--fail-fraction F] [--fail-seed S]
                                     a fake_vllm script that answers every generated tool task
                                     right, except a chosen fraction F answered wrong (tests)
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
SEED = 20261204
SYSTEM = "You are a helpful assistant. Use the tools when they are needed; answer briefly."


def tool(name, desc, props, required):
    return {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
                           "required": required}}


TOOLS = {t["name"]: t for t in [
    tool("get_weather", "Current weather for a city.", {"city": ("string", "city name")}, ["city"]),
    tool("get_forecast", "Weather forecast for a city.", {"city": ("string", "city name"), "days": ("integer", "1-7")}, ["city", "days"]),
    tool("get_stock_price", "Latest price of a stock.", {"symbol": ("string", "ticker symbol")}, ["symbol"]),
    tool("convert_currency", "Convert an amount between currencies.",
         {"amount": ("number", ""), "from_currency": ("string", "ISO code"), "to_currency": ("string", "ISO code")},
         ["amount", "from_currency", "to_currency"]),
    tool("convert_units", "Convert a value between units.", {"value": ("number", ""), "from_unit": ("string", ""), "to_unit": ("string", "")},
         ["value", "from_unit", "to_unit"]),
    tool("get_time", "Current local time in a city.", {"city": ("string", "")}, ["city"]),
    tool("translate", "Translate text.", {"text": ("string", ""), "target_language": ("string", "language name")}, ["text", "target_language"]),
    tool("search_docs", "Search the internal documentation.", {"query": ("string", "")}, ["query"]),
    tool("send_email", "Send an email.", {"to": ("string", ""), "subject": ("string", ""), "body": ("string", "")}, ["to", "subject", "body"]),
    tool("create_event", "Create a calendar event.", {"title": ("string", ""), "date": ("string", "YYYY-MM-DD"), "time": ("string", "HH:MM")},
         ["title", "date", "time"]),
    tool("list_events", "List calendar events on a date.", {"date": ("string", "YYYY-MM-DD")}, ["date"]),
    tool("lookup_user", "Find a user by email; returns the user id.", {"email": ("string", "")}, ["email"]),
    tool("set_role", "Set a user's role.", {"user_id": ("string", ""), "role": ("string", "")}, ["user_id", "role"]),
    tool("get_order", "Order details by order id.", {"order_id": ("string", "")}, ["order_id"]),
    tool("cancel_order", "Cancel an order.", {"order_id": ("string", "")}, ["order_id"]),
    tool("track_package", "Where a package is.", {"tracking_number": ("string", "")}, ["tracking_number"]),
    tool("search_flights", "Search flights; returns flights with ids.",
         {"origin": ("string", "city"), "destination": ("string", "city"), "date": ("string", "YYYY-MM-DD")}, ["origin", "destination", "date"]),
    tool("book_flight", "Book a flight by its id.", {"flight_id": ("string", "")}, ["flight_id"]),
    tool("calculate", "Evaluate an arithmetic expression exactly.", {"expression": ("string", "")}, ["expression"]),
    tool("create_ticket", "Open a support ticket.", {"title": ("string", ""), "severity": ("string", "low, medium or high")}, ["title", "severity"]),
    tool("get_population", "Population of a city.", {"city": ("string", "")}, ["city"]),
    tool("get_distance", "Road distance between two cities in km.", {"origin": ("string", ""), "destination": ("string", "")},
         ["origin", "destination"]),
    tool("set_reminder", "Set a reminder.", {"text": ("string", ""), "time": ("string", "HH:MM")}, ["text", "time"]),
    tool("read_log", "The recent log of a service (can be long).", {"service": ("string", "")}, ["service"]),
]}

CITIES = ["Lisbon", "Madrid", "Paris", "Berlin", "Rome", "Vienna", "Prague", "Warsaw", "Oslo", "Dublin", "Athens", "Helsinki",
          "Budapest", "Zurich", "Brussels", "Amsterdam", "Copenhagen", "Stockholm", "Toronto", "Chicago", "Denver", "Seattle",
          "Osaka", "Seoul", "Sydney", "Nairobi", "Lima", "Quito", "Santiago", "Bogota"]
SYMBOLS = ["ACME", "GLOBX", "INITECH", "UMBRA", "HOOLI", "VANDELAY", "WONKA", "STARK", "WAYNE", "TYRELL", "CYBERD", "MASSIVE"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "SEK", "NOK"]
LANGS = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch"]
WORDS = {"good morning": {"French": "bonjour", "German": "guten Morgen", "Spanish": "buenos dias", "Italian": "buongiorno",
                          "Portuguese": "bom dia", "Dutch": "goedemorgen"},
         "thank you": {"French": "merci", "German": "danke", "Spanish": "gracias", "Italian": "grazie", "Portuguese": "obrigado",
                       "Dutch": "dank je"}}
SERVICES = ["billing", "search", "gateway", "ingest", "auth", "scheduler", "mailer", "reports", "exporter", "uploader"]


def eq(v):
    return {"equals": v}


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.users = set()
        self.tasks = []

    def add(self, category, user, tools, expect, final, oracle, max_turns=None):
        assert '"' not in user and "\\" not in user, user
        assert user not in self.users, "duplicate request: " + user
        self.users.add(user)
        t = {"id": f"{category}_{sum(1 for x in self.tasks if x['category'] == category) + 1:03d}", "kind": "tools",
             "category": category, "system": SYSTEM, "user": user, "tools": list(tools), "expect": expect, "final": final}
        if max_turns:
            t["max_turns"] = max_turns
        t["_oracle"] = oracle  # the right answer, turn by turn: a list of calls, or the final text
        self.tasks.append(t)

    # One-call requests: (tool, request text, expected args, result, what the answer must contain, final text).
    def one_call(self):
        r = self.r
        kind = r.choice(["weather", "stock", "currency", "population", "distance", "time", "translate", "calc", "track"])
        if kind == "weather":
            c, t = r.choice(CITIES), r.randint(-5, 35)
            return ("get_weather", f"What is the weather in {c} right now", {"city": eq(c)}, {"city": c}, {"temp_c": t}, str(t), f"It is {t} C in {c}.")
        if kind == "stock":
            s, p = r.choice(SYMBOLS), round(r.uniform(10, 900), 2)
            return ("get_stock_price", f"What does {s} stock trade at", {"symbol": eq(s)}, {"symbol": s}, {"symbol": s, "price": p}, str(p),
                    f"{s} trades at {p}.")
        if kind == "currency":
            a, f, t = r.choice([50, 120, 250, 1000, 75, 3000]), *r.sample(CURRENCIES, 2)
            v = round(a * r.uniform(0.5, 1.6), 2)
            return ("convert_currency", f"How much is {a} {f} in {t}", {"amount": eq(a), "from_currency": eq(f), "to_currency": eq(t)},
                    {"amount": a, "from_currency": f, "to_currency": t}, {"amount": v, "currency": t}, str(v), f"{a} {f} is {v} {t}.")
        if kind == "population":
            c, n = r.choice(CITIES), r.randint(200000, 9000000)
            return ("get_population", f"How many people live in {c}", {"city": eq(c)}, {"city": c}, {"population": n}, str(n),
                    f"{c} has {n} people.")
        if kind == "distance":
            a, b = r.sample(CITIES, 2)
            km = r.randint(80, 3000)
            return ("get_distance", f"How far is it by road from {a} to {b}", {"origin": eq(a), "destination": eq(b)},
                    {"origin": a, "destination": b}, {"km": km}, str(km), f"{km} km.")
        if kind == "time":
            c, h, m = r.choice(CITIES), r.randint(0, 23), r.choice([5, 15, 25, 35, 45, 55])
            hm = f"{h:02d}:{m:02d}"
            return ("get_time", f"What time is it in {c} now", {"city": eq(c)}, {"city": c}, {"time": hm}, hm, f"It is {hm} in {c}.")
        if kind == "translate":
            w, l = r.choice(list(WORDS)), r.choice(LANGS)
            out = WORDS[w][l]
            return ("translate", f"Translate {w} into {l} with the translator", {"text": {"contains": w}, "target_language": eq(l)},
                    {"text": w, "target_language": l}, {"translation": out}, out, f"{out}")
        if kind == "calc":
            a, b = r.randint(100, 9999), r.randint(100, 9999)
            return ("calculate", f"Use the calculator: what is {a} * {b}", {"expression": {"regex": f"{a}\\s*\\*\\s*{b}"}},
                    {"expression": f"{a} * {b}"}, str(a * b), str(a * b), f"{a * b}")
        num = f"TRK{r.randint(100000, 999999)}"
        place = r.choice(CITIES)
        return ("track_package", f"Where is my package {num}", {"tracking_number": eq(num)}, {"tracking_number": num},
                {"status": "in transit", "location": place}, place, f"It is in transit in {place}.")

    def simple(self, n, multiple=False):
        while sum(1 for t in self.tasks if t["category"] == ("multiple" if multiple else "simple")) < n:
            tool_name, user, checks, args, result, must, final = self.one_call()
            user += "?"
            if user in self.users:
                continue
            tools = sorted(TOOLS) if multiple else [tool_name]
            self.add("multiple" if multiple else "simple", user, tools, [{"tool": tool_name, "args": checks, "result": result}],
                     [{"contains": must}], [[(tool_name, args)], final])

    def parallel(self, n):
        r = self.r
        while sum(1 for t in self.tasks if t["category"] == "parallel") < n:
            kind = r.choice(["weather", "population", "stock"])
            k = r.choice([2, 2, 3, 3, 4])
            if kind == "stock":
                items = r.sample(SYMBOLS, k)
                tname, key, noun = "get_stock_price", "symbol", "stock prices of"
                vals = [round(r.uniform(10, 900), 2) for _ in items]
                res = [{"symbol": s, "price": v} for s, v in zip(items, vals)]
            else:
                items = r.sample(CITIES, k)
                tname, key, noun = ("get_weather", "city", "the weather in") if kind == "weather" else ("get_population", "city", "the population of")
                vals = [r.randint(-5, 35) if kind == "weather" else r.randint(200000, 9000000) for _ in items]
                res = [{"temp_c": v} if kind == "weather" else {"population": v} for v in vals]
            user = f"Look up {noun} " + ", ".join(items[:-1]) + f" and {items[-1]}, all at once."
            if user in self.users:
                continue
            self.add("parallel", user, [tname],
                     [{"tool": tname, "args": {key: eq(i)}, "result": rs} for i, rs in zip(items, res)],
                     [{"contains": str(v)} for v in vals], [[(tname, {key: i}) for i in items], " ".join(f"{i}: {v}." for i, v in zip(items, vals))])

    def parallel_multiple(self, n):
        while sum(1 for t in self.tasks if t["category"] == "parallel_multiple") < n:
            calls = []
            kinds = set()
            while len(calls) < self.r.choice([2, 3]):
                c = self.one_call()
                if c[0] in kinds:
                    continue
                kinds.add(c[0])
                calls.append(c)
            user = "Two things at once: " + "; and ".join(c[1][0].lower() + c[1][1:] for c in calls) + "?"
            if len(calls) == 3:
                user = "Three things at once: " + "; and ".join(c[1][0].lower() + c[1][1:] for c in calls) + "?"
            if user in self.users:
                continue
            self.add("parallel_multiple", user, sorted({c[0] for c in calls}),
                     [{"tool": c[0], "args": c[2], "result": c[4]} for c in calls], [{"contains": c[5]} for c in calls],
                     [[(c[0], c[3]) for c in calls], " ".join(c[6] for c in calls)])

    def irrelevance(self, n):
        r = self.r
        capitals = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima",
                    "Norway": "Oslo", "Greece": "Athens", "Austria": "Vienna", "Ireland": "Dublin"}
        while sum(1 for t in self.tasks if t["category"] == "irrelevance") < n:
            tools = r.sample(["get_weather", "get_stock_price", "send_email", "track_package", "get_distance", "create_ticket"], 3)
            if r.random() < 0.5:
                a, b = r.randint(2, 12), r.randint(2, 12)
                user, must, final = f"Without any tool, what is {a} times {b}?", str(a * b), str(a * b)
            else:
                country = r.choice(list(capitals))
                user, must, final = f"What is the capital of {country}? No lookup needed.", capitals[country], capitals[country]
            if user in self.users:
                continue
            self.add("irrelevance", user, tools, [], [{"contains": must}], [final])

    def multi_turn(self, n):
        r = self.r
        while sum(1 for t in self.tasks if t["category"] == "multi_turn") < n:
            kind = r.choice(["role", "flight", "order"])
            if kind == "role":
                name = r.choice(["alice", "bob", "carol", "dan", "erin", "frank", "grace", "heidi", "ivan", "judy"]) + str(r.randint(1, 99))
                email, uid, role = f"{name}@example.com", f"u_{r.randint(1000, 9999)}", r.choice(["admin", "editor", "viewer"])
                user = f"Make {email} an {role} (look the user up first)."
                expect = [{"tool": "lookup_user", "args": {"email": eq(email)}, "result": {"id": uid}},
                          {"tool": "set_role", "args": {"user_id": eq(uid), "role": eq(role)}, "result": "ok"}]
                oracle = [[("lookup_user", {"email": email})], [("set_role", {"user_id": uid, "role": role})], f"{email} is now {role}."]
                self.add("multi_turn", user, ["lookup_user", "set_role", "send_email"], expect, [{"contains": role}], oracle)
            elif kind == "flight":
                a, b = r.sample(CITIES, 2)
                day = f"2026-12-{r.randint(10, 28)}"
                fid = f"FL{r.randint(100, 999)}"
                user = f"Find a flight from {a} to {b} on {day} and book the first one."
                expect = [{"tool": "search_flights", "args": {"origin": eq(a), "destination": eq(b), "date": eq(day)},
                           "result": [{"id": fid, "depart": "08:10"}, {"id": fid + "X", "depart": "13:40"}]},
                          {"tool": "book_flight", "args": {"flight_id": eq(fid)}, "result": {"confirmation": "C" + fid}}]
                oracle = [[("search_flights", {"origin": a, "destination": b, "date": day})], [("book_flight", {"flight_id": fid})],
                          f"Booked {fid}, confirmation C{fid}."]
                self.add("multi_turn", user, ["search_flights", "book_flight", "get_weather"], expect, [{"contains": "C" + fid}], oracle)
            else:
                oid = f"ORD-{r.randint(10000, 99999)}"
                user = f"Check order {oid} and cancel it if it has not shipped yet."
                expect = [{"tool": "get_order", "args": {"order_id": eq(oid)}, "result": {"order_id": oid, "status": "processing"}},
                          {"tool": "cancel_order", "args": {"order_id": eq(oid)}, "result": "cancelled"}]
                oracle = [[("get_order", {"order_id": oid})], [("cancel_order", {"order_id": oid})], f"Order {oid} is cancelled."]
                self.add("multi_turn", user, ["get_order", "cancel_order", "track_package"], expect, [{"contains": "cancel"}], oracle)

    def missing_params(self, n):
        r = self.r
        while sum(1 for t in self.tasks if t["category"] == "missing_params") < n:
            kind = r.choice(["flight", "event", "email", "convert"])
            if kind == "flight":
                user, tools = f"Book me a flight to {r.choice(CITIES)}.", ["search_flights", "book_flight"]
            elif kind == "event":
                user, tools = f"Put {r.choice(['Dentist', 'Standup', 'Gym', 'Lunch with Sam', 'Review'])} in my calendar for {r.choice(['Monday', 'Friday', 'next week'])}.", ["create_event"]
            elif kind == "email":
                user, tools = f"Email the {r.choice(['quarterly', 'weekly', 'final', 'draft'])} report to {r.choice(['my manager', 'the team', 'finance'])}.", ["send_email"]
            else:
                user, tools = f"Convert {r.randint(2, 500)} into {r.choice(['kilometers', 'pounds', 'liters', 'celsius'])}.", ["convert_units"]
            if user in self.users:
                continue
            self.add("missing_params", user, tools, [], [{"regex": "\\?"}], ["Could you tell me what is missing: which date, time, address or unit?"])

    def long_output(self, n):
        r = self.r
        while sum(1 for t in self.tasks if t["category"] == "long_output") < n:
            svc = r.choice(SERVICES)
            vol = f"vol-{r.randint(10, 99)}"
            user = f"Read the {svc} log and tell me which volume the last error was about ({r.randint(1, 9)} days ago it was fine)."
            if user in self.users:
                continue
            expect = [{"tool": "read_log", "args": {"service": eq(svc)}, "result_pad_chars": 72000,
                       "result": f"2026-11-30T23:59:58 ERROR {svc}: disk quota exceeded on volume {vol}"}]
            self.add("long_output", user, ["read_log", "create_ticket"], expect, [{"contains": vol}], [[("read_log", {"service": svc})], f"{vol}."])

    def error_recovery(self, n):
        while sum(1 for t in self.tasks if t["category"] == "error_recovery") < n:
            tool_name, user, checks, args, result, must, final = self.one_call()
            user = user + "? (the service is flaky: retry if it fails)"
            if user in self.users:
                continue
            self.add("error_recovery", user, [tool_name],
                     [{"tool": tool_name, "args": checks, "result": "error: upstream timeout, please retry"},
                      {"tool": tool_name, "args": checks, "result": result}],
                     [{"contains": must}], [[(tool_name, args)], [(tool_name, args)], final])

    # Repository tasks with hidden checks: the model sees the module and a request; the check is a
    # test it never sees.
    def repo(self, n):
        funcs = [
            ("clamp", "x, lo, hi", "Return x limited to the range [lo, hi].", "    return max(lo, min(x, hi))\n",
             ["clamp(5, 0, 3) == 3", "clamp(-2, 0, 3) == 0", "clamp(2, 0, 3) == 2"]),
            ("is_prime", "n", "True when n is a prime number.", "    if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
             ["is_prime(2)", "is_prime(97)", "not is_prime(1)", "not is_prime(91)", "not is_prime(49)"]),
            ("reverse_words", "s", "The words of s in reverse order, separated by single spaces.", "    return ' '.join(reversed(s.split()))\n",
             ["reverse_words('a b  c') == 'c b a'", "reverse_words('') == ''"]),
            ("count_vowels", "s", "How many of the letters of s are vowels (aeiou, any case).", "    return sum(c in 'aeiou' for c in s.lower())\n",
             ["count_vowels('Banana') == 3", "count_vowels('xyz') == 0", "count_vowels('AEIOU') == 5"]),
            ("fib", "n", "The n-th Fibonacci number, fib(0) == 0, fib(1) == 1.", "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
             ["fib(0) == 0", "fib(1) == 1", "fib(10) == 55"]),
            ("gcd", "a, b", "The greatest common divisor of two non-negative integers.", "    while b:\n        a, b = b, a % b\n    return a\n",
             ["gcd(12, 18) == 6", "gcd(7, 0) == 7", "gcd(17, 5) == 1"]),
            ("dedupe", "items", "The items without repeats, keeping the first of each, in order.",
             "    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
             ["dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]", "dedupe([]) == []"]),
            ("chunk", "items, n", "Split items into lists of n (the last may be shorter).", "    return [items[i:i + n] for i in range(0, len(items), n)]\n",
             ["chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]", "chunk([], 3) == []"]),
            ("sum_digits", "n", "The sum of the decimal digits of a non-negative integer.", "    return sum(int(d) for d in str(n))\n",
             ["sum_digits(0) == 0", "sum_digits(9875) == 29"]),
            ("median", "xs", "The median of a non-empty list of numbers.",
             "    s = sorted(xs)\n    m = len(s) // 2\n    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2\n",
             ["median([3, 1, 2]) == 2", "median([4, 1, 3, 2]) == 2.5"]),
            ("rotate", "items, k", "items rotated left by k places (k may exceed the length).",
             "    if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]\n",
             ["rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]", "rotate([1, 2, 3], 4) == [2, 3, 1]", "rotate([], 2) == []"]),
            ("caesar", "s, k", "Shift each lowercase letter of s by k places in the alphabet (wrapping); keep other characters.",
             "    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)\n",
             ["caesar('abz', 1) == 'bca'", "caesar('hi there!', 13) == 'uv gurer!'"]),
            ("run_length", "s", "Run-length encode s: 'aaab' -> 'a3b1'.",
             "    out = ''\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out += s[i] + str(j - i)\n        i = j\n    return out\n",
             ["run_length('aaab') == 'a3b1'", "run_length('') == ''", "run_length('xyz') == 'x1y1z1'"]),
            ("title_case", "s", "Capitalize the first letter of every word of s and lowercase the rest.",
             "    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))\n",
             ["title_case('hello WORLD') == 'Hello World'", "title_case('a') == 'A'"]),
            ("flatten", "nested", "Flatten a list of lists (one level).", "    return [x for sub in nested for x in sub]\n",
             ["flatten([[1, 2], [], [3]]) == [1, 2, 3]", "flatten([]) == []"]),
        ]
        # Bugs planted in a correct body: (what to replace, with what).
        bugs = {"clamp": ("min(x, hi)", "min(x, lo)"), "is_prime": ("+ 1)", ")"), "fib": ("range(n)", "range(n - 1)"),
                "gcd": ("a % b", "b % a"), "chunk": ("i + n", "i + n - 1"), "sum_digits": ("int(d)", "int(d) + 1"),
                "median": ("/ 2", "// 2"), "rotate": ("k %= len(items)", "k %= len(items) + 1"),
                "caesar": ("+ k) % 26", "- k) % 26"), "count_vowels": ("'aeiou'", "'aeio'"),
                "reverse_words": ("reversed(s.split())", "reversed(s.split(' '))"), "dedupe": ("seen.add(x)", "pass"),
                "run_length": ("str(j - i)", "str(j - i - 1)"), "title_case": ("w[1:].lower()", "w[1:]"), "flatten": ("for sub in nested for x in sub", "for sub in nested[1:] for x in sub")}
        mods = ["util", "helpers", "core", "lib", "tools", "common", "mathx", "textx"]
        made = 0
        for i, (name, params, doc, body, asserts) in enumerate(funcs):
            if made >= n:
                break
            mod = mods[i % len(mods)]
            check = ("python3 - <<'HIDDEN_TEST'\nfrom " + mod + " import " + name + "\n" + "".join(f"assert {a}\n" for a in asserts) +
                     "HIDDEN_TEST\n")
            # 1. implement a stub from its docstring
            stub = f'def {name}({params}):\n    """{doc}"""\n    raise NotImplementedError\n'
            right = f'def {name}({params}):\n    """{doc}"""\n' + body
            # "reference": a right solution (never sent to the model): the suite's tests run each
            # hidden check on it, so a check that fails a right answer cannot ship.
            self.tasks.append({"id": f"repo_implement_{name}", "kind": "repo", "category": "repo_hidden_tests",
                               "user": f"Implement {name} in {mod}.py as its docstring says. There are no tests in the repository; make it correct.",
                               "files": {f"{mod}.py": stub, "README.md": f"# {mod}\nSmall helpers.\n"}, "check": check,
                               "reference": {f"{mod}.py": right}})
            made += 1
            # 2. find and fix a planted bug, described by its symptom only
            if name in bugs and made < n:
                old, new = bugs[name]
                assert old in body, (name, old)
                buggy = f'def {name}({params}):\n    """{doc}"""\n' + body.replace(old, new, 1)
                self.tasks.append({"id": f"repo_fix_{name}", "kind": "repo", "category": "repo_hidden_tests",
                                   "user": f"Users report that {name} in {mod}.py does not do what its docstring says. Find the bug and fix it.",
                                   "files": {f"{mod}.py": buggy, "README.md": f"# {mod}\nSmall helpers.\n"}, "check": check,
                                   "reference": {f"{mod}.py": right}})
                made += 1


def generate():
    base = json.load(open(os.path.join(DATA, "agent_tasks_base.json")))["tasks"]
    g = Gen(SEED)
    g.simple(60)
    g.simple(60, multiple=True)
    g.parallel(40)
    g.parallel_multiple(40)
    g.irrelevance(40)
    g.multi_turn(40)
    g.missing_params(20)
    g.long_output(10)
    g.error_recovery(20)
    g.repo(30)
    tasks = base + g.tasks
    # The fast subset for CI (--kind smoke): the first task of every category.
    seen = set()
    for t in tasks:
        cat = t.get("category", t.get("kind", "tools"))
        if cat not in seen:
            seen.add(cat)
            t["smoke"] = True
    return tasks


def oracle_script(tasks, fail_fraction, fail_seed):
    """fake_vllm turns that answer each generated tool task right (a fraction of them wrong)."""
    gen = [t for t in tasks if "_oracle" in t]
    r = random.Random(fail_seed)
    wrong = set(r.sample(range(len(gen)), round(fail_fraction * len(gen))))
    turns = [{"content": "?"}]  # requests no task matches (the hand-written ones)
    for i, t in enumerate(gen):
        steps = t["_oracle"]
        if i in wrong:  # a confident wrong answer, no call
            turns.append({"match": '"' + t["user"] + '"', "content": "I cannot help with that."})
            continue
        for seen, step in enumerate(steps):
            turn = {"match": '"' + t["user"] + '"', "tools_seen": sum(len(s) for s in steps[:seen] if isinstance(s, list))}
            if isinstance(step, list):
                turn["tool_calls"] = [{"name": n, "arguments": a} for n, a in step]
            else:
                turn["content"] = step
            turns.append(turn)
    return {"turns": turns}, sorted(gen[i]["id"] for i in wrong)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--oracle")
    ap.add_argument("--fail-fraction", type=float, default=0.0)
    ap.add_argument("--fail-seed", type=int, default=1)
    a = ap.parse_args()
    tasks = generate()
    if a.oracle:
        script, wrong = oracle_script(tasks, a.fail_fraction, a.fail_seed)
        with open(a.oracle, "w") as f:
            json.dump(script, f)
        print(json.dumps({"tasks": len([t for t in tasks if "_oracle" in t]), "answered_wrong": wrong}))
        return 0
    shipped = [{k: v for k, v in t.items() if k != "_oracle"} for t in tasks]
    # One task per line: tools are named from the library, so the file stays small and diffs stay readable.
    text = ('{"tool_library": [\n' + ",\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS.values()) + '\n],\n"tasks": [\n' +
            ",\n".join(json.dumps(t, ensure_ascii=False) for t in shipped) + "\n]}\n")
    path = os.path.join(DATA, "agent_tasks.json")
    if a.check:
        same = os.path.exists(path) and open(path).read() == text
        print(("up to date: " if same else "OUT OF DATE (run tools/bench/gen_agent_suite.py): ") + path)
        return 0 if same else 1
    with open(path, "w") as f:
        f.write(text)
    kinds = {}
    for t in shipped:
        kinds[t.get("category", t.get("kind", "tools"))] = kinds.get(t.get("category", t.get("kind", "tools")), 0) + 1
    print(f"{path}: {len(shipped)} tasks: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
