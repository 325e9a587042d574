#!/usr/bin/env bash
# Resumable data pipeline of the EAGLE-ASR heads: audio -> on-policy labels per source -> (on request) training.
#
#   scripts/distill_pipeline.sh labels            # audio (once), then labels: whisper-base, then whisper-tiny.en
#   scripts/distill_pipeline.sh labels base       # one target only (base | tiny.en)
#   scripts/distill_pipeline.sh train base        # train a head on what is labelled so far (never implied)
#   scripts/distill_pipeline.sh eval base [HEAD]  # acceptance per validation set (language x task); default: shipped head
#   scripts/distill_pipeline.sh status            # clips / windows labelled per directory
#   scripts/distill_pipeline.sh save base         # labels of every labelled directory -> data/labels/base/ (commit them)
#
# Labels that survive the machine: `save` writes each label directory's token ids and window spans
# (`specli distill labels`, a few KB per clip) under data/labels/<target>/, committed; on a new machine `labels`
# first rebuilds each directory from its committed file (`specli distill rebuild`: the same encoder outputs and
# hidden states, no decoding) and then labels only the clips not in it.
#
# Rerun the same command to continue: finished jobs (a .done marker per chunk) are skipped, and inside a
# job `specli distill data` skips the clips already in its manifest. One pipeline at a time (flock).
# Everything lives under $DISTILL (default /work/distill, never in git): audio/, labels/<target>/{train,val}/...,
# heads/<target>/, logs/, code/ (the specli the labels are made with: HEAD when first run plus this task's
# uncommitted distill files; delete it to label with newer code). Jobs run with `nice -n 10` and one thread (OMP_NUM_THREADS=1) unless THREADS is set; labels are decoded in
# float32 unless DTYPE is set (bfloat16: ~2x faster on CPUs with native bf16, the labels of the bf16 default),
# BATCH files at a time (default 4: batched greedy decoding, the same labels, ~1.5x the files per second).
#
# Data mix (scripts/distill_plan.py): every training source chunked round-robin; 70% of training clips decoded
# with timestamps, 30% without; for whisper-base 20% of non-English clips labelled by the translate task.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${DISTILL:-/work/distill}
AUDIO=$ROOT/audio LABELS=$ROOT/labels LOGS=$ROOT/logs
THREADS=${THREADS:-1} CHUNK=${CHUNK:-40} DTYPE=${DTYPE:-float32} BATCH=${BATCH:-4} TIMESTAMPS=${TIMESTAMPS:-70} TRANSLATE=${TRANSLATE:-20}
PY=${PYTHON:-python}
mkdir -p "$LOGS"
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
NICE=(nice -n 10)

snapshot() {  # the code the labels are made with: a frozen copy, so that edits to the tree cannot break a long run
    if [[ -d $ROOT/code/specli ]]; then return; fi
    log "code snapshot -> $ROOT/code (HEAD + uncommitted changes to specli/distill and commands/distill.py)"
    mkdir -p "$ROOT/code.tmp"
    git -C "$REPO" archive HEAD specli | tar -x -C "$ROOT/code.tmp"
    local f
    for f in $(git -C "$REPO" diff --name-only HEAD -- specli/distill specli/commands/distill.py); do
        cp "$REPO/$f" "$ROOT/code.tmp/$f"
    done
    mv "$ROOT/code.tmp" "$ROOT/code"
}

preset() { case $1 in base) echo whisper-base-ar ;; tiny.en) echo whisper-tiny.en-ar ;;
                      *) echo "unknown target $1 (base | tiny.en)" >&2; exit 2 ;; esac; }
log() { echo "$(date -u +%FT%TZ) $*" | tee -a "$LOGS/pipeline.log" >&2; }

audio() {
    if [[ -f $AUDIO/sources.tsv ]]; then return; fi
    log "audio -> $AUDIO"
    "${NICE[@]}" "$PY" "$REPO/scripts/make_distill_audio.py" --out "$AUDIO" --espeak 1200 --extra 1800 --multi 400 \
        >>"$LOGS/audio.log" 2>&1
}

labels() {  # labels TARGET: every job of the plan not yet done
    local target=$1 p plan args out task ts lang cid clips
    p=$(preset "$target")
    args=(--chunk "$CHUNK" --timestamps "$TIMESTAMPS" --translate "$TRANSLATE")
    [[ $target == *.en ]] && args+=(--english-only)
    plan=$LABELS/$target/plan.tsv
    mkdir -p "$LABELS/$target"
    "$PY" "$REPO/scripts/distill_plan.py" "$AUDIO" "${args[@]}" >"$plan.tmp" && mv "$plan.tmp" "$plan"
    log "labels $target: $(wc -l <"$plan") jobs in $plan"
    while IFS=$'\t' read -r out task ts lang cid clips; do
        local dir=$LABELS/$target/$out marker
        marker=$dir/.done-$cid
        [[ -f $marker ]] && continue
        restore "$target" "$out"
        local flags=(--task "$task" --language "$lang" --dtype "$DTYPE" --batch-size "$BATCH" -q)  # float32: the reference decode on any CPU
        [[ $ts == nots ]] && flags+=(--no-timestamps)
        local t0=$SECONDS n
        n=$(wc -w <<<"$clips")
        # shellcheck disable=SC2086  # clips: space-separated paths without spaces
        if "${NICE[@]}" "$PY" -m specli.cli distill data $clips --preset "$p" --out "$dir" "${flags[@]}" \
            >>"$LOGS/labels-$target.log" 2>&1; then
            touch "$marker"
            log "labels $target $out chunk $cid: $n clips in $((SECONDS - t0)) s"
        else  # no marker: the next run retries the clips not in the manifest
            log "labels $target $out chunk $cid FAILED after $((SECONDS - t0)) s (see $LOGS/labels-$target.log)"
        fi
    done <"$plan"
    log "labels $target: all jobs done"
}

saved() { echo "$REPO/data/labels/$1/${2//\//__}.jsonl"; }  # saved TARGET OUT: the committed label file of a directory

restore() {  # restore TARGET OUT: rebuild a label directory from its committed labels (once per machine)
    local dir=$LABELS/$1/$2 file
    file=$(saved "$1" "$2")
    [[ -f $file && ! -f $dir/.restored ]] || return 0
    log "rebuild $1 $2 from $file"
    "${NICE[@]}" "$PY" -m specli.cli distill rebuild "$file" --preset "$(preset "$1")" --out "$dir" --audio-dir "$AUDIO" \
        -q >>"$LOGS/labels-$1.log" 2>&1 && touch "$dir/.restored"
}

save() {  # save TARGET: the labels of every labelled directory of TARGET -> data/labels/TARGET/ (to commit)
    local target=$1 m rel
    for m in "$LABELS/$target"/*/*/manifest.json; do
        [[ -f $m ]] || continue
        rel=${m#"$LABELS/$target/"}; rel=${rel%/manifest.json}
        mkdir -p "$REPO/data/labels/$target"
        "$PY" -m specli.cli distill labels "$(dirname "$m")" -o "$(saved "$target" "$rel")"
    done
}

train() {  # train TARGET [distill-train options, overriding the recipe]: on every labelled training directory
    local target=$1; shift
    local dirs=() vals=() d recipe
    for d in "$LABELS/$target"/train*/*/; do [[ -f $d/manifest.json ]] && dirs+=("$d"); done
    [[ ${#dirs[@]} -gt 0 ]] || { echo "no labelled training data for $target" >&2; exit 1; }
    vals=(--val "$LABELS/$target/val/heldout-in")  # then every language x task set: windows taken in turn
    for d in "$LABELS/$target"/val/*/; do
        [[ -f $d/manifest.json && $d != */heldout-in/ ]] && vals+=(--val "$d")
    done
    case $target in  # ~6-8 epochs of the full label set; cosine decay over --steps; checkpoints resume
        base) recipe=(--steps 3600 --epochs 6) ;;
        tiny.en) recipe=(--steps 2400 --epochs 8) ;;
    esac
    log "train $target on ${#dirs[@]} directories, validated on $((${#vals[@]} / 2))"
    "${NICE[@]}" "$PY" -m specli.cli distill train "${dirs[@]}" --preset "$(preset "$target")" "${vals[@]}" \
        --out "$ROOT/heads/$target" --dtype float32 --lr 6e-4 --batch 4 --feature-noise 0.05 --dropout 0.1 \
        --val-windows 32 --val-every 1 "${recipe[@]}" "$@" 2>&1 | tee -a "$LOGS/train-$target.log"
}

evaluate() {  # evaluate TARGET [HEAD]: acceptance per validation directory (language x task), default the shipped head
    local target=$1 head=${2:-} dirs=() d
    [[ -n $head ]] || head=whisper-$target-eagle
    for d in "$LABELS/$target"/val/*/; do [[ -f $d/manifest.json ]] && dirs+=("$d"); done
    [[ ${#dirs[@]} -gt 0 ]] || { echo "no labelled validation data for $target" >&2; exit 1; }
    "${NICE[@]}" "$PY" -m specli.cli distill eval "${dirs[@]}" --preset "$(preset "$target")" --head "$head" \
        --dtype float32 | tee -a "$LOGS/eval-$target.tsv"
}

status() {  # clips and windows per label directory
    "$PY" - "$LABELS" <<'EOF'
import json, sys
from pathlib import Path
for m in sorted(Path(sys.argv[1]).glob("*/**/manifest.json")):
    done = json.loads(m.read_text())["done"]
    print(f"{m.parent.relative_to(sys.argv[1])}\t{len(done)} clips\t{sum(e['windows'] for e in done.values())} windows")
EOF
}

main() {
    local cmd=${1:-labels}; shift || true
    case $cmd in
        labels)
            exec 9>"$ROOT/.pipeline.lock"
            flock -n 9 || { echo "another pipeline is running ($ROOT/.pipeline.lock)" >&2; exit 1; }
            cd "$REPO"
            audio
            snapshot
            export PYTHONPATH=$ROOT/code${PYTHONPATH:+:$PYTHONPATH}
            for target in "${@:-base tiny.en}"; do for t in $target; do labels "$t"; done; done ;;
        train) cd "$REPO"; train "$@" ;;
        eval) cd "$REPO"; evaluate "$@" ;;
        status) status ;;
        save) cd "$REPO"; save "$@" ;;
        audio) audio ;;
        *) echo "usage: $0 labels [base|tiny.en] | train TARGET [options] | eval TARGET [HEAD] | status | save TARGET | audio" >&2
           exit 2 ;;
    esac
}

main "$@"; exit $?  # one line: bash has read all of it before running, so editing this file cannot derail a run
