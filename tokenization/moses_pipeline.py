r"""The legacy Transformer-XL text pipeline, rebuilt from `tokenizers` components so it lives in `tokenizer.json`.

transformers 4.x tokenised a line with sacremoses: `MosesPunctNormalizer("en")`, then `MosesTokenizer("en")` with
`aggressive_dash_splits=True, escape=False` and the special tokens as protected patterns, then split `,` / `.`
between digits (`5,000.50` -> `5 @,@ 000 @.@ 50`); decoding ran `MosesDetokenizer("en")`, joined the numbers back
and applied transformers' `clean_up_tokenization`. Each of those steps is a chain of Python `re.sub` calls; here
they become Oniguruma `Replace` steps in the same order, so the words, hence the ids, are the legacy ones.

Three facts make the translation exact rather than approximate:
- `Replace` inserts a literal, so "pad X with spaces" becomes zero-width insertions around X, and a replacement
  that re-emits a captured neighbour becomes a lookaround.
- Python consumes the characters it matched, so a neighbour used by one match cannot start the next one
  (`rock'n'roll` splits only the first apostrophe). `A\K` consumes A without replacing it, and `(?!\G)` forbids
  the next match from starting where the previous one ended, which together reproduce that scan.
- Character classes are sacremoses' own tables and Python's `\s` / `\d` (see `moses_charsets`), not Oniguruma's.

Every `Replace` step costs a pass over the text, so a few legacy rules are merged or left out where the comments
show that no word can change; the committed parity corpus and its tests hold us to that.
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


def _characters(table: str):
    """The characters of a `moses_charsets` range table."""
    for bounds in table.split():
        start, end = (int(bound, 16) for bound in bounds.split("-"))
        yield from map(chr, range(start, end + 1))


def _any_of(characters) -> str:
    """An alternation of single characters: Oniguruma finds these much faster than a bracket expression of
    multibyte characters, which it tries at every position."""
    return "|".join(f"\\x{{{ord(c):X}}}" for c in characters)


ALNUM = _char_class(moses_charsets.ALNUM, moses_charsets.INDIC_MARKS)  # the tokenizer's IsAlnum
ALPHA = _char_class(moses_charsets.ALPHA, moses_charsets.INDIC_MARKS)  # the tokenizer's IsAlpha
NOT_ALPHA = _char_class(moses_charsets.ALPHA, moses_charsets.INDIC_MARKS, negate=True)
NOT_ALPHA_NOR_NUMBER = _char_class(
    moses_charsets.ALPHA, moses_charsets.INDIC_MARKS, moses_charsets.NUMBER, negate=True
)
NUMBER = _char_class(moses_charsets.NUMBER)
NOT_NUMBER = _char_class(moses_charsets.NUMBER, negate=True)
LOWER = _char_class(moses_charsets.LOWER)
WHITESPACE = _any_of(_characters(moses_charsets.PY_SPACE))  # Python's \s
OTHER_WHITESPACE = _any_of(c for c in _characters(moses_charsets.PY_SPACE) if c != " ")
DIGIT = _char_class(moses_charsets.PY_DIGIT)
CJK = _char_class(moses_charsets.CJK)
DETOKENIZER_ALPHA = _char_class(moses_charsets.ALPHA)  # the detokenizer's IsAlpha has no Indic marks
CURRENCY_OR_OPENING = _char_class(moses_charsets.CURRENCY, extra=r"(\[{¿¡")
PUNCTUATION = r"[,.?!:;\\%}\])]"

# Put before `X\K` where Python's pattern is `(X)...(Y)`: the X of a match may not be the Y that the previous match
# consumed, i.e. may not sit where the previous match (which ends before its Y) ended. See the module docstring.
FRESH = r"(?:\A|(?!\G))"


def _replace(pattern: str, content: str) -> normalizers.Replace:
    return normalizers.Replace(Regex(pattern), content)


def _protection_patterns(protected_tokens):
    """Case-insensitive regexes (folding as Python's re.IGNORECASE does) for the inner words of `<word>` tokens.

    Other protected tokens are only kept whole in their exact spelling, which the tokenizer's special tokens do."""
    folds = {extra[0]: extra for extra in moses_charsets.PY_IGNORECASE_EXTRAS.split()}

    def insensitive(word):
        return "".join(
            f"[{re.escape(c.lower() + c.upper() + folds.get(c.lower(), '')[1:])}]" if c.isalpha() else c for c in word
        )

    return [insensitive(token[1:-1]) for token in protected_tokens if re.fullmatch(r"<[A-Za-z0-9]+>", token)]


# sacremoses replaces a protected span by THISISPROTECTED000: its neighbours see a capital letter on its left and
# a digit on its right. Replacing both "<" and ">" of `<word>` by that marker gives them the same view and keeps the
# word, to put the brackets back afterwards.
_MARK = "THISISPROTECTED000"


def _protect(words):
    if not words:
        return []
    words = "|".join(words)
    return [_replace(rf"<(?=(?:{words})>)|>(?<=<(?:{words})>)", _MARK)]


def _unprotect(words):
    if not words:
        return []
    words = "|".join(words)
    return [
        _replace(rf"{_MARK}(?=(?:{words}){_MARK})", "<"),
        _replace(rf"{_MARK}(?<=<(?:{words}){_MARK})", ">"),
    ]


def punctuation_normalizer():
    r"""`MosesPunctNormalizer("en")` (penn, norm_quote_commas and norm_numbers on), after the line's `.strip()`.

    Left out: the rules that only add or remove spaces around ( ) : ; % (`\(` -> " (", `\) ([.!:?;,])` -> `)\1`,
    ` :` -> ":", `(\d) %` -> `\1%`, ...) and every ` +` -> " ": the tokenizer squeezes all whitespace first and
    pads those characters anyway, and no rule in between reads spaces.
    """
    return [
        # the line's .strip() (trailing whitespace changes nothing below) and EXTRA_WHITESPACE's `\r` -> ""
        _replace(rf"\A(?:{WHITESPACE})+|\r", ""),
        # NORMALIZE_UNICODE_IF_NOT_PENN
        _replace(r"`", "'"),
        _replace(r"''", ' " '),
        # NORMALIZE_UNICODE. „“” -> '"' moves down to `''` -> '"' (nothing in between reads them); the letter-context
        # rules for ‘ and ’ also yield "'"; "´´" -> '"' can no longer match, every "´" being "'" already.
        _replace(r"–", "-"),
        _replace(r"—", " - "),
        _replace(r"´|‘|‚|’", "'"),
        # ... and FRENCH_QUOTES (« and » with the no-break spaces around them), moved up past "…" -> "..."
        _replace("„|“|”|''|\u00a0«\u00a0|«\u00a0|«|\u00a0»\u00a0|\u00a0»|»", '"'),
        _replace(r"…", "..."),
        # HANDLE_PSEUDO_SPACES: a no-break space becomes a space after "nº" or "," and before "ºC" or "cm", and goes
        # before % : ? ! ; (below). Where two rules want the same one the earlier wins: %, then "nº", then the rest.
        _replace("(?<=nº)\u00a0(?!%)|(?<=,)\u00a0(?![%:?!;])|\u00a0(?=ºC|cm)", " "),
        # EN_QUOTATION_FOLLOWED_BY_COMMA: `"([,.]+)` -> `\1"`: a quote after the run, then drop the one before
        # (with the no-break spaces that go: nothing here reads them)
        _replace(r'"[,.]+\K(?![,.])', '"'),
        _replace('"(?=[,.])|\u00a0(?=[%:?!;])', ""),
        # OTHER: a no-break space between digits is a decimal point
        _replace(rf"{FRESH}{DIGIT}\K\u00a0(?={DIGIT})", "."),
        # (the final .strip() is left to the tokenizer's, which follows its whitespace squeeze)
    ]


def nonbreaking_prefix_rule():
    """`handles_nonbreaking_prefixes`: split the final period off a word unless the word is an abbreviation.

    A word keeps its period when it contains another period and a letter (`U.S.`), is a known prefix (`Dr.`), is
    followed by a lower-case word, or is a numeric-only prefix followed by a digit (`No. 5`). A run of periods is
    a word of its own (sacremoses has it hidden as DOTDOTMULTI at this point) and keeps its last period.
    """
    numeric_only = moses_charsets.NUMERIC_ONLY_PREFIXES.split()
    plain = [p for p in moses_charsets.NONBREAKING_PREFIXES.split() if p not in numeric_only]
    word_start = r"(?:\A| )"
    return _replace(
        r"\.(?= |\z)(?<=[^ .]\.)"  # the period ending a word of two or more characters, not a run of periods,
        rf"(?! +{LOWER})"  # unless the word comes before a lower-case word,
        rf"(?<!{word_start}(?:{'|'.join(map(re.escape, plain))})\.)"  # is a prefix,
        rf"(?!(?<={word_start}(?:{'|'.join(numeric_only)})\.) +[0-9])"  # a numeric prefix before a number,
        rf"(?!(?<=\.[^ ]*\.)(?<={ALPHA}[^ ]*\.))",  # or has another period and a letter
        " .",
    )


def moses_tokenizer(protected_tokens):
    """`MosesTokenizer("en").tokenize(aggressive_dash_splits=True, escape=False, protected_patterns=...)`."""
    words = _protection_patterns(protected_tokens)
    padded = _char_class(  # what PAD_NOT_ISALNUM pads: neither alphanumeric, nor whitespace, nor . ' ` , -
        moses_charsets.ALNUM, moses_charsets.INDIC_MARKS, moses_charsets.PY_SPACE, negate=True, extra=r".'`,\-"
    )
    not_padded = _char_class(
        moses_charsets.ALNUM, moses_charsets.INDIC_MARKS, moses_charsets.PY_SPACE, extra=r".'`,\-"
    )
    return [
        # DEDUPLICATE_SPACE, as "every other whitespace character -> ' '" and "squeeze ' '", the squeeze done with
        # ASCII_JUNK and the .strip() that follows the protection (which does not care about the ends)
        _replace(OTHER_WHITESPACE, " "),
        _replace(r"\A[ \x00-\x1f]+|[ \x00-\x1f]+\z|[\x00-\x1f]| (?= )", ""),
        *_protect(words),
        # PAD_NOT_ISALNUM: a space after each padded character, and one before it (the scan from where the previous
        # match ended, `\G`, to the next padded character). Python puts two spaces between two padded characters
        # and one before a padded first character; we put one and none: no rule below can tell (the apostrophe and
        # comma rules look at single neighbours, and those are the same).
        _replace(rf"{padded}\K|\G{not_padded}*+\K(?={padded})", " "),
        # AGGRESSIVE_HYPHEN_SPLIT
        _replace(rf"-(?<={ALNUM}-)(?={ALNUM})", " @-@ "),
        # replace_multidots: a run of k periods becomes " " + "DOT" * k + "MULTI" (+ " " unless at the end), hiding
        # it from the rules below until it is restored. Only the spaces matter (before the run: its first two periods
        # become " .."): we keep the periods, as no rule below reads a run but the nonbreaking-prefix one, told to
        # skip runs. So, unlike sacremoses, we do not turn a literal "DOTMULTI" of the input into ".".
        _replace(r"\.\.(?<!\.\.\.)", " .."),
        _replace(r"\.{2,}\K(?=[^.])", " "),
        # COMMA_SEPARATE_1, then 2 and 3 (a comma followed by a non-digit, or ending the text after a digit)
        _replace(rf"{NOT_NUMBER}\K,", " , "),
        _replace(rf",(?={NOT_NUMBER})|,(?<={NUMBER},)\z", " , "),
        # ENGLISH_SPECIFIC_APOSTROPHE 1..5
        _replace(rf"{FRESH}{NOT_ALPHA}\K'(?={NOT_ALPHA})", " ' "),
        _replace(rf"{FRESH}{NOT_ALPHA_NOR_NUMBER}\K'(?={ALPHA})", " ' "),
        _replace(rf"{FRESH}{ALPHA}\K'(?={NOT_ALPHA})", " ' "),
        _replace(rf"{FRESH}{ALPHA}\K'(?={ALPHA})", " '"),
        _replace(rf"{FRESH}{NUMBER}\K'(?=s)", " '"),
        nonbreaking_prefix_rule(),
        # DEDUPLICATE_SPACE and .strip() only matter to TRAILING_DOT_APOSTROPHE (`\.' ?$`), which allows for them
        _replace(r"\.' *\z", " . ' "),
        *_unprotect(words),
    ]


def number_splitter():
    """transformers' `tokenize_numbers`: `,` and `.` between two digits become the tokens `@,@` and `@.@`."""
    return [
        _replace(rf",(?<={DIGIT},)(?={DIGIT})", " @,@ "),
        _replace(rf"\.(?<={DIGIT}\.)(?={DIGIT})", " @.@ "),
    ]


def moses_normalizer(lower_case: bool, protected_tokens) -> normalizers.Sequence:
    """The legacy `_tokenize` up to the final whitespace split, for one text span between special tokens."""
    return normalizers.Sequence(
        [
            *([normalizers.Lowercase()] if lower_case else []),
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
    r"""Glue alternating quote tokens like the detokenizer's quote counter: opening ones to the next token, closing
    ones to the previous. With `possessive`, an even-numbered `'` after a word ending in "s" is a closing
    possessive (`the Jones' house`) and does not count.

    Each match is one glued gap; `\G` tells where the previous match left the count: at `\A` or on a quote that was
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
    literal = decoders.Replace  # a `str` pattern is matched literally
    return decoders.Sequence(
        [
            decoders.Replace(Regex(r"\A"), " "),  # " t0 t1 ... tn "
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
            _glue(rf"(?<={_GAP}){CURRENCY_OR_OPENING}+\K{_GAP}"),
            _glue(rf"{_GAP}(?={PUNCTUATION}+{_GAP})"),
            _glue(rf"{_GAP}(?='{DETOKENIZER_ALPHA})"),
            _glue(rf"(?<={CJK}){_GAP}(?={CJK})"),
            _quote_pairs("'", possessive=True),
            *(_quote_pairs(quote) for quote in ['"', "``", "`", "''"]),
            literal("\t", ""),
            decoders.Replace(Regex(r"\A +| +\z"), ""),
            # detokenize_numbers (the .strip() after it has nothing left to strip)
            literal(" @,@ ", ","),
            literal(" @.@ ", "."),
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
