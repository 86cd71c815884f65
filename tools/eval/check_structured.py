"""Independent structured-output validator for `deepinfer eval score --check-structured-output`.

It shares no code with deepinfer's grammar engine (grammar/): regexes are checked with Python's
`re.fullmatch`, JSON Schemas with the `jsonschema` package (json.loads first), and EBNF/GBNF
grammars with the small Earley recogniser below (rules `name ::= ...`, "lit" / 'lit', [classes],
#xHH, (groups), `.`, postfix * + ? {m} {m,} {m,n}, comments; the root rule is `root`).

The scorer runs this file in a sandbox with `main(<JSON text of [{kind, source, text}...]>)`
appended; the last line printed is a JSON array of {"valid": bool, "error": str}.
Also usable directly: python3 check_structured.py entries.json
"""
import json
import re
import sys


# ---- EBNF ------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, src):
        self.s, self.i, self.rules, self.fresh = src, 0, {}, 0

    def error(self, what):
        raise ValueError("ebnf: %s at offset %d" % (what, self.i))

    def skip(self, newlines=True):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#" and not self.s.startswith("#x", self.i):
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            elif self.s.startswith("/*", self.i):
                end = self.s.find("*/", self.i + 2)
                self.i = len(self.s) if end < 0 else end + 2
            elif c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            else:
                break

    def name(self):
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*").match(self.s, self.i)
        if not m:
            self.error("expected a rule name")
        self.i = m.end()
        return m.group(0)

    def at_rule_start(self):
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*[ \t]*(::=|=)").match(self.s, self.i)
        return m is not None

    def parse(self):
        self.skip()
        while self.i < len(self.s):
            n = self.name()
            self.skip()
            if self.s.startswith("::=", self.i):
                self.i += 3
            elif self.s.startswith("=", self.i):
                self.i += 1
            else:
                self.error("expected ::=")
            self.rules.setdefault(n, []).extend(self.alternatives())
            self.skip()
        if "root" not in self.rules:
            raise ValueError("ebnf: no rule named root")
        for alts in list(self.rules.values()):
            for seq in alts:
                for sym in seq:
                    if sym[0] == "ref" and sym[1] not in self.rules:
                        raise ValueError("ebnf: undefined rule " + sym[1])
        return self.rules

    def alternatives(self):
        alts = [self.sequence()]
        while True:
            self.skip()
            if self.i < len(self.s) and self.s[self.i] == "|":
                self.i += 1
                alts.append(self.sequence())
            else:
                return alts

    def new_rule(self, alts):
        self.fresh += 1
        n = " r%d" % self.fresh
        self.rules[n] = alts
        return ("ref", n)

    def sequence(self):
        seq = []
        while True:
            self.skip()
            if self.i >= len(self.s) or self.s[self.i] in "|)" or self.at_rule_start():
                return seq
            atom = self.atom()
            seq.append(self.postfix(atom))

    def postfix(self, atom):
        while True:
            self.skip(newlines=False)
            c = self.s[self.i] if self.i < len(self.s) else ""
            if c == "*":
                self.i += 1
                r = self.new_rule([])
                self.rules[r[1]].extend([[], [atom, r]])
                atom = r
            elif c == "+":
                self.i += 1
                r = self.new_rule([])
                self.rules[r[1]].extend([[atom], [atom, r]])
                atom = r
            elif c == "?":
                self.i += 1
                atom = self.new_rule([[], [atom]])
            elif c == "{":
                m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.s, self.i)
                if not m:
                    self.error("bad {m,n}")
                self.i = m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (None if m.group(3) == "" else int(m.group(3)))
                seq = [atom] * lo
                if hi is None:
                    star = self.new_rule([])
                    self.rules[star[1]].extend([[], [atom, star]])
                    seq.append(star)
                else:
                    tail = []
                    for _ in range(hi - lo):
                        tail = [self.new_rule([[], [atom] + tail])]
                    seq += tail
                atom = self.new_rule([seq])
            else:
                return atom

    def escape(self):
        c = self.s[self.i]
        self.i += 1
        simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "]": "]", "[": "[", "-": "-",
                  "/": "/", "^": "^"}
        if c in simple:
            return simple[c]
        for p, n in (("x", 2), ("u", 4), ("U", 8)):
            if c == p:
                h = self.s[self.i:self.i + n]
                self.i += n
                return chr(int(h, 16))
        self.error("unknown escape \\" + c)

    def char(self):
        c = self.s[self.i]
        self.i += 1
        return self.escape() if c == "\\" else c

    def atom(self):
        c = self.s[self.i]
        if c in "\"'":
            self.i += 1
            seq = []
            while self.i < len(self.s) and self.s[self.i] != c:
                ch = self.char()
                seq.append(("set", [(ord(ch), ord(ch))], False))
            if self.i >= len(self.s):
                self.error("unterminated literal")
            self.i += 1
            return self.new_rule([seq])
        if c == "[":
            self.i += 1
            neg = self.i < len(self.s) and self.s[self.i] == "^"
            if neg:
                self.i += 1
            ranges = []
            while self.i < len(self.s) and self.s[self.i] != "]":
                lo = self.char()
                hi = lo
                if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                    self.i += 1
                    hi = self.char()
                ranges.append((ord(lo), ord(hi)))
            self.i += 1
            return ("set", ranges, neg)
        if self.s.startswith("#x", self.i):
            m = re.compile(r"#x([0-9A-Fa-f]+)").match(self.s, self.i)
            self.i = m.end()
            v = int(m.group(1), 16)
            return ("set", [(v, v)], False)
        if c == ".":
            self.i += 1
            return ("set", [], True)
        if c == "(":
            self.i += 1
            alts = self.alternatives()
            self.skip()
            if self.i >= len(self.s) or self.s[self.i] != ")":
                self.error("expected )")
            self.i += 1
            return self.new_rule(alts)
        return ("ref", self.name())


def _matches(sym, ch):
    o = ord(ch)
    inside = any(lo <= o <= hi for lo, hi in sym[1])
    return inside != sym[2]


def ebnf_accepts(grammar, text):
    rules = _Parser(grammar).parse()
    nullable = set()
    changed = True
    while changed:
        changed = False
        for n, alts in rules.items():
            if n not in nullable and any(all(s[0] == "ref" and s[1] in nullable for s in seq) for seq in alts):
                nullable.add(n)
                changed = True
    # Earley items: (rule, alt index, dot, origin)
    sets = [set() for _ in range(len(text) + 1)]
    start = [("root", a, 0, 0) for a in range(len(rules["root"]))]
    sets[0].update(start)
    for k in range(len(text) + 1):
        agenda = list(sets[k])
        while agenda:
            item = agenda.pop()
            n, a, d, o = item
            seq = rules[n][a]
            if d < len(seq):
                sym = seq[d]
                if sym[0] == "ref":
                    for b in range(len(rules[sym[1]])):
                        new = (sym[1], b, 0, k)
                        if new not in sets[k]:
                            sets[k].add(new)
                            agenda.append(new)
                    if sym[1] in nullable:
                        new = (n, a, d + 1, o)
                        if new not in sets[k]:
                            sets[k].add(new)
                            agenda.append(new)
                elif k < len(text) and _matches(sym, text[k]):
                    sets[k + 1].add((n, a, d + 1, o))
            else:  # complete
                for (pn, pa, pd, po) in list(sets[o]):
                    pseq = rules[pn][pa]
                    if pd < len(pseq) and pseq[pd] == ("ref", n):
                        new = (pn, pa, pd + 1, po)
                        if new not in sets[k]:
                            sets[k].add(new)
                            agenda.append(new)
    return any(n == "root" and d == len(rules[n][a]) and o == 0 for (n, a, d, o) in sets[len(text)])


# ---- one entry --------------------------------------------------------------------------------
def check(entry):
    kind, source, text = entry["kind"], entry["source"], entry["text"]
    try:
        if kind == "regex":
            ok = re.fullmatch(source, text) is not None
            return {"valid": ok, "error": "" if ok else "does not match the regex"}
        if kind == "json_schema":
            import jsonschema
            try:
                value = json.loads(text)
            except ValueError as e:
                return {"valid": False, "error": "not JSON: %s" % e}
            schema = json.loads(source)
            cls = jsonschema.validators.validator_for(schema)
            errors = sorted(cls(schema).iter_errors(value), key=lambda e: list(e.path))
            return {"valid": not errors, "error": errors[0].message[:200] if errors else ""}
        if kind == "ebnf":
            ok = ebnf_accepts(source, text)
            return {"valid": ok, "error": "" if ok else "not in the grammar's language"}
        return {"valid": False, "error": "unknown kind " + kind}
    except Exception as e:  # a constraint this validator cannot read is that entry's error
        return {"valid": False, "error": "validator: %s: %s" % (type(e).__name__, e)}


def main(payload):
    entries = json.loads(payload)
    print(json.dumps([check(e) for e in entries]))


if __name__ == "__main__" and len(sys.argv) == 2:
    with open(sys.argv[1], encoding="utf-8") as f:
        main(f.read())
