#!/bin/sh
# The speculative drafters of specli-en (DSpark, DFlash, EAGLE-3), distilled on-policy from the voice's own LM:
# labels are the LM's speech tokens for the corpus's training sentences at the deployment sampler ($SAMPLER: greedy,
# specli-en's default, or ras), validated on held-out sentences 100-199 (the round-trip and speed benchmarks use
# 0-99). Resumable (rerun after an interruption); one thread at the lowest priority. Work files under
# $SPECLI_VOICE_WORK/drafters (default /work/voice/drafters).
#
#   scripts/voice/distill_drafters.sh labels|train|all        (needs: apt-get install -y fortunes fortunes-min wamerican)
#   DRAFTERS=dspark LAYERS=1 EPOCHS=8 scripts/voice/distill_drafters.sh train   (~35 min on one core)
#   DRAFTERS=dflash LAYERS=1 EPOCHS=10 ... train; DRAFTERS=eagle3 BLOCK=4 EPOCHS=... train  (the trees' drafters)
set -e
cd "$(dirname "$0")/../.."
W="${SPECLI_VOICE_WORK:-/work/voice}/drafters"
VOICE="${SPECLI_VOICE_DIR:-specli/voices/specli-en}"
SENTENCES="${SENTENCES:-2000}"
EPOCHS="${EPOCHS:-10}"
SAMPLER="${SAMPLER:-greedy}"
LAYERS="${LAYERS:-0}"  # draft layers (0: the recipe's; this session's greedy DSpark: LAYERS=1 EPOCHS=8)
BLOCK="${BLOCK:-0}"  # block size / EAGLE-3 unroll (0: the recipe's: DSpark 8, DFlash 4, EAGLE-3 7)
RUN="env PYTHONPATH=.:scripts/voice OMP_NUM_THREADS=1 nice -n 19 python"
mkdir -p "$W"

labels() {  # ~40 min for 2,000 sentences
    $RUN scripts/voice/texts.py --split train --count "$SENTENCES" --jsonl --out "$W/train.jsonl"
    $RUN scripts/voice/texts.py --split heldout --skip 100 --count 100 --jsonl --out "$W/val.jsonl"
    for split in train val; do
        $RUN -m specli distill data --preset cosyvoice3-ar --model "$VOICE" --sampler "$SAMPLER" -q \
            --out "$W/data-$SAMPLER/$split" "$W/$split.jsonl"
    done
}
train() {  # one drafter after another
    for drafter in ${DRAFTERS:-dspark dflash eagle3}; do
        $RUN -m specli distill train --preset cosyvoice3-ar --model "$VOICE" --drafter "$drafter" --layers "$LAYERS" \
            --block "$BLOCK" --epochs "$EPOCHS" --val "$W/data-$SAMPLER/val" --out "$W/$drafter" "$W/data-$SAMPLER/train"
    done
}

case "${1:-all}" in
    labels) labels ;;
    train) train ;;
    all) labels; train ;;
    *) echo "usage: $0 labels|train|all" >&2; exit 2 ;;
esac
