"""Each ``specli bench`` peer runs in its own worker process, so its library never shares specli's process.

Why: CTranslate2 (faster-whisper) brings its own OpenMP runtime (its wheel bundles a second libgomp beside
torch's). With both thread pools alive in one process, specli's decode phase on a long-form file took
6.38 s instead of 3.98 s, and CTranslate2 slowed down alike, so in-process comparisons understated specli
by up to ~1.5x. At one thread there was no such effect.

One long-lived worker per peer, started once with the ``spawn`` method (a fresh interpreter: no OpenMP,
torch or CUDA state inherited from the parent), builds the peer (torch threads and CTranslate2 threads set
to ``--threads``) and answers one request at a time over a pipe:

* :class:`ClipAudio`: a clip's samples, sent once per clip before its first run (outside any timing) and
  kept by the worker (a 30-s clip crosses the pipe in ~3 ms; sending it again on every pass would gain
  nothing but a smaller worker);
* :class:`TranscribeClip`: one clip, timed in the worker around ``peer.transcribe``, the call the
  in-process runner timed;
* :class:`TranscribeFiles`: a whole archive (``--batch-sizes``), timed around reading the files and
  ``peer.transcribe_many``.

Each request gets a :class:`PeerAnswer`: the texts and the seconds measured in the worker, or why not.
The parent never waits without a limit: a worker that dies or does not answer in time is stopped, and this
and every later request to it answers ``gone`` with the reason (the runner records skips and goes on).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import numpy as np
import torch

from specli.asr.windows import Task
from specli.bench.peers import PEER_FAILURES, BenchError, Peer, PeerCannot, PeerSpec, PeerTarget, make_peer
from specli.io.audio import load_audio

#: Seconds a worker may take to start (import its library, load the weights) before it is given up on.
START_TIMEOUT = 600.0
#: A request's time limit when none is asked: this many seconds ...
CALL_TIMEOUT_BASE = 300.0
#: ... plus this many per second of audio in the request (CPU decoding of a large model is ~5x real time).
CALL_TIMEOUT_PER_AUDIO_SECOND = 20.0
#: Seconds a worker told to stop may take to exit before it is terminated.
STOP_TIMEOUT = 10.0
#: Seconds a terminated worker may take to exit before it is killed.
KILL_TIMEOUT = 2.0
#: Seconds a request's send is always allowed, however short the call's limit: the limit is on the peer's answer;
#: a send only blocks when the worker reads nothing (a message larger than the pipe's buffer), and a smaller
#: limit made a send that merely waited for its helper thread to be scheduled read as a hung worker.
SEND_TIMEOUT_FLOOR = 1.0


@dataclass(frozen=True)
class ClipAudio:
    """Parent -> worker: a clip's samples, kept by the worker for later :class:`TranscribeClip` requests."""

    key: str  # the clip's path, as the runner names it
    audio: np.ndarray  # 16 kHz mono float32


@dataclass(frozen=True)
class TranscribeClip:
    """Parent -> worker: transcribe one clip the worker holds; timed around ``peer.transcribe``."""

    key: str  # a ClipAudio key sent before
    language: str | None  # language code (the baseline's), None = the peer's default
    timestamps: bool  # decode with timestamp tokens


@dataclass(frozen=True)
class TranscribeFiles:
    """Parent -> worker: read and transcribe these files in one call; timed around both."""

    paths: tuple[str, ...]  # audio files, read with specli's loader inside the timed region
    languages: tuple[str | None, ...]  # one per file
    timestamps: bool  # decode with timestamp tokens
    batch_size: int  # windows per forward (batched peers; sequential peers ignore it)


@dataclass(frozen=True)
class PeerReady:
    """Worker -> parent, once: the peer is built and waits for requests."""

    name: str  # system name in the report ("faster-whisper:int8")
    dtype: str  # numeric / CTranslate2 compute type it runs in
    batched: bool  # decodes several windows per forward (measured at every --batch-sizes entry)
    pid: int  # the worker's process id
    torch_threads: int  # torch's intra-op threads in the worker


@dataclass(frozen=True)
class PeerAnswer:
    """Worker -> parent: the outcome of one request (or of a failed start)."""

    status: str  # "ok"; "cannot" (PeerCannot), "failed" (a PEER_FAILURES error), "error" (anything else), "gone"
    texts: tuple[str, ...] = ()  # status ok: one transcript per clip asked for
    seconds: float = 0.0  # status ok: wall seconds of the timed call, measured in the worker
    reason: str = ""  # otherwise: why (an "error" carries the worker's traceback)

    def skip_reason(self, system: str) -> str:
        """The reason a run is recorded as skipped; :class:`BenchError` for an unexpected error (a bug is not
        a skip: it stops the benchmark, as it did when peers ran in the same process)."""
        if self.status == "error":
            raise BenchError(f"{system} raised an unexpected error in its worker process:\n{self.reason.rstrip()}")
        return f"{system} failed: {self.reason}" if self.status == "failed" else self.reason


def call_timeout(audio_seconds: float, asked: float | None = None) -> float:
    """Seconds a request over ``audio_seconds`` of audio may take: ``asked``, else base + per audio second."""
    return asked if asked is not None else CALL_TIMEOUT_BASE + CALL_TIMEOUT_PER_AUDIO_SECOND * audio_seconds


class PeerWorker:
    """The parent's handle on one peer's worker process: start, requests with a time limit, close."""

    def __init__(self, spec: PeerSpec, target: PeerTarget, threads: int | None, task: Task) -> None:
        """Start the worker (returns at once; :meth:`ready` waits for the peer to be built)."""
        ctx = mp.get_context("spawn")  # never fork: no OpenMP pool, torch or CUDA state carried over
        self.name = spec.name  # the spec as written, until the worker reports its name
        self.gone: str | None = None  # why the worker was stopped; None while it runs
        self.info: PeerReady | None = None  # what the worker reported once the peer was built
        self._sent: set[str] = set()  # ClipAudio keys the worker holds
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=worker_main, args=(child, spec, target, threads, task),
                                    name=f"specli-bench-peer-{spec.name}", daemon=True)
        self._process.start()
        child.close()  # the worker's end lives in the worker only: its exit reads as EOF here

    def ready(self, timeout: float = START_TIMEOUT) -> PeerReady:
        """Wait for the built peer; :class:`BenchError` (worker stopped) if it cannot be built in time."""
        got = self._receive(timeout)
        if not isinstance(got, PeerReady):
            self.close()
            raise BenchError(f"peer {self.name} could not start: {got.reason.rstrip()}")
        self.info, self.name = got, got.name
        return got

    def transcribe(self, key: str, audio: np.ndarray, language: str | None, timestamps: bool,
                   timeout: float) -> PeerAnswer:
        """One clip (its samples cross the pipe the first time only, before the timed call)."""
        if key not in self._sent and self.gone is None:
            if (lost := self._send(ClipAudio(key, audio), timeout)) is not None:
                return lost
            self._sent.add(key)
        return self._ask(TranscribeClip(key, language, timestamps), timeout)

    def transcribe_files(self, paths: Sequence[str], languages: Sequence[str | None], timestamps: bool,
                         batch_size: int, timeout: float) -> PeerAnswer:
        """A whole archive in one timed call (the worker reads the files)."""
        return self._ask(TranscribeFiles(tuple(paths), tuple(languages), timestamps, batch_size), timeout)

    def close(self) -> None:
        """Stop the worker: asked first (while it runs), then terminated, then killed. Safe to call twice."""
        if self.gone is None and self._process.is_alive():
            self.gone = "closed"
            if self._put(None, STOP_TIMEOUT) is None:
                self._process.join(STOP_TIMEOUT)
        self._stop_process()
        self._conn.close()
        self.gone = self.gone or "closed"

    def _ask(self, request: TranscribeClip | TranscribeFiles, timeout: float) -> PeerAnswer:
        if self.gone is not None:
            return PeerAnswer("gone", reason=self.gone)
        got = self._send(request, timeout) or self._receive(timeout)
        return got if isinstance(got, PeerAnswer) else self._lost(f"answered {type(got).__name__}")

    def _send(self, message: ClipAudio | TranscribeClip | TranscribeFiles, timeout: float) -> PeerAnswer | None:
        """None once sent (within ``timeout`` s, at least :data:`SEND_TIMEOUT_FLOOR`); else the worker is stopped
        and this is the ``gone`` answer."""
        why = self._put(message, max(timeout, SEND_TIMEOUT_FLOOR))
        return None if why is None else self._lost(why)

    def _put(self, message: ClipAudio | TranscribeClip | TranscribeFiles | None, timeout: float) -> str | None:
        """Send ``message`` from a helper thread (a clip is larger than the pipe's buffer: a worker that reads
        nothing, e.g. stopped, would block this process for ever); None once sent, else why not."""
        errors: list[Exception] = []

        def send() -> None:
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:  # broken pipe: the worker died
                errors.append(exc)

        sender = threading.Thread(target=send, name=f"{self._process.name}-send", daemon=True)
        sender.start()
        sender.join(timeout)
        if sender.is_alive():
            self._stop_process()  # the blocked send ends on the broken pipe
            sender.join(KILL_TIMEOUT)
            return f"it took no request within {timeout:g} s"
        return (self._death() or f"the pipe to it broke ({errors[0]})") if errors else None

    def _stop_process(self) -> None:
        for stop in (self._process.terminate, self._process.kill):
            if self._process.is_alive():
                stop()
                self._process.join(KILL_TIMEOUT)

    def _receive(self, timeout: float) -> PeerReady | PeerAnswer:
        """The worker's next message, or a ``gone`` answer when it died or stayed silent ``timeout`` s."""
        if self.gone is not None:
            return PeerAnswer("gone", reason=self.gone)
        ready = wait([self._conn, self._process.sentinel], timeout)
        if self._conn in ready:
            try:
                return self._conn.recv()
            except (EOFError, OSError):  # it died with nothing more to say
                pass
        if ready:
            return self._lost(self._death() or "its pipe closed")
        return self._lost(f"no answer within {timeout:g} s")

    def _death(self) -> str | None:
        """How the worker ended, once it has (None while it runs)."""
        self._process.join(1.0)
        code = self._process.exitcode
        if code is None:
            return None
        if code < 0:
            return f"the worker process died (signal {signal.Signals(-code).name})"
        return f"the worker process exited (exit code {code})"

    def _lost(self, why: str) -> PeerAnswer:
        """Stop the worker for good; this and every later request answer ``gone``."""
        self.gone = f"{self.name} stopped: {why}"
        self.close()
        return PeerAnswer("gone", reason=self.gone)


def worker_main(conn: Connection, spec: PeerSpec, target: PeerTarget, threads: int | None, task: Task) -> None:
    """The worker process: build the peer, then answer requests until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops this worker
    if threads:
        torch.set_num_threads(threads)
    try:
        peer = make_peer(spec, target, threads, task)
    except BenchError as exc:
        conn.send(PeerAnswer("error", reason=str(exc)))
        return
    except Exception:  # a process boundary: whatever went wrong goes back to the parent as text
        conn.send(PeerAnswer("error", reason=traceback.format_exc()))
        return
    conn.send(PeerReady(peer.name, peer.dtype, peer.batched, os.getpid(), torch.get_num_threads()))
    clips: dict[str, np.ndarray] = {}
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        if isinstance(request, ClipAudio):
            clips[request.key] = request.audio
        else:
            conn.send(answer(peer, request, clips))


def answer(peer: Peer, request: TranscribeClip | TranscribeFiles, clips: dict[str, np.ndarray]) -> PeerAnswer:
    """Run one request on ``peer``, timed around the same work the in-process runner timed."""
    try:
        t0 = time.perf_counter()
        if isinstance(request, TranscribeClip):
            texts = [peer.transcribe(clips[request.key], request.language, request.timestamps)]
        else:
            audios = [load_audio(p) for p in request.paths]  # read inside the timed call, as presets read them
            texts = peer.transcribe_many(audios, request.languages, request.timestamps, request.batch_size)
        seconds = time.perf_counter() - t0
    except PeerCannot as exc:
        return PeerAnswer("cannot", reason=str(exc))
    except PEER_FAILURES as exc:
        return PeerAnswer("failed", reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    except Exception:  # a process boundary: a bug goes back to the parent with its traceback
        return PeerAnswer("error", reason=traceback.format_exc())
    return PeerAnswer("ok", tuple(texts), seconds)
