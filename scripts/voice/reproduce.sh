#!/bin/sh
# The speech tokenizer, start to end (each step resumable; one core, lowest priority).
# Needs: /work/voice/data from scripts/make_voice_data.py, espeak-ng (apt-get install -y espeak-ng).
set -e
cd "$(dirname "$0")/../.."
T="env PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 python scripts/voice/tokenizer.py"
$T features                                   # int8 feature ONNX, taps 4,5,6, every clip
# comparison grid on the first 2 h of training clips
$T train --name g2h_L6_3p6 --layer 6 --levels 3^6 --train-hours 2 --epochs 10
$T train --name g2h_L6_3p8 --layer 6 --levels 3^8 --train-hours 2 --epochs 10
$T train --name g2h_L6_4p5 --layer 6 --levels 4^5 --train-hours 2 --epochs 10
$T train --name g2h_L6_cont8 --layer 6 --levels 3^8 --continuous --train-hours 2 --epochs 10
$T train --name g2h_L5_3p6 --layer 5 --levels 3^6 --train-hours 2 --epochs 10
$T train --name g2h_L4_3p6 --layer 4 --levels 3^6 --train-hours 2 --epochs 10
