"""Deterministic, seeded corpus of varied strings for tokenizer agreement tests.

Used by make_fixture.py (expected ids from HF `tokenizers`) and by
bench/tokenizer/bench_tokenizer.py (speed on the same strings). Categories: prose in many
scripts, code, number runs, whitespace runs (tabs, CR/LF, Unicode spaces), emoji (incl. ZWJ
sequences, flags, keycaps, skin tones), special tokens inside text, and odd edge cases (lone
combining marks, control characters, BOM, private use, astral planes).
"""
import random

WORDS = {
    "en": "the quick brown fox jumps over lazy dog inference engine token model weights "
          "attention layer cache memory latency throughput don't it's we'll they've I'm".split(),
    "zh": "我们 今天 天气 很好 模型 推理 引擎 深度 求索 注意力 机制 专家 混合 中文 测试 数据".split(),
    "ja": "こんにちは 世界 東京 カタカナ ひらがな 日本語 テスト トークン 推論 です ます".split(),
    "ko": "안녕하세요 세계 한국어 모델 토큰 테스트 추론 엔진 감사합니다".split(),
    "ar": "مرحبا بالعالم اللغة العربية نموذج اختبار الذكاء الاصطناعي شكرا".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा मॉडल परीक्षण कृत्रिम बुद्धिमत्ता धन्यवाद".split(),
    "ru": "Привет мир русский язык модель тест вывод движок спасибо ёжик".split(),
    "th": "สวัสดี ชาวโลก ภาษาไทย แบบจำลอง ทดสอบ ขอบคุณ ครับ ค่ะ".split(),
    "el": "Γειά σου κόσμε ελληνικά μοντέλο δοκιμή ευχαριστώ".split(),
    "he": "שלום עולם עברית מודל בדיקה תודה".split(),
    "vi": "Xin chào thế giới tiếng Việt mô hình kiểm tra cảm ơn".split(),
    "de": "Grüße Straße Übermäßig schön Größe Fußgängerübergänge".split(),
    "tr": "Merhaba dünya Türkçe İstanbul ığdır şçöğü".split(),
    "am": "ሰላም ዓለም አማርኛ".split(),
    "ta": "வணக்கம் உலகம் தமிழ்".split(),
    "bn": "হ্যালো বিশ্ব বাংলা".split(),
}
PUNCT = list(".,;:!?-—–…()[]{}\"'«»“”‘’、。，！？：；（）【】《》·•/\\|@#$%^&*_+=~`<>")
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\u00a0", "\u3000",
          "\u2002", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u0085", "\u000b",
          "\u000c", "\u1680", "\u202f", "\u205f", "\u200b", "\ufeff", "   \n  ", " \r\n\t "]
EMOJI = ["😀", "🚀", "❤️", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "🧑🏿‍💻",
         "👩‍❤️‍💋‍👨", "🤷‍♀️", "☺", "✨", "🫠", "🐈‍⬛", "©", "™", "🀄"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹", "½¼¾",
          "ⅠⅡⅢⅫ", "๐๑๒๓", "①②③", "𝟎𝟏𝟐"]
ODD = ["\u0301", "\u0301\u0301abc", "e\u0301", "\u200d", "\u200d\u200d", "\ufe0f", "\u0000",
       "\u0001\u0002\u001f", "\u007f", "\u0080\u009f", "\ue000\uf8ff", "\U000f0000",
       "\ufffd", "\uffff", "\U0010fffd", "\U00020000\U0002a6d6", "\u0e33", "\u0915\u094d",
       "\u05d0\u05b0", "a\u0300\u0301\u0302", "\u1100\u1161\u11a8", "\U0001d400\U0001d7ff",
       "\u2066rtl\u2069", "\u202eabc", "\u00ad", "ﬁ", "Å", "ǅ", "ß", "İ"]
CODE = [
    "def {f}(x, y=3):\n    return x ** 2 + y  # {w}\n",
    "for (int i = 0; i < {n}; ++i) {{\n\tsum += a[i] * b[i];\n}}\n",
    "const {f} = async ({w}) => {{ await fetch(`/api/${{id}}`); }};\r\n",
    "{{\"{w}\": [{n}, {n}.5, -1e-9, true, null], \"k\": \"{w}\"}}",
    "<div class=\"{w}\">{w}</div>\n<br/>",
    "SELECT {w}, COUNT(*) FROM t WHERE id >= {n} GROUP BY 1;",
    "#include <vector>\nstd::vector<int32_t> {f}(std::string_view s);\n",
    "    if x!={n}:\n        raise ValueError(f'{{x!r}}')\n",
    "$ ls -la | grep '{w}' && echo $?\n",
    "x = {{'a': 1, \"b\": [2,3]}}  ## {n}\n\n\n",
    "    \t  indented with mixed tabs\t\t{w}",
]


def _word(rng):
    lang = rng.choice(list(WORDS))
    return rng.choice(WORDS[lang])


def _random_codepoints(rng, n):
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe5b), (0x3040, 0x30ff), (0x4e00, 0x9fa5),
              (0xac00, 0xd7a3), (0x2000, 0x206f), (0x2190, 0x23ff), (0x1f300, 0x1f64f),
              (0xff00, 0xffef), (0x0, 0x1f)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(blocks)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _number(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randint(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if kind == 2:
        d = rng.choice(DIGITS)
        return "".join(rng.choice(d) for _ in range(rng.randint(1, 12)))
    if kind == 3:
        return f"{rng.randint(1, 31)}/{rng.randint(1, 12)}/{rng.randint(1900, 2100)}"
    if kind == 4:
        return f"{rng.randrange(1 << 32):#x}"
    return ",".join(str(rng.randrange(1000)) for _ in range(rng.randint(2, 6)))


def _fragment(rng, special_tokens):
    kind = rng.randrange(10)
    if kind <= 2:  # prose in one script
        lang = rng.choice(list(WORDS))
        sep = "" if lang in ("zh", "ja", "th") and rng.random() < 0.5 else " "
        words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(1, 12))]
        text = sep.join(words)
        if rng.random() < 0.5:
            text += rng.choice(PUNCT)
        return text
    if kind == 3:
        t = rng.choice(CODE)
        return t.format(f=_word(rng), w=_word(rng), n=rng.randrange(10000))
    if kind == 4:
        return _number(rng)
    if kind == 5:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 5)))
    if kind == 6:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 7 and special_tokens:
        tok = rng.choice(special_tokens)
        r = rng.random()
        if r < 0.15:  # a broken token: must not match
            return tok[: rng.randint(1, max(1, len(tok) - 1))]
        if r < 0.25:
            return tok + tok
        return tok
    if kind == 8:
        return rng.choice(ODD)
    return _random_codepoints(rng, rng.randint(1, 20))


def make_corpus(seed=20240501, num_strings=10000, special_tokens=()):
    rng = random.Random(seed)
    special_tokens = list(special_tokens)
    out = ["", " ", "a", "\n", "\r\n", "  \n\n  ", "\t", "Hello, world!", "1234567",
           "<｜begin▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>"]
    while len(out) < num_strings:
        n = rng.choice([1, 1, 2, 3, 4, 6, 10])
        s = "".join(_fragment(rng, special_tokens) for _ in range(n))
        if rng.random() < 0.3:
            s = rng.choice(SPACES) + s
        if rng.random() < 0.3:
            s += rng.choice(SPACES)
        out.append(s)
    # A few long documents (several KB) to exercise long pieces and the merge loop.
    for _ in range(4):
        out.append("".join(_fragment(rng, special_tokens) for _ in range(300)))
    return out
