"""Batched acoustic stages: several utterances through the flow together (``TokenFlow.inference_rows``, the DiT's
row segments) and ``specli synthesize --batch-size N --format wav|flac`` give each utterance the same bits as one
at a time, on specli-en's real weights and on tiny random CosyVoice3 / CosyVoice2 checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from flow_fixtures import write_audio_checkpoint

from specli.cli import main
from specli.tts.acoustic.pipeline import RenderedAudio, RenderError, Vocalizer, VoicePrompt

VOICE = Path(__file__).resolve().parent.parent / "specli" / "voices" / "specli-en"
pytestmark = pytest.mark.usefixtures("memo_loaders")  # CLI calls reuse the session's shipped voice
LENGTHS = (1, 2, 3, 9, 40, 23)  # speech tokens of the rows; 1-3 tokens make the smallest GEMMs


@pytest.fixture(scope="module")
def voice(vocalizer) -> Vocalizer:
    return vocalizer()


def _rows(vocalizer: Vocalizer, lengths=LENGTHS, seed: int = 0) -> list[tuple[list[int], VoicePrompt]]:
    """Random token rows; the second has a voice prompt of its own (tokens, mel, x-vector)."""
    gen = torch.Generator().manual_seed(seed)
    vocab, ratio = vocalizer.spec.speech_token_size, vocalizer.spec.token_mel_ratio
    rows = [(torch.randint(0, vocab, (n,), generator=gen).tolist(), VoicePrompt.none(80)) for n in lengths]
    prompt = VoicePrompt(torch.randint(0, vocab, (1, 7), generator=gen), torch.randn(1, 7 * ratio, 80, generator=gen),
                         torch.randn(1, 192, generator=gen))
    rows[1] = (rows[1][0], prompt)
    return rows


def _flow_rows(vocalizer: Vocalizer, rows) -> list[tuple[torch.Tensor, ...]]:
    return [(torch.tensor([tokens]), p.speech_tokens, p.prompt_mel, p.embedding) for tokens, p in rows]


@pytest.mark.parametrize("threads", [1, 2])
def test_flow_rows_are_the_bits_of_one_at_a_time(voice: Vocalizer, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = _flow_rows(voice, _rows(voice))
        alone = [voice.flow.inference(*row) for row in rows]
        for pick in ([0, 1, 2, 3, 4, 5], [4, 0], [5, 1, 3]):
            together = voice.flow.inference_rows([rows[i] for i in pick])
            for i, mel in zip(pick, together):
                assert mel.shape == alone[i].shape and torch.equal(mel, alone[i]), (pick, i)
    finally:
        torch.set_num_threads(before)


def test_batched_rows_differ_from_a_plain_padded_batch(voice: Vocalizer) -> None:
    """The segments matter: the same rows as one masked batch without them are not the same bits (else the
    test above would prove nothing about them)."""
    from specli.tts.acoustic.cfm import solve_cfm

    rows = _flow_rows(voice, _rows(voice, (9, 40)))
    conds = [voice.flow._conditions(*row, streaming=False, finalize=True) for row in rows]
    width = max(c[0].shape[2] for c in conds)
    pad = [torch.nn.functional.pad(c[0], (0, width - c[0].shape[2])) for c in conds]
    cpad = [torch.nn.functional.pad(c[2], (0, width - c[2].shape[2])) for c in conds]
    mask = torch.stack([(torch.arange(width) < c[0].shape[2]).float() for c in conds])[:, None]
    alone = voice.flow.inference(*rows[0])
    mels = []
    for k in range(2):  # one utterance at a time through the masked (non-segment) path, padded to the width
        mels.append(solve_cfm(voice.flow.decoder.estimator, pad[k], mask[k : k + 1], conds[k][1], cpad[k],
                              voice.flow.cfg.cfm))
    assert not torch.equal(mels[0][:, :, : alone.shape[2]], alone)
    assert torch.allclose(mels[0][:, :, : alone.shape[2]], alone, atol=1e-3)  # ... only float noise apart


@pytest.mark.parametrize("together", [True, False])
def test_render_rows_same_samples_and_per_row_errors(voice: Vocalizer, together: bool) -> None:
    rows = _rows(voice, (5, 12, 8))
    rows.insert(1, ([], VoicePrompt.none(80)))  # no tokens: that row fails alone

    def gen(i: int) -> torch.Generator:
        return torch.Generator().manual_seed(100 + i)

    got = dict(voice.render_rows([(t, p, gen(i)) for i, (t, p) in enumerate(rows)], flow_together=together))
    assert sorted(got) == [0, 1, 2, 3] and isinstance(got[1], RenderError)
    for i in (0, 2, 3):
        alone = voice.render(rows[i][0], rows[i][1], gen(i))
        assert isinstance(got[i], RenderedAudio)
        assert got[i].audio.tobytes() == alone.audio.tobytes() and got[i].mel_frames == alone.mel_frames


def _synth(model: Path, out: Path, batch: int, fmt: str, extra: list[str]):
    args = ["synthesize", "--model", str(model), "--format", fmt, "--batch-size", str(batch), "--seed", "3",
            "-o", str(out), *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


LINES = "Hello there.\nThe quick brown fox jumps over the lazy dog.\n\nIt is late.\nYes.\nWhere are you going?\n"


def test_shipped_voice_batch_three_writes_the_bytes_of_batch_one(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text(LINES)
    runs = {}
    for batch in (1, 3):
        res = _synth(VOICE, tmp_path / f"b{batch}", batch, "wav", ["--sampler", "ras", "--audio-dtype", "float32",
                                                                   str(lines)])
        assert res.exit_code == 1 and f"{lines}:3: empty line" in res.stderr  # a bad line; the batch goes on
        runs[batch] = _files(tmp_path / f"b{batch}")
    assert len(runs[1]) == 5 and runs[3] == runs[1]
    again = _synth(VOICE, tmp_path / "b3", 3, "wav", ["--sampler", "ras", "--audio-dtype", "float32", str(lines)])
    assert "5 skipped" in again.stderr and _files(tmp_path / "b3") == runs[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["cosyvoice3", "cosyvoice2"])
def test_tiny_checkpoints_batch_two_and_three_write_the_bytes_of_one(tmp_path: Path, kind: str, dtype: str) -> None:
    model = write_audio_checkpoint(tmp_path / "ckpt", kind=kind)
    lines = tmp_path / "lines.txt"
    lines.write_text("hello there\nok\nthree words here\na b c d\n")
    runs = {}
    for batch in (1, 2, 3):
        res = _synth(model, tmp_path / f"b{batch}", batch, "flac",
                     ["--sampler", "ras", "--audio-dtype", dtype, str(lines)])
        assert res.exit_code == 0, res.stderr
        runs[batch] = _files(tmp_path / f"b{batch}")
    assert len(runs[1]) == 4 and runs[2] == runs[1] and runs[3] == runs[1]
