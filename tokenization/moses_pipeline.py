"""The legacy Transformer-XL text pipeline, rebuilt from `tokenizers` components so it lives in `tokenizer.json`.

transformers 4.x tokenised a line with sacremoses: `MosesPunctNormalizer("en")`, then `MosesTokenizer("en")` with
`aggressive_dash_splits=True, escape=False` and the special tokens as protected patterns, then split `,` / `.`
between digits (`5,000.50` -> `5 @,@ 000 @.@ 50`); decoding ran `MosesDetokenizer("en")`, joined the numbers back
and applied transformers' `clean_up_tokenization`. Each of those steps is a chain of Python `re.sub` calls; here
every call becomes one Oniguruma `Replace`, in the same order, so the ids are the legacy ids.

Three facts make the translation exact rather than approximate:
- `Replace` inserts a literal, so "pad X with spaces" becomes two zero-width insertions around X, and a
  replacement that re-emits a captured neighbour becomes a lookaround.
- Python consumes the characters it matched, so a neighbour used by one match cannot start the next one
  (`rock'n'roll` splits only the first apostrophe). `A\\K` consumes A without replacing it, and `(?!\\G)` forbids
  the next match from starting where the previous one ended, which together reproduce that scan.
- Character classes are sacremoses' own tables and Python's `\\s` / `\\d` (see `moses_charsets`), not Oniguruma's.
"""

import re

from tokenizers import Regex, decoders, normalizers, pre_tokenizers

from . import moses_charsets


def _char_class(*tables: str, negate: bool = False, extra: str = "") -> str:
    """An Oniguruma bracket expression from `moses_charsets` range tables plus literal (escaped) characters."""
    ranges = "".join(
        f"\\x{{{start}}}-\\x{{{end}}}" for table in tables for start, end in (r.split("-") for r in table.split())
    )
    return f"[{'^' if negate else ''}{ranges}{extra}]"


ALNUM = _char_class(moses_charsets.ALNUM, moses_charsets.INDIC_MARKS)  # the tokenizer's IsAlnum
ALPHA = _char_class(moses_charsets.ALPHA, moses_charsets.INDIC_MARKS)  # the tokenizer's IsAlpha
NOT_ALPHA = _char_class(moses_charsets.ALPHA, moses_charsets.INDIC_MARKS, negate=True)
NOT_ALPHA_NOR_NUMBER = _char_class(
    moses_charsets.ALPHA, moses_charsets.INDIC_MARKS, moses_charsets.NUMBER, negate=True
)
NUMBER = _char_class(moses_charsets.NUMBER)
NOT_NUMBER = _char_class(moses_charsets.NUMBER, negate=True)
LOWER = _char_class(moses_charsets.LOWER)
SPACE = _char_class(moses_charsets.PY_SPACE)
SPACE_BUT_BLANK = rf"(?! ){SPACE}"
DIGIT = _char_class(moses_charsets.PY_DIGIT)
CJK = _char_class(moses_charsets.CJK)
DETOKENIZER_ALPHA = _char_class(moses_charsets.ALPHA)  # the detokenizer's IsAlpha has no Indic marks
CURRENCY_OR_OPENING = _char_class(moses_charsets.CURRENCY, extra=r"(\[{¿¡")
PUNCTUATION = r"[,.?!:;\\%}\])]"

# Python's `(?:\A|(?!\G))X\K` prefix: X may not be a character the previous match consumed (see module docstring).
FRESH = r"(?:\A|(?!\G))"


def _replace(pattern: str, content: str) -> normalizers.Replace:
    return normalizers.Replace(Regex(pattern), content)


def _strip(space: str) -> normalizers.Replace:
    return _replace(rf"\A{space}+|{space}+\z", "")


def _squeeze(space: str, other_spaces: str = "") -> normalizers.Replace:
    """`re.sub(space + "+", " ")`, written so that a lone " " (the common case) is not a match to rewrite."""
    return _replace(rf"{space}{{2,}}" + (f"|{other_spaces}" if other_spaces else ""), " ")


def _protection_patterns(protected_tokens):
    """Case-insensitive regexes (as Python's re.IGNORECASE folds) for the inner words of `<word>` tokens."""
    folds = {extra[0]: extra for extra in moses_charsets.PY_IGNORECASE_EXTRAS.split()}

    def insensitive(word):
        return "".join(
            f"[{re.escape(c.lower() + c.upper() + folds.get(c.lower(), '')[1:])}]" if c.isalpha() else c for c in word
        )

    return [insensitive(token[1:-1]) for token in protected_tokens if re.fullmatch(r"<[A-Za-z0-9]+>", token)]


# sacremoses marks a protected span as THISISPROTECTED000: it starts with a capital and ends with a digit, and its
# neighbours are classified accordingly. We turn `<word>` into THISISPROTECTED + word + 000 so the word survives.
_MARK_OPEN, _MARK_CLOSE = "THISISPROTECTED", "000"


def _protect(words):
    if not words:
        return []
    return [
        _replace(rf"<(?=(?:{'|'.join(words)})>)", _MARK_OPEN),
        _replace("|".join(rf"(?<={_MARK_OPEN}{word})>" for word in words), _MARK_CLOSE),
    ]


def _unprotect(words):
    if not words:
        return []
    return [
        _replace(rf"{_MARK_OPEN}(?=(?:{'|'.join(words)}){_MARK_CLOSE})", "<"),
        _replace("|".join(rf"(?<=<{word}){_MARK_CLOSE}" for word in words), ">"),
    ]


def punctuation_normalizer():
    """`MosesPunctNormalizer("en")` (penn, norm_quote_commas and norm_numbers on), rule by rule."""
    return [
        # EXTRA_WHITESPACE
        _replace(r"\r", ""),
        _replace(r"\(", " ("),
        _replace(r"\)", ") "),
        _squeeze(" "),
        # `\) ([.!:?;,])`, `\( `, ` \)`, `(\d) %`, ` :`, ` ;`: each drops one space, none creates another's match
        _replace(rf"(?<=\)) (?=[.!:?;,])|(?<=\() | (?=[):;])|(?<={DIGIT}) (?=%)", ""),
        # NORMALIZE_UNICODE_IF_NOT_PENN
        _replace(r"`", "'"),
        _replace(r"''", ' " '),
        # NORMALIZE_UNICODE. „“” -> '"' moves down to `''` -> '"' (nothing in between reads them); the letter-context
        # rules for ‘ and ’ also yield "'"; "´´" -> '"' can no longer match, every "´" being "'" already.
        _replace(r"–", "-"),
        _replace(r"—", " - "),
        _squeeze(" "),
        _replace(r"[´‘‚’]", "'"),
        _replace(r"[„“”]|''", '"'),
        _replace(r"…", "..."),
        # FRENCH_QUOTES: « and » with the no-break spaces around them become '"'
        _replace("\u00a0«\u00a0|«\u00a0|«|\u00a0»\u00a0|\u00a0»|»", '"'),
        # HANDLE_PSEUDO_SPACES
        _replace("\u00a0%", "%"),
        _replace("nº\u00a0", "nº "),
        _replace("\u00a0:", ":"),
        _replace("\u00a0ºC", " ºC"),
        _replace("\u00a0cm", " cm"),
        _replace("\u00a0\\?", "?"),
        _replace("\u00a0!", "!"),
        _replace("\u00a0;", ";"),
        _replace(",\u00a0", ", "),
        _squeeze(" "),
        # EN_QUOTATION_FOLLOWED_BY_COMMA: `"([,.]+)` -> `\1"`: a quote after the run, then drop the one before
        _replace(r'"[,.]+\K(?![,.])', '"'),
        _replace(r'"(?=[,.])', ""),
        # OTHER: a no-break space between digits is a decimal point
        _replace(rf"{FRESH}{DIGIT}\K\u00a0(?={DIGIT})", "."),
        _strip(SPACE),
    ]


def nonbreaking_prefix_rule():
    """`handles_nonbreaking_prefixes`: split the final period off a word unless the word is an abbreviation.

    A word keeps its period when it contains another period and a letter (`U.S.`), is a known prefix (`Dr.`), is
    followed by a lower-case word, or is a numeric-only prefix followed by a digit (`No. 5`).
    """
    numeric_only = moses_charsets.NUMERIC_ONLY_PREFIXES.split()
    plain = [p for p in moses_charsets.NONBREAKING_PREFIXES.split() if p not in numeric_only]
    prefixes = "|".join(map(re.escape, plain))
    numeric_only = "|".join(map(re.escape, numeric_only))
    word_end = r"(?: |\z)"
    return _replace(
        rf"(?<![^ ])(?=[^ ]*\.{word_end})"  # at the start of a word ending with a period, ...
        rf"(?!(?=[^ ]*\.[^ ]+{word_end})(?=[^ ]*{ALPHA}))"
        rf"(?!(?:{prefixes})\.{word_end})"
        rf"(?!(?:{numeric_only})\. +[0-9])"
        rf"[^ ]+\K(?=\.{word_end})"
        rf"(?!\. +{LOWER})",  # ... and not followed by a lower-case word: a space before the period
        " ",
    )


def moses_tokenizer(protected_tokens):
    """`MosesTokenizer("en").tokenize(aggressive_dash_splits=True, escape=False, protected_patterns=...)`."""
    words = _protection_patterns(protected_tokens)
    not_alnum = _char_class(
        moses_charsets.ALNUM, moses_charsets.INDIC_MARKS, moses_charsets.PY_SPACE, negate=True, extra=r".'`,\-"
    )
    return [
        _squeeze(SPACE, SPACE_BUT_BLANK),
        _replace(r"[\x00-\x1f]", ""),
        *_protect(words),
        _strip(" "),
        # PAD_NOT_ISALNUM (one space between two padded characters where Python puts two: only boundaries matter)
        _replace(rf"(?={not_alnum})|(?<={not_alnum})", " "),
        # AGGRESSIVE_HYPHEN_SPLIT
        _replace(rf"(?<={ALNUM})-(?={ALNUM})", " @-@ "),
        # replace_multidots: a run of k dots becomes " " + "DOT" * k + "MULTI" (+ " " unless at the end)
        _replace(r"(?<!\.)(?=\.\.)", " "),
        _replace(r"(?<=\.\.)(?=[^.])", "MULTI "),
        _replace(r"(?<=\.\.)\z", "MULTI"),
        _replace(r"\.(?=\.)|(?<=\.)\.", "DOT"),
        # COMMA_SEPARATE_1..3
        _replace(rf"{NOT_NUMBER}\K,", " , "),
        _replace(rf",(?={NOT_NUMBER})", " , "),
        _replace(rf"(?<={NUMBER}),\z", " , "),
        # ENGLISH_SPECIFIC_APOSTROPHE 1..5
        _replace(rf"{FRESH}{NOT_ALPHA}\K'(?={NOT_ALPHA})", " ' "),
        _replace(rf"{FRESH}{NOT_ALPHA_NOR_NUMBER}\K'(?={ALPHA})", " ' "),
        _replace(rf"{FRESH}{ALPHA}\K'(?={NOT_ALPHA})", " ' "),
        _replace(rf"{FRESH}{ALPHA}\K'(?={ALPHA})", " '"),
        _replace(rf"{FRESH}{NUMBER}\K'(?=s)", " '"),
        nonbreaking_prefix_rule(),
        _squeeze(" "),
        _strip(" "),
        # TRAILING_DOT_APOSTROPHE
        _replace(r"\.'\z", " . ' "),
        *_unprotect(words),
        # restore_multidots
        _replace(r"DOT(?=(?:DOT)+MULTI)", "."),
        _replace(r"DOTMULTI", "."),
    ]


def number_splitter():
    """transformers' `tokenize_numbers`: `,` and `.` between two digits become the tokens `@,@` and `@.@`."""
    return [
        _replace(rf"(?<={DIGIT}),(?={DIGIT})", " @,@ "),
        _replace(rf"(?<={DIGIT})\.(?={DIGIT})", " @.@ "),
    ]


def moses_normalizer(lower_case: bool, protected_tokens) -> normalizers.Sequence:
    """The legacy `_tokenize` up to the final whitespace split, for one text span between special tokens."""
    return normalizers.Sequence(
        [
            *([normalizers.Lowercase()] if lower_case else []),
            _strip(SPACE),
            *punctuation_normalizer(),
            *moses_tokenizer(protected_tokens),
            *number_splitter(),
        ]
    )


def moses_pre_tokenizer() -> pre_tokenizers.WhitespaceSplit:
    return pre_tokenizers.WhitespaceSplit()


# -------------------------------------------------------------------------------------------------------------
# Decoding. Tokens are joined as " t0 t1 ... ", then every space the Moses detokenizer would not write is turned
# into a tab ("glue"; no token holds whitespace), so later rules still see the token boundaries; tabs go last.
# -------------------------------------------------------------------------------------------------------------

_GAP = r"[ \t]"


def _glue(pattern: str) -> decoders.Replace:
    return decoders.Replace(Regex(pattern), "\t")


def _quote_pairs(quote: str, possessive: bool = False) -> decoders.Replace:
    """Glue alternating quote tokens like the detokenizer's quote counter: opening ones to the next token, closing
    ones to the previous. With `possessive`, an even-numbered `'` after a word ending in "s" is a closing
    possessive (`the Jones' house`) and does not count.

    Each match is one glued gap; `\\G` tells where the previous match left the count: at `\\A` or on a quote that was
    just closed (skip it) we look for an opening quote; right after an opening quote we look for the closing one.
    """
    q = re.escape(quote)
    whole = rf"(?<={_GAP}){q}"
    if possessive:
        opening = rf".*?(?:(?<=s)\K{_GAP}(?={q}{_GAP})|{whole}(?<!s{_GAP}{q})\K{_GAP})"
    else:
        opening = rf".*?{whole}\K{_GAP}"
    closing = rf".*?\K{_GAP}(?={q}{_GAP})"
    return _glue(rf"(?:\A|\G{q}(?={_GAP})){opening}|\G(?<={_GAP}{q}{_GAP})(?!{q}{_GAP}){closing}")


def moses_decoder() -> decoders.Sequence:
    """`MosesDetokenizer("en").detokenize`, transformers' `detokenize_numbers`, `.strip()`, `clean_up_tokenization`."""
    literal = decoders.Replace
    return decoders.Sequence(
        [
            decoders.Replace(Regex(r"\A"), " "),
            decoders.Fuse(),
            decoders.Replace(Regex(r"\z"), " "),
            literal(" @-@ ", "-"),
            # unescape_xml
            *(
                literal(escaped, plain)
                for escaped, plain in [
                    ("&bar;", "|"),
                    ("&#124;", "|"),
                    ("&lt;", "<"),
                    ("&gt;", ">"),
                    ("&bra;", "["),
                    ("&ket;", "]"),
                    ("&quot;", '"'),
                    ("&apos;", "'"),
                    ("&#91;", "["),
                    ("&#93;", "]"),
                    ("&amp;", "&"),
                ]
            ),
            # a currency sign or opening bracket attaches to the next token, punctuation and contractions to the
            # previous one, CJK to CJK
            decoders.Replace(Regex(rf"(?<={_GAP}){CURRENCY_OR_OPENING}+\K{_GAP}"), "\t"),
            _glue(rf"{_GAP}(?={PUNCTUATION}+{_GAP})"),
            _glue(rf"{_GAP}(?='{DETOKENIZER_ALPHA})"),
            _glue(rf"(?<={CJK}){_GAP}(?={CJK})"),
            _quote_pairs("'", possessive=True),
            *(_quote_pairs(quote) for quote in ['"', "``", "`", "''"]),
            literal("\t", ""),
            decoders.Replace(Regex(r"\A +| +\z"), ""),
            # detokenize_numbers, strip
            literal(" @,@ ", ","),
            literal(" @.@ ", "."),
            decoders.Replace(Regex(rf"\A{SPACE}+|{SPACE}+\z"), ""),
            # clean_up_tokenization
            *(
                literal(spaced, tight)
                for spaced, tight in [
                    (" .", "."),
                    (" ?", "?"),
                    (" !", "!"),
                    (" ,", ","),
                    (" ' ", "'"),
                    (" n't", "n't"),
                    (" 'm", "'m"),
                    (" 's", "'s"),
                    (" 've", "'ve"),
                    (" 're", "'re"),
                ]
            ),
        ]
    )
