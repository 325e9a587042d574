"""Continuous batching over files: several files' long-form loops advance together.

Each file runs the one long-form loop of :func:`specli.asr.windows.transcribe_steps`, a
step machine that asks for window encodes and decode attempts. Up to ``batch_size`` files run at
once: their pending windows are encoded in one encoder call (``[k, n_mels, 3000]``), and their first
decode attempts (greedy at temperature 0, plain or speculative: the default) are rows of one
:class:`~specli.core.batched.BatchDecoder` (speculative presets: EAGLE chains draft for all rows in
one head forward, n-gram pool drafters one per row over the shared pool; other drafters cannot batch
yet and their presets run at batch 1, see :func:`batch_unsupported`; a drafter batches through its own
``batched`` drafter or one ``fork`` per row, :func:`~specli.core.drafters.batched.batch_drafter`).
A row that finishes frees its slot: its file moves on (segments, seek, next window) and its next window joins the
batch, and a file that ends makes room for the next file of the archive. Everything else a file asks for
(temperature-fallback re-decodes, best-of samples, beam search, language detection, word timestamps) runs for that
file alone, inline, exactly as at batch 1. Results come back in completion order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass

import torch

from specli.core.batched import BatchDecoder, RowJob
from specli.asr.fallback import DecodeMethod
from specli.core.drafters.batched import batch_drafter
from specli.asr.windows import (DecodeRequest, EncodeRequest, Encoded, FileResult, FileSteps,
                                          run_file, serve_one)
from specli.models.speech import SpeechModel

#: A file to transcribe: its key (returned with its result) and a factory of its step machine, called
#: when the file joins the batch (so it is opened then); None: nothing to do, the result is None at once.
FileJob = tuple[Hashable, Callable[[], FileSteps] | None]


@dataclass
class _Running:
    """One file in the batch and what it waits for."""

    key: Hashable
    steps: FileSteps
    request: EncodeRequest | DecodeRequest | None = None
    in_decoder: bool = False  # its decode request is a row of the batch decoder


def batch_unsupported(model: SpeechModel, decode: DecodeMethod) -> str | None:
    """Why ``decode`` cannot run batched on ``model`` (the caller then runs files one at a time and
    says so), or None."""
    if model.target.batch_target() is None:
        return f"the {type(model.target).__name__} target has no batched decoding"
    if decode.drafter is not None and batch_drafter(decode.drafter, 1) is None:
        return f"the {type(decode.drafter).__name__} drafter cannot draft for a batch yet"
    return None


def transcribe_batched(
    model: SpeechModel,
    files: Iterable[FileJob],
    batch_size: int,
    decode: DecodeMethod,
    errors: tuple[type[Exception], ...] = (),
) -> Iterator[tuple[Hashable, FileResult | Exception]]:
    """Transcribe ``files`` with up to ``batch_size`` of them in flight; yields ``(key, result)`` as
    each file finishes (a job without a factory at once, with None). A file that raises one of
    ``errors`` gets the exception as its result (it fails alone; the others go on); any other
    exception propagates."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    sched = _Scheduler(model, batch_size, decode, errors)
    source = iter(files)
    more = True
    while True:
        while more and len(sched.running) < batch_size:
            job = next(source, None)
            more = job is not None
            if more:
                sched.start(*job)
        yield from sched.take_finished()
        if not sched.running:
            return
        sched.tick()


def run_jobs(model: SpeechModel, files: Iterable[FileJob], batch_size: int, decode: DecodeMethod,
             errors: tuple[type[Exception], ...] = ()) -> Iterator[tuple[Hashable, FileResult | Exception]]:
    """:func:`transcribe_batched` at ``batch_size`` > 1; at 1 each job alone, in order (:func:`run_file`), with
    the same results and the same handling of ``errors``."""
    if batch_size > 1:
        yield from transcribe_batched(model, files, batch_size, decode, errors)
        return
    for key, make in files:
        try:
            yield key, None if make is None else run_file(model, make())
        except errors as exc:
            yield key, exc


class _Scheduler:
    """The files in flight, the batched encoder calls and the batch decoder."""

    def __init__(self, model: SpeechModel, capacity: int, decode: DecodeMethod,
                 errors: tuple[type[Exception], ...]) -> None:
        self.target = model.target
        self.decode = decode
        self.errors = errors
        why = batch_unsupported(model, decode)
        if why is not None:
            raise ValueError(why)
        drafter = None if decode.drafter is None else batch_drafter(decode.drafter, capacity)
        self.decoder = BatchDecoder(self.target.batch_target(), capacity, drafter=drafter, options=decode.spec)
        # a compiled encoder is compiled for one input shape: its windows are encoded one at a time
        self.encode_batch = 1 if self.target.compiled_encoder is not None else capacity
        self.running: dict[Hashable, _Running] = {}
        self.finished: list[tuple[Hashable, FileResult | Exception]] = []

    def start(self, key: Hashable, make: Callable[[], FileSteps] | None) -> None:
        if make is None:
            self.finished.append((key, None))
            return
        try:
            run = _Running(key, make())
        except self.errors as exc:
            self.finished.append((key, exc))
            return
        self.running[key] = run
        self._advance(run, None)

    def take_finished(self) -> list[tuple[Hashable, FileResult | Exception]]:
        done, self.finished = self.finished, []
        return done

    def tick(self) -> None:
        """Encode the windows waiting for it, else admit waiting decodes and run one decoder step."""
        waiting = [r for r in self.running.values() if isinstance(r.request, EncodeRequest)]
        if waiting:
            self._encode(waiting[: self.encode_batch])
            return
        for run in self.running.values():
            if not run.in_decoder and self.decoder.free:
                self.decoder.add(self._row(run))
                run.in_decoder = True
        for key, result in self.decoder.step():
            run = self.running[key]
            run.in_decoder = False
            self._advance(run, (result, result.stats))

    def _row(self, run: _Running) -> RowJob:
        """The batch row of a file's greedy attempt (the job's sampling is greedy: only those are batched)."""
        return RowJob(run.key, run.request.window.features, run.request.attempt.job)

    def _encode(self, runs: list[_Running]) -> None:
        mel = torch.cat([r.request.mel for r in runs])  # [k, n_mels, 3000]
        t0 = time.perf_counter()
        features = self.target.encode(mel, [r.request.frames for r in runs])  # [k, audio_ctx, d_model]
        share = (time.perf_counter() - t0) / len(runs)
        for i, run in enumerate(runs):
            self._advance(run, Encoded(features[i : i + 1], share))

    def _advance(self, run: _Running, reply: object) -> None:
        """Send ``reply`` to the file's step machine and run it until it asks for something batched:
        requests that are not batched are answered here, inline."""
        try:
            while True:
                request = run.steps.send(reply)
                if isinstance(request, EncodeRequest) or (isinstance(request, DecodeRequest)
                                                          and request.attempt.greedy):
                    run.request = request
                    return
                reply = serve_one(self.target, request)
        except StopIteration as stop:
            self._finish(run.key, stop.value)
        except self.errors as exc:
            self._finish(run.key, exc)

    def _finish(self, key: Hashable, result: FileResult | Exception) -> None:
        self.running.pop(key, None)
        self.finished.append((key, result))
